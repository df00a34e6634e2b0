"""The history on a PostgreSQL server: one history a fleet of runners shares.

The same table, the same migrations (``database.migration``, types per engine), the same checks
on every row written and read as the SQLite file. Writers need no lock of ours: every append is
one transaction of ``INSERT ... ON CONFLICT DO NOTHING`` on the (hardware key, run id) key, so
16 sessions appending at once land every run exactly once, and readers (MVCC) never wait on
them. Migrations serialise on a transaction-scoped advisory lock. psycopg 3, one connection per
history opened (a session appends once): no pool. Every wait has a deadline: the connection's
``connect_timeout``, and ``lock_timeout``/``statement_timeout`` on the session.

The DSN's password never leaves this module: errors name the history as ``str(dsn)`` (masked)
and the driver's own messages are scrubbed (``ServerDsn.scrub``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from scaleguard.evidence.runs import CaseEvidence
from scaleguard.history.database import (
    _COLUMNS,
    BLOCK_DIGEST,
    BLOCK_WRITE_S,
    INSERT,
    LOCK_TIMEOUT_S,
    MAX_BLOCK_ENTRY,
    MAX_ROWS,
    MAX_VIEW_RUNS,
    RECENT_NIGHTS,
    REMEMBER_BLOCKS,
    SCHEMA,
    SERIES_COLUMNS,
    VIEWED,
    Batch,
    CaseRead,
    Fleet,
    HistoryError,
    HistoryRow,
    _checked_row,
    appendable,
    as_viewed,
    check_stored,
    choose,
    migration,
    read_cases,
)
from scaleguard.history.target import ServerDsn

CONNECT_TIMEOUT_S = 10
_MIGRATION_LOCK = 0x5CA1E6A4D  # pg_advisory_xact_lock key: one migrating session at a time
_FIX = "check the server, or give --history a file"
# json, not jsonb: each record is parsed once per read, and building jsonb's tree cost more
_VIEWED = VIEWED.format(
    device="record::json #>> '{case,config,device}'",
    projected="CASE WHEN world_size > 1 THEN (record::json #> '{projection,efficiency}') END",
)
_VIEWED_RECENT = VIEWED.format(  # as SQLite's: the device of the latest runs alone
    device="CASE WHEN recorded_at >= %s THEN record::json #>> '{case,config,device}' END",
    projected="CASE WHEN world_size > 1 THEN (record::json #> '{projection,efficiency}') END",
)


# every distinct (hardware key, case) by a loose walk of the (key, case, time) index: one probe a
# pair. PostgreSQL (before 18) has no skip scan, and SELECT DISTINCT read all 500,000 index
# entries of 10,000 nights x 50 cases (0.2 s of every view; this: under 1 ms)
_PAIRS = """
WITH RECURSIVE pairs AS (
    (SELECT hardware_key, case_id FROM runs ORDER BY hardware_key, case_id LIMIT 1)
    UNION ALL
    SELECT next.hardware_key, next.case_id FROM pairs, LATERAL (
        SELECT hardware_key, case_id FROM runs
        WHERE (hardware_key, case_id) > (pairs.hardware_key, pairs.case_id)
        ORDER BY hardware_key, case_id LIMIT 1
    ) AS next
)
SELECT hardware_key, case_id FROM pairs"""


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:
        raise HistoryError(
            "a PostgreSQL history needs psycopg 3: pip install 'scaleguard[server]' "
            "(or pip install 'psycopg[binary]')"
        ) from None
    return psycopg


class ServerUnreachable(HistoryError):
    """The server could not be reached, or went away mid-write: nothing was written there (a
    session keeps its runs in the spool, ``history.spool``)."""


class ServerHistory:
    """The history at ``dsn``. ``readonly``: view and export only (no migration, no write; a
    read-only role is enough)."""

    engine = "postgresql"

    def __init__(self, dsn: ServerDsn, timeout_s: float = LOCK_TIMEOUT_S, readonly: bool = False) -> None:
        self.dsn = dsn
        self.where = str(dsn)
        self.readonly = readonly
        self.notes: list[str] = []
        self._schema = 0  # the schema version, as ``_check_schema`` found it
        psycopg = _driver()
        self._errors = psycopg.Error
        self._operational = psycopg.OperationalError
        try:
            self._db = psycopg.connect(dsn.dsn, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True)
        except psycopg.Error as exc:
            raise ServerUnreachable(f"history {self.where}: cannot connect ({self._said(exc)})") from None
        try:
            ms = int(timeout_s * 1000)
            self._db.execute(f"SET lock_timeout = {ms}")  # an int we made: no user text in SQL
            self._db.execute(f"SET statement_timeout = {max(ms, 120_000)}")
            if not readonly:
                self._migrate()
            self._check_schema()
        except HistoryError:
            self.close()
            raise
        except psycopg.Error as exc:
            self.close()
            raise self._failure("cannot be used", exc) from None

    def _said(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        return self.dsn.scrub(text)

    def _failure(self, what: str, exc: BaseException) -> HistoryError:
        psycopg = _driver()
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            return HistoryError(
                f"history {self.where}: {what}: the role may not write here ({self._said(exc)}); "
                "nothing was written (a read-only role views and exports; sessions need a writer)"
            )
        if isinstance(exc, self._operational):
            return ServerUnreachable(
                f"history {self.where}: {what}: the server went away ({self._said(exc)})"
            )
        return HistoryError(f"history {self.where}: {what} ({self._said(exc)}); {_FIX}")

    def _version(self) -> int:
        exists = self._db.execute("SELECT to_regclass('scaleguard_schema') IS NOT NULL").fetchone()[0]
        if not exists:
            return 0
        row = self._db.execute("SELECT max(version) FROM scaleguard_schema").fetchone()
        return int(row[0] or 0)

    def _migrate(self) -> None:
        if self._version() == SCHEMA:
            return
        try:
            with self._db.transaction():
                self._db.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                self._db.execute("CREATE TABLE IF NOT EXISTS scaleguard_schema (version INTEGER NOT NULL)")
                version = self._version()  # again, under the lock: another session may have migrated
                if version > SCHEMA:
                    return  # refused by name in _check_schema
                for step in range(version + 1, SCHEMA + 1):
                    for statement in migration(step, "postgresql"):
                        self._db.execute(statement)
                    self._db.execute("INSERT INTO scaleguard_schema (version) VALUES (%s)", (step,))
        except self._errors as exc:
            raise self._failure("its schema could not be made", exc) from None

    def _check_schema(self) -> None:
        version = self._version()
        # kept for the blocks' calls, once a case in a view: a schema only ever rises under
        # us (another session migrating), and an old figure costs a cache's use, never a value
        self._schema = version
        if version > SCHEMA:
            raise HistoryError(
                f"history {self.where}: schema {version}, newer than this scaleguard's {SCHEMA}: "
                "upgrade scaleguard"
            )
        if version == 0:
            raise HistoryError(
                f"history {self.where}: holds no scaleguard history yet (a session with a writing role "
                "makes it)"
            )
        columns = tuple(
            r[0]
            for r in self._db.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' "
                "AND table_schema = current_schema() ORDER BY ordinal_position"
            ).fetchall()
        )
        if columns != _COLUMNS:
            raise HistoryError(
                f"history {self.where}: its runs table "
                + (f"has columns {', '.join(columns)[:200]}" if columns else "is missing")
                + f": not a scaleguard history; {_FIX}"
            )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ServerHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(
        self,
        cases: Iterable[CaseEvidence],
        hardware_key: str,
        source: str,
        verdicts: dict[str, str] | None = None,
        suite_commit: str | None = None,
        fleet: Fleet | None = None,
    ) -> int:
        batch = Batch(list(cases), hardware_key, source, verdicts or {}, suite_commit)
        return self.append_rows(appendable([batch], self.where, fleet or Fleet.here()))

    def append_rows(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """Rows made (and checked) by ``appendable``, in one transaction; how many were new. A
        server gone mid-write rolls the transaction back (ServerUnreachable)."""
        if self.readonly:
            raise HistoryError(f"history {self.where}: opened read-only; nothing was written")
        if not rows:
            return 0
        try:
            with self._db.transaction(), self._db.cursor() as cur:
                cur.executemany(INSERT + " RETURNING run_id", rows, returning=True)
                added = 0
                while True:  # one result per row: a run id where it was new, nothing where kept
                    added += len(cur.fetchall())
                    if not cur.nextset():
                        break
                return added
        except self._errors as exc:
            raise self._failure("the write failed; nothing was written", exc) from None

    def raw_rows(self) -> list[tuple[Any, ...]]:
        try:
            raw = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs ORDER BY recorded_at").fetchall()
        except self._errors as exc:
            raise self._failure("cannot be read", exc) from None
        for row in raw:
            _checked_row(self.where, as_viewed(row), _FIX)
            check_stored(self.where, row, _FIX)
        return raw

    def remembered_blocks(self, digests: Sequence[str]) -> dict[str, str]:
        """As ``History.remembered_blocks``: one query, bounded by the digests asked for."""
        wanted = [d for d in digests if isinstance(d, str) and BLOCK_DIGEST.fullmatch(d)]
        if not wanted:
            return {}
        if self._schema < 5:
            return {}
        try:
            # its own sync point inside a view's pipeline: a refusal here (a role that may not
            # read the blocks) ends here, and the view's next series is not aborted with it
            with self._db.pipeline():
                rows = self._db.execute(
                    "SELECT digest, found FROM changepoint_blocks WHERE digest = ANY(%s) "
                    f"AND length(found) <= {MAX_BLOCK_ENTRY}",
                    [wanted],
                ).fetchall()
        except self._errors:
            return {}
        return dict(rows)

    def remember_blocks(self, entries: Sequence[tuple[str, str]]) -> bool:
        """As ``History.remember_blocks``: False for a role that may not write (a reader's view
        keeps its blocks in the runner's own memo), a lock held past ``BLOCK_WRITE_S``, a
        history older than schema 5 (never migrated by a view)."""
        if not entries:
            return True
        if self._schema < 5:
            return False
        try:
            with self._db.transaction(), self._db.cursor() as cur:
                cur.execute(f"SET LOCAL lock_timeout = {int(BLOCK_WRITE_S * 1000)}")  # our int
                cur.executemany(REMEMBER_BLOCKS, list(entries))
            return True
        except self._errors:
            return False

    def _chosen(
        self,
        hardware_key: str | None,
        case_glob: str,
        runner: str | None,
        project: str | None,
        limit: int | None,
    ) -> tuple[list[tuple[str, str]], str, list[Any]]:
        """As ``History._chosen``: the pairs, and the filter of the runner and project kept (a
        clause to AND onto a pair's) with its arguments."""
        if runner is None and project is None:  # the pairs alone: a walk of the index, not a scan
            kinds = [(key, case, None, None) for key, case in self._db.execute(_PAIRS).fetchall()]
        else:
            kinds = self._db.execute(
                "SELECT DISTINCT hardware_key, case_id, runner, project FROM runs"
            ).fetchall()
        pairs, runners, projects = choose(kinds, hardware_key, case_glob, runner, project)
        extra, args = "", []
        for column, kept in (("runner", runners), ("project", projects)):
            if kept is not None:  # a column name of ours, never the user's
                extra += f" AND {column} = ANY(%s)"
                args.append(sorted(kept))
        if pairs and limit is not None:
            count = self._db.execute(
                "SELECT count(*) FROM runs WHERE (hardware_key, case_id) IN "
                f"(SELECT * FROM unnest(%s::text[], %s::text[])){extra}",
                [[k for k, _ in pairs], [c for _, c in pairs], *args],
            ).fetchone()[0]
            if count > limit:
                raise HistoryError(
                    f"history {self.where}: {count} runs match, more than the {limit} one view reads; "
                    "narrow it with --case GLOB and --hardware-key KEY"
                )
        return pairs, extra, args

    def rows(
        self,
        hardware_key: str | None = None,
        case_glob: str = "*",
        runner: str | None = None,
        project: str | None = None,
    ) -> list[HistoryRow]:
        """As ``History.rows``: the patterns chosen over the distinct kinds (``choose``), then
        only the chosen runs are read, by value."""
        try:
            pairs, extra, args = self._chosen(hardware_key, case_glob, runner, project, MAX_ROWS)
            if not pairs:
                return []
            raw = self._db.execute(
                f"SELECT {_VIEWED} FROM runs WHERE (hardware_key, case_id) IN "
                f"(SELECT * FROM unnest(%s::text[], %s::text[])){extra} "
                "ORDER BY hardware_key, case_id, recorded_at, run_id",
                [[k for k, _ in pairs], [c for _, c in pairs], *args],
            ).fetchall()
        except HistoryError:
            raise
        except self._errors as exc:
            raise self._failure("cannot be read", exc) from None
        return [_checked_row(self.where, r, _FIX) for r in raw]

    def view(
        self,
        hardware_key: str | None = None,
        case_glob: str = "*",
        runner: str | None = None,
        project: str | None = None,
        recent: int = RECENT_NIGHTS,
        each: Callable[[CaseRead], None] | None = None,
    ) -> list[CaseRead]:
        """As ``History.view``, by the same ``read_cases``."""
        try:
            pairs, extra, args = self._chosen(hardware_key, case_glob, runner, project, None)
            db, where = self._db, f"WHERE hardware_key = %s AND case_id = %s{extra}"
            series = f"SELECT {', '.join(SERIES_COLUMNS)} FROM runs {where} ORDER BY recorded_at, run_id"
            since = (
                f"SELECT {_VIEWED_RECENT} FROM runs {where} AND recorded_at >= %s "
                + "ORDER BY recorded_at, run_id"
            )
            at = f"SELECT {_VIEWED} FROM runs {where} ORDER BY recorded_at, run_id LIMIT 1 OFFSET %s"

            # the next case's series asked for before this one's is taken (a pipeline): the
            # server reads it while this process checks the last (0.5 s of the server's time a
            # view of 10,000 nights x 50 cases otherwise spent waiting)
            asked: dict[int, Any] = {}
            place = {pair: i for i, pair in enumerate(pairs)}

            def ask(i: int) -> None:
                if i < len(pairs) and i not in asked:
                    # binary: numbers arrive as numbers, not text to parse (0.1 s of 500,000 runs)
                    asked[i] = db.cursor(binary=True)
                    asked[i].execute(series, [*pairs[i], *args])

            def series_of(pair: tuple[str, str]) -> list[tuple[Any, ...]]:
                i = place[pair]
                ask(i)
                ask(i + 1)
                with asked.pop(i) as cur:
                    return cur.fetchall()

            try:
                with db.pipeline():
                    return read_cases(
                        self.where, pairs,
                        series_of,
                        lambda pair, time, last: db.execute(since, [last, *pair, *args, time]).fetchall(),
                        lambda pair, index: db.execute(at, [*pair, *args, index]).fetchone(),
                        recent, _FIX, MAX_VIEW_RUNS, each,
                    )  # fmt: skip
            finally:
                for cur in asked.values():
                    cur.close()
        except HistoryError:
            raise
        except self._errors as exc:
            raise self._failure("cannot be read", exc) from None
