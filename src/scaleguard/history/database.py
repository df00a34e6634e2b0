"""Every night remembered: an SQLite history of every run any session measured, and change
points over each case's nightly series.

The JSON files stay the exchange format (saved runs, baselines); the database is an index of
them on the runner's disk, rebuildable with ``scaleguard history import FILES``. One row per
run, keyed by its unique run id (so appending or importing twice changes nothing), with the
case, the hardware key, torch version and git sha, CUDA/cuDNN/NCCL, the suite's commit, the
session and time, the run's median step, efficiency and peak memory, its quarantine reason and
the verdict of its case in that session. Writers serialise on SQLite's own write lock
(``BEGIN IMMEDIATE`` under a busy deadline) in WAL mode; each append is one transaction, so an
interrupted session leaves the file as it was before that append, or with all of it.

Change points: ``scaleguard.history.changepoints`` (pure statistics) over each case's nights, with the
case's own step threshold as the smallest change worth one (``min_magnitude_for``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import json
import math
import os
import re
import socket
import sqlite3
import stat
import statistics
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, overload

import numpy as np

from scaleguard.evidence.files import ID_PATTERN as CASE_ID
from scaleguard.evidence.files import MAX_STEP_S
from scaleguard.evidence.runs import CaseEvidence
from scaleguard.evidence.verdict import ThresholdSettings
from scaleguard.history.changepoints import Memo, detect

SCHEMA = 5  # SQLite: PRAGMA user_version; PostgreSQL: table scaleguard_schema. Migrations below
LOCK_TIMEOUT_S = 60.0

# every column but the run id, as schema 1 made them. Frozen: a new column is a new migration
# (ALTER TABLE ... ADD COLUMN), never an edit here, or the old steps would make another table.
# Types per engine: SQLite's INTEGER and REAL are 64-bit already; PostgreSQL's are 32-bit, where
# a peak memory past 2 GiB would not fit and a median step would lose digits
_RUN_COLUMNS = """
        case_id TEXT NOT NULL,
        group_id TEXT NOT NULL,
        world_size {integer} NOT NULL,
        hardware_key TEXT NOT NULL,
        torch TEXT, torch_git TEXT, cuda TEXT, cudnn TEXT, nccl TEXT,
        suite_commit TEXT,
        session TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        source TEXT NOT NULL,
        median_s {real} NOT NULL,
        samples_per_s {real},
        efficiency {real},
        peak_mem_bytes {integer},
        quarantine TEXT,
        verdict TEXT,
        record TEXT NOT NULL"""

TYPES = {"sqlite": {"integer": "INTEGER", "real": "REAL"},
         "postgresql": {"integer": "BIGINT", "real": "DOUBLE PRECISION"}}  # fmt: skip

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, {columns});
    CREATE INDEX IF NOT EXISTS runs_case ON runs (hardware_key, case_id, recorded_at);
    """,
    # a run is one run of one hardware key: two machines' files may share a run id ("0001_nightly-3"
    # of two hosts), and schema 1 took the second key's runs for duplicates. SQLite changes a
    # primary key only by rebuilding the table
    2: """
    CREATE TABLE runs_v2 (run_id TEXT NOT NULL, {columns}, PRIMARY KEY (hardware_key, run_id));
    INSERT INTO runs_v2 SELECT * FROM runs;
    DROP TABLE runs;
    ALTER TABLE runs_v2 RENAME TO runs;
    CREATE INDEX IF NOT EXISTS runs_case ON runs (hardware_key, case_id, recorded_at);
    """,
    # a fleet: which runner measured the run and for which project (older runs: unknown)
    3: """
    ALTER TABLE runs ADD COLUMN runner TEXT;
    ALTER TABLE runs ADD COLUMN project TEXT;
    """,
    # a view reads every night of a case from this index alone (``SERIES_COLUMNS``): the table's
    # rows carry each run's record (~2 KB), and 500,000 of them took 1.1 s to visit, 0.4 s here
    4: """
    CREATE INDEX IF NOT EXISTS runs_series ON runs
        (hardware_key, case_id, recorded_at, run_id, session, median_s, quarantine, torch, torch_git,
         runner, project);
    """,
    # the change points' whole blocks (``history.memo``), kept where every viewer of the history
    # finds them: a first view of 10,000 nights x 50 cases searched 1,000 blocks (8.4 s)
    5: """
    CREATE TABLE IF NOT EXISTS changepoint_blocks (digest TEXT PRIMARY KEY, found TEXT NOT NULL);
    """,
}
# a memo entry as ``changepoints`` keys it (sha256) and as ``history.memo`` writes it (JSON)
BLOCK_DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_BLOCK_ENTRY = 4096  # characters: a block of 576 nights has at most ~190 candidates
BLOCK_WRITE_S = 0.5  # a view's gift to later viewers is never worth waiting for
REMEMBER_BLOCKS = (
    "INSERT INTO changepoint_blocks (digest, found) VALUES (%s, %s) "
    "ON CONFLICT (digest) DO UPDATE SET found = excluded.found"
)  # one text for both engines (SQLite 3.24+); an entry no writer of ours made is overwritten


def migration(step: int, engine: str) -> list[str]:
    """Schema step ``step`` as statements of ``engine`` ("sqlite" or "postgresql"): one portable
    text, the column types filled in per engine."""
    text = _MIGRATIONS[step].format(columns=_RUN_COLUMNS.format(**TYPES[engine]))
    return [statement.strip() for statement in text.split(";") if statement.strip()]


class HistoryError(RuntimeError):
    """The history file cannot be used; the message names it and the fix."""


@dataclass(frozen=True)
class HistoryRow:
    run_id: str
    case_id: str
    hardware_key: str
    torch: str | None
    torch_git: str | None
    session: str
    recorded_at: str
    source: str
    median_s: float
    efficiency: float | None
    peak_mem_bytes: int | None
    quarantine: str | None
    verdict: str | None
    samples_per_s: float | None = None
    device: str | None = None  # "cpu" or "cuda": the case's, as recorded with the run
    runner: str | None = None  # the host that measured it (schema 3; older runs: None)
    project: str | None = None  # whose suite measured it (schema 3; older runs: None)
    projected: float | None = None  # the efficiency projected from ws1 that session (its record)


@dataclass(frozen=True)
class Fleet:
    """Who appends: the runner (this host's name) and the project (an option; by default the
    repository's name). Nights of one hardware key pool across runners; views narrow by either."""

    runner: str | None  # None: not known (runs imported from files)
    project: str | None = None

    @classmethod
    def here(cls, project: str | None = None) -> Fleet:
        return cls(socket.gethostname() or "unknown", project)


_COLUMNS = (
    "run_id", "case_id", "group_id", "world_size", "hardware_key", "torch", "torch_git", "cuda", "cudnn",
    "nccl", "suite_commit", "session", "recorded_at", "source", "median_s", "samples_per_s",
    "efficiency", "peak_mem_bytes", "quarantine", "verdict", "record", "runner", "project",
)  # fmt: skip
# a history is the runner's disk index; past this the terminal and the page would need gigabytes
# (10^6 rows took 1.58 GB as row objects): narrow with --case / --hardware-key instead
MAX_ROWS = 200_000
# what a view reads of every run: the covering index ``runs_series`` holds these, so years of
# nights are read without visiting the rows (each carries its ~2 KB record)
SERIES_COLUMNS = (  # no run id: only a run a check refuses is named, read again by its place
    "session",
    "recorded_at",
    "median_s",
    "quarantine",
    "torch",
    "torch_git",
    "runner",
)
# the query a view reads its recent runs whole with (``HistoryRow``'s fields, in its order)
VIEWED = (
    "run_id, case_id, hardware_key, torch, torch_git, session, recorded_at, source, median_s, "
    "efficiency, peak_mem_bytes, quarantine, verdict, samples_per_s, {device}, runner, project, {projected}"
)
_SQLITE_VIEWED = VIEWED.format(
    device="json_extract(record, '$.case.config.device')",
    # a projection is made for a multi-rank case only: a ws1 run's record is not parsed for it
    projected="CASE WHEN world_size > 1 THEN json_extract(record, '$.projection.efficiency') END",
)
# a view reads the device (``device_of``) of a case's latest runs alone: parsing each run's
# record for it cost PostgreSQL 19 ms a case of a year of nights, 0.95 s a view of 50 cases.
# Its first parameter is the latest run's time
_SQLITE_VIEWED_RECENT = VIEWED.format(
    device="CASE WHEN recorded_at >= ? THEN json_extract(record, '$.case.config.device') END",
    projected="CASE WHEN world_size > 1 THEN json_extract(record, '$.projection.efficiency') END",
)
RECENT_NIGHTS = 365  # nights a view reads run by run (the page's markers and efficiency): a year
MAX_VIEW_RUNS = 2_000_000  # 10,000 nights x 50 cases x 4 runs; memory measured in docs/measured.md
_ROW_FIX = "rebuild the file with `scaleguard history import`"  # both row rules, by default
_REBUILD = "move it aside (it is rebuilt with `scaleguard history import` from the saved runs)"


def _check_path(path: Path) -> None:
    """A path a history may be opened at: a regular file or nothing, never followed through a
    link (an import would write wherever the link points)."""
    if path.is_symlink():
        raise HistoryError(f"history {path}: is a symbolic link; give the file's own path")
    if os.path.lexists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        # a FIFO would block SQLite's first read forever, a device would feed it garbage
        raise HistoryError(f"history {path}: not a regular file (a FIFO, device or directory)")


class History:
    """The history database at ``path``: created on first write; ``readonly`` opens an existing
    file for viewing without any write (a read-only file or directory is fine then)."""

    def __init__(self, path: Path, timeout_s: float = LOCK_TIMEOUT_S, readonly: bool = False) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.readonly = readonly
        self.notes: list[str] = []  # what a reader of this history should know (said once)
        _check_path(path)
        try:
            if readonly:
                self._db = self._open_readonly(path)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
                self._db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
                fs = network_filesystem(path.parent)
                if fs is None:
                    self._wal()
                else:
                    # WAL needs shared memory between the writers, which a network file system
                    # does not give: two login nodes' sessions would corrupt the file
                    self._db.execute("PRAGMA journal_mode=DELETE")
                    self.notes.append(
                        f"{path} is on a network file system ({fs}): written with a rollback journal, "
                        "not WAL; several hosts writing at once may still meet its locking "
                        "(a PostgreSQL history is made for a fleet: --perf-history postgresql://...)"
                    )
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._migrate()
            self._check_schema()
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc) or not os.access(path, os.W_OK):
                raise HistoryError(
                    f"history {path}: is read-only ({exc}); nothing was written (view it with "
                    "`scaleguard history`, or give a writable --history)"
                ) from None
            raise HistoryError(f"history {path}: cannot be used ({exc}); {_REBUILD}") from None
        except sqlite3.DatabaseError as exc:
            raise HistoryError(
                f"history {path}: not a usable scaleguard history ({exc}); {_REBUILD}"
            ) from None
        except OSError as exc:
            raise HistoryError(f"history {path}: cannot be opened ({exc.strerror or exc})") from None

    def _open_readonly(self, path: Path) -> sqlite3.Connection:
        if not path.exists():
            raise HistoryError(
                f"history {path} does not exist yet: a session appends to it, or `history import`"
            )
        uri = "file:" + urllib.parse.quote(str(path.absolute()))
        db = sqlite3.connect(uri + "?mode=ro", uri=True, isolation_level=None)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:
            # a WAL file in a directory we cannot write: no shared-memory file can be made for
            # it; read it as an immutable snapshot instead (nobody writes there without access)
            db.close()
            self.notes.append(
                f"{path}: read as a snapshot (its directory is not writable, so SQLite cannot share "
                "its write-ahead log): runs a writer appends meanwhile are not shown"
            )
            return sqlite3.connect(uri + "?immutable=1", uri=True, isolation_level=None)

    def _wal(self) -> None:
        """WAL mode, waited for: two sessions creating one history at once both ask for it, and
        SQLite answers the loser "locked" at once rather than through the busy handler."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _check_schema(self) -> None:
        """A file with our version number but another layout is not ours: refuse it by name
        before a query or an insert fails inside SQLite."""
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version < 0 or version > SCHEMA:
            raise HistoryError(
                f"history {self.path}: schema {version}"
                + (f", newer than this scaleguard's {SCHEMA}: upgrade scaleguard" if version > SCHEMA
                   else f": not a usable scaleguard history; {_REBUILD}")
            )  # fmt: skip
        if version == 0 and self.readonly:
            raise HistoryError(f"history {self.path}: empty, or not a usable scaleguard history; {_REBUILD}")
        columns = tuple(r[1] for r in self._db.execute("PRAGMA table_info(runs)").fetchall())
        if columns != _COLUMNS:
            raise HistoryError(
                f"history {self.path}: its runs table "
                + (f"has columns {', '.join(columns)[:200]}" if columns else "is missing")
                + f": not a usable scaleguard history; {_REBUILD}"
            )
        extra = self._db.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view')"
        ).fetchall()
        if extra:
            raise HistoryError(
                f"history {self.path}: holds a {extra[0][0]} ({str(extra[0][1])[:60]!r}), "
                "which scaleguard never "
                f"makes: not a usable scaleguard history; {_REBUILD}"
            )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One writer at a time: SQLite's write lock, waited for up to ``timeout_s``."""
        if self.readonly:
            raise HistoryError(f"history {self.path}: opened read-only; nothing was written")
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise HistoryError(
                        f"history {self.path}: "
                        + (
                            f"another writer held it for {self.timeout_s:.0f} s"
                            if "locked" in str(exc)
                            else f"cannot be written ({exc})"
                        )
                        + "; nothing was written"
                    ) from None
                time.sleep(0.05)
        try:
            yield self._db
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise HistoryError(
                f"history {self.path}: the write failed ({exc}); nothing was written"
            ) from None
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
            raise

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version < 0 or version > SCHEMA:
            return  # refused by name in _check_schema
        if version == SCHEMA:
            return  # nothing to do: no write lock taken (a reader never waits behind a writer)
        with self._write() as db:
            # again, under the write lock: a session creating the file beside us may have
            # migrated it since (its steps run twice would break the table)
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            for step in range(version + 1, SCHEMA + 1):
                # statement by statement: executescript would commit the open transaction
                for statement in migration(step, "sqlite"):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {step}")

    def append(
        self,
        cases: Iterable[CaseEvidence],
        hardware_key: str,
        source: str,
        verdicts: dict[str, str] | None = None,
        suite_commit: str | None = None,
        fleet: Fleet | None = None,
    ) -> int:
        """Every run of ``cases`` (quarantined ones flagged); returns how many were new."""
        batch = Batch(list(cases), hardware_key, source, verdicts or {}, suite_commit)
        return self.append_rows(appendable([batch], str(self.path), fleet or Fleet.here()))

    def append_rows(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """Rows made (and checked) by ``appendable``, in one transaction; how many were new (a
        run already there, by hardware key and run id, is left as it is)."""
        with self._write() as db:
            before = db.total_changes
            db.executemany(INSERT.replace("%s", "?"), rows)
            return db.total_changes - before

    def raw_rows(self) -> list[tuple[Any, ...]]:
        """Every stored row as ``append_rows`` takes it (a spool sent on, a history moved in),
        each checked as a view would check it."""
        try:
            raw = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs ORDER BY recorded_at").fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(f"history {self.path}: cannot be read ({exc}); {_REBUILD}") from None
        for row in raw:
            _checked_row(str(self.path), as_viewed(row))
            check_stored(str(self.path), row, _REBUILD)
        return raw

    def delete_runs(self, keys: Sequence[tuple[str, str]]) -> None:
        """Drop (hardware key, run id) rows: a spool's rows once the server holds them."""
        with self._write() as db:
            db.executemany("DELETE FROM runs WHERE hardware_key = ? AND run_id = ?", keys)

    def remembered_blocks(self, digests: Sequence[str]) -> dict[str, str]:
        """The change-point memo's entries this history holds for ``digests`` (``history.memo``;
        a history older than schema 5, or one that cannot be read: none)."""
        wanted = [d for d in digests if isinstance(d, str) and BLOCK_DIGEST.fullmatch(d)]
        out: dict[str, str] = {}
        try:
            if int(self._db.execute("PRAGMA user_version").fetchone()[0]) < 5:
                return out
            for at in range(0, len(wanted), 500):  # SQLite's bound on a statement's parameters
                chunk = wanted[at : at + 500]
                out.update(
                    self._db.execute(
                        "SELECT digest, found FROM changepoint_blocks WHERE digest IN "
                        f"({', '.join('?' * len(chunk))}) AND length(found) <= {MAX_BLOCK_ENTRY}",
                        chunk,
                    ).fetchall()
                )
        except (sqlite3.Error, ValueError, TypeError):
            return {}
        return out

    def remember_blocks(self, entries: Sequence[tuple[str, str]]) -> bool:
        """Keep memo entries for every later viewer: a cache's write, which a view may make on a
        history it opened read-only. It never migrates (a history older than schema 5 gets
        none), never waits past ``BLOCK_WRITE_S`` for the lock, and never fails: False where
        it was not written (a read-only file or directory, a writer holding the lock). Its own
        short-lived connection, whichever way the history was opened: the same deadline for
        every caller."""
        if not entries:
            return True
        db: sqlite3.Connection | None = None
        try:
            if int(self._db.execute("PRAGMA user_version").fetchone()[0]) < 5:
                return False
            db = sqlite3.connect(self.path, timeout=BLOCK_WRITE_S, isolation_level=None)
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(REMEMBER_BLOCKS.replace("%s", "?"), entries)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return True
        except sqlite3.Error:
            return False
        finally:
            if db is not None:
                db.close()

    def _chosen(
        self,
        hardware_key: str | None,
        case_glob: str,
        runner: str | None,
        project: str | None,
        limit: int | None,
    ) -> tuple[list[tuple[str, str]], str, list[Any]]:
        """The (key, case) pairs a view reads (more than ``limit`` runs refused; None: the
        reader counts as it reads), the WHERE clause of one pair (its key and case
        first, then the runner and project kept) and its further arguments. The patterns match
        as ``matches`` says, the one rule of saved files and histories alike (SQLite's GLOB reads
        ``[!t]`` otherwise than fnmatch), over the distinct (key, case, runner, project) kinds
        (``choose``); then each chosen case's runs are read through the (key, case, time)
        index: one case of 10,000 nights beside 49 others reads its own runs, not all 500,000."""
        kinds = self._db.execute(
            "SELECT DISTINCT hardware_key, case_id, runner, project FROM runs"
        ).fetchall()
        # the kinds hold every key and case id there is: one scan checks them (a count of the
        # runs without them was a second scan of 500,000 runs)
        if any(not isinstance(key, str) or not isinstance(case, str) for key, case, _, _ in kinds):
            orphans = self._db.execute(
                "SELECT count(*) FROM runs WHERE typeof(case_id) != 'text' OR typeof(hardware_key) != 'text'"
            ).fetchone()[0]
            raise HistoryError(
                f"history {self.path}: {orphans} runs have no case id or hardware key (a file not "
                f"written by scaleguard); {_REBUILD}"
            )
        pairs, runners, projects = choose(kinds, hardware_key, case_glob, runner, project)
        extra, extra_args = "", []
        for column, kept in (("runner", runners), ("project", projects)):
            if kept is not None:  # columns of ours; the values go in as parameters
                extra += f" AND {column} IN ({', '.join('?' * len(kept))})"
                extra_args += sorted(kept)
        where = f"WHERE hardware_key = ? AND case_id = ?{extra}"
        count = 0 if limit is None else sum(
            self._db.execute(f"SELECT count(*) FROM runs {where}", [*pair, *extra_args]).fetchone()[0]
            for pair in pairs
        )  # fmt: skip
        if limit is not None and count > limit:
            raise HistoryError(
                f"history {self.path}: {count} runs match, more than the {limit} one view reads; "
                "narrow it with --case GLOB and --hardware-key KEY"
            )
        return pairs, where, extra_args

    def rows(
        self,
        hardware_key: str | None = None,
        case_glob: str = "*",
        runner: str | None = None,
        project: str | None = None,
    ) -> list[HistoryRow]:
        """Every run matching (``_chosen``), validated field by field (a file edited by hand or by
        a hostile tool): at most ``MAX_ROWS`` of them (an export; a view reads ``view``)."""
        try:
            pairs, where, extra_args = self._chosen(hardware_key, case_glob, runner, project, MAX_ROWS)
            query = f"SELECT {_SQLITE_VIEWED} FROM runs {where} ORDER BY recorded_at, run_id"
            raw = [r for pair in pairs for r in self._db.execute(query, [*pair, *extra_args]).fetchall()]
        except sqlite3.Error as exc:
            raise HistoryError(f"history {self.path}: cannot be read ({exc}); {_REBUILD}") from None
        return [_checked_row(str(self.path), r) for r in raw]

    def view(
        self,
        hardware_key: str | None = None,
        case_glob: str = "*",
        runner: str | None = None,
        project: str | None = None,
        recent: int = RECENT_NIGHTS,
        each: Callable[[CaseRead], None] | None = None,
    ) -> list[CaseRead]:
        """What ``history`` and its page show (``read_cases``): every night of each case matching,
        the last ``recent`` nights' runs whole."""
        try:
            pairs, where, extra = self._chosen(hardware_key, case_glob, runner, project, None)
            db = self._db
            series = f"SELECT {', '.join(SERIES_COLUMNS)} FROM runs {where} ORDER BY recorded_at, run_id"
            since = (
                f"SELECT {_SQLITE_VIEWED_RECENT} FROM runs {where} AND recorded_at >= ? "
                "ORDER BY recorded_at, run_id"
            )
            at = f"SELECT {_SQLITE_VIEWED} FROM runs {where} ORDER BY recorded_at, run_id LIMIT 1 OFFSET ?"
            return read_cases(
                str(self.path), pairs,
                lambda pair: db.execute(series, [*pair, *extra]).fetchall(),
                lambda pair, time, last: db.execute(since, [last, *pair, *extra, time]).fetchall(),
                lambda pair, index: db.execute(at, [*pair, *extra, index]).fetchone(),
                recent,
                limit=MAX_VIEW_RUNS,
                each=each,
            )  # fmt: skip
        except sqlite3.Error as exc:
            raise HistoryError(f"history {self.path}: cannot be read ({exc}); {_REBUILD}") from None


def choose(
    kinds: Sequence[Sequence[Any]],
    hardware_key: str | None,
    case_glob: str,
    runner: str | None,
    project: str | None,
) -> tuple[list[tuple[str, str]], set[str] | None, set[str] | None]:
    """Of a history's distinct (key, case, runner, project) kinds, those the patterns match
    (``matches``; an unset pattern matches all, a set one never matches an unknown value):
    the (key, case) pairs in order, and the runners and projects kept (None: not narrowed)."""

    def fits(text: object, pattern: str | None) -> bool:
        return pattern is None or (isinstance(text, str) and matches(text, pattern))

    chosen = [
        (key, case, host, team) for key, case, host, team in kinds
        if isinstance(key, str) and isinstance(case, str) and matches(case, case_glob)
        and fits(key, hardware_key) and fits(host, runner) and fits(team, project)
    ]  # fmt: skip
    pairs = sorted({(key, case) for key, case, _, _ in chosen})
    runners = None if runner is None else {host for _, _, host, _ in chosen}
    projects = None if project is None else {team for _, _, _, team in chosen}
    return pairs, runners, projects


# portable: SQLite (3.24+) and PostgreSQL both keep the stored row on a repeated key
INSERT = (
    f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES ({', '.join(['%s'] * len(_COLUMNS))}) "
    "ON CONFLICT (hardware_key, run_id) DO NOTHING"
)


# file systems whose locking SQLite's WAL cannot trust (its shared memory is per host)
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
    "fuse.sshfs", "fuse.glusterfs", "fuse.cephfs", "9p", "afs", "panfs", "wekafs", "fuse.juicefs",
})  # fmt: skip


MOUNTS_FILE = Path("/proc/mounts")


def network_filesystem(directory: Path, mounts: str | None = None) -> str | None:
    """The type of the network file system ``directory`` lies on (None: a local one, or
    unknown): the longest mount point that holds it, from ``/proc/mounts`` (or ``mounts``)."""
    if mounts is None:
        try:
            mounts = MOUNTS_FILE.read_text()
        except OSError:
            return None
    try:
        where = directory.resolve()
    except OSError:
        return None
    best, kind = -1, ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (where == Path(point) or Path(point) in where.parents) and len(point) > best:
            best, kind = len(point), fields[2]
    return kind if kind in NETWORK_FS else None


def is_sqlite(path: Path) -> bool:
    """A file that starts as SQLite's do: a history to import as rows, not a JSON document."""
    try:
        with path.open("rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def matches(text: str, pattern: str) -> bool:
    """The one matching rule of ``--case`` and ``--hardware-key`` (histories, saved runs,
    exports): a shell-style pattern (``*``, ``?``, ``[seq]``, ``[!seq]``), case-sensitive, the
    whole id. A key or id without those characters matches itself alone."""
    return fnmatch.fnmatchcase(text, pattern)


_TEXT_MAX = 400  # a torch version, a git sha, a session id: far shorter in any real history


def _checked_row(path: str, raw: Sequence[Any], fix: str = _ROW_FIX) -> HistoryRow:
    """One stored run, every field of the type the page and the statistics need."""
    row = HistoryRow(*raw)
    if row.device is not None and row.device not in ("cpu", "cuda"):
        row = replace(row, device=None)  # advisory (the change points' smallest step): dropped

    def bad(field: str) -> HistoryError:
        return HistoryError(
            f"history {path}: run {str(row.run_id)[:60]!r} has a {field} of the wrong type or size; {fix}"
        )

    for name in ("run_id", "case_id", "hardware_key", "session", "recorded_at", "source"):
        value = getattr(row, name)
        if not isinstance(value, str) or len(value) > _TEXT_MAX:
            raise bad(name)
    for name in ("torch", "torch_git", "quarantine", "verdict", "runner", "project"):
        value = getattr(row, name)
        if value is not None and (not isinstance(value, str) or len(value) > _TEXT_MAX):
            raise bad(name)
    if not CASE_ID.fullmatch(row.case_id):
        raise bad("case id")
    if isinstance(row.median_s, bool) or not isinstance(row.median_s, (int, float)):
        raise bad("median step")
    if not (math.isfinite(row.median_s) and 0 < row.median_s < MAX_STEP_S):
        raise bad("median step")
    if row.efficiency is not None and (
        isinstance(row.efficiency, bool) or not isinstance(row.efficiency, (int, float))
        or not math.isfinite(row.efficiency)
    ):  # fmt: skip
        raise bad("efficiency")
    if row.projected is not None and (
        isinstance(row.projected, bool) or not isinstance(row.projected, (int, float))
        or not math.isfinite(row.projected) or not 0 <= row.projected <= 100
    ):  # fmt: skip
        row = replace(row, projected=None)  # advisory (a line on the page): dropped, never trusted
    if row.samples_per_s is not None and (
        isinstance(row.samples_per_s, bool) or not isinstance(row.samples_per_s, (int, float))
        or not math.isfinite(row.samples_per_s) or row.samples_per_s < 0
    ):  # fmt: skip
        raise bad("samples/s")
    if row.peak_mem_bytes is not None and (
        isinstance(row.peak_mem_bytes, bool)
        or not isinstance(row.peak_mem_bytes, int)
        or row.peak_mem_bytes < 0
    ):
        raise bad("peak memory")
    return row


def _text(value: object) -> str | None:
    return None if value is None else str(value)


class Night(NamedTuple):
    """One session's runs of a case: the unit of a series (the median of its run medians). A
    tuple, not a dataclass: a view of 10,000 nights x 50 cases makes 500,000 of them."""

    session: str
    recorded_at: str
    value: float
    torch: str | None
    torch_git: str | None
    runs: int


class Nights(Sequence[Night]):
    """A case's nights as columns, each ``Night`` made when asked for: a view of 10,000 nights x
    50 cases read them from columns and made 500,000 tuples (0.4 s) that the search and the
    page only read as two columns (``values``, ``times``)."""

    __slots__ = ("gits", "runs", "sessions", "times", "torches", "values")

    def __init__(
        self,
        sessions: list[str],
        times: list[str],
        values: list[float],
        torches: list[str | None],
        gits: list[str | None],
        runs: list[int],
    ) -> None:
        self.sessions, self.times, self.values = sessions, times, values
        self.torches, self.gits, self.runs = torches, gits, runs

    @classmethod
    def of(cls, nights: Sequence[Night]) -> Nights:
        if not nights:
            return cls([], [], [], [], [], [])
        sessions, times, values, torches, gits, runs = map(list, zip(*nights, strict=True))
        return cls(sessions, times, values, torches, gits, runs)

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> Night: ...

    @overload
    def __getitem__(self, i: slice) -> list[Night]: ...

    def __getitem__(self, i: int | slice) -> Night | list[Night]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return Night(
            self.sessions[i], self.times[i], self.values[i], self.torches[i], self.gits[i], self.runs[i]
        )


def columns_of(nights: Sequence[Night]) -> tuple[list[str], list[float]]:
    """(times, values) of a case's nights, from the columns when it has them."""
    if isinstance(nights, Nights):
        return nights.times, nights.values
    return [n.recorded_at for n in nights], [n.value for n in nights]


def nightly(rows: Sequence[HistoryRow]) -> list[Night]:
    """Rows of one case and hardware, folded per session in time order (quarantined runs out)."""
    by_session: dict[str, list[HistoryRow]] = {}
    for row in rows:
        if row.quarantine is None:
            by_session.setdefault(row.session, []).append(row)
    nights = [
        Night(
            session,
            min(r.recorded_at for r in runs),
            float(runs[0].median_s if len(runs) == 1 else statistics.median(r.median_s for r in runs)),
            runs[-1].torch,
            runs[-1].torch_git,
            len(runs),
        )
        for session, runs in by_session.items()
    ]
    return sorted(nights, key=lambda n: n.recorded_at)


@dataclass(frozen=True)
class CaseRead:
    """What a view reads of one case on one hardware key: every night (from the index), how many
    runs and which runners, and the runs of the last nights whole (``recent``)."""

    hardware_key: str
    case_id: str
    nights: Nights
    runs: int
    runners: tuple[str, ...]
    recent: list[HistoryRow]


def _texts_fit(column: Sequence[Any], nullable: bool) -> bool:
    """Every value a text of at most ``_TEXT_MAX`` characters (or None): ``_checked_row``'s rule,
    at C speed over a whole column (a per-value loop cost 0.3 s a view)."""
    kinds = set(map(type, column))
    if not kinds <= ({str, type(None)} if nullable else {str}):
        return False
    return max(map(len, filter(None, column) if nullable else column), default=0) <= _TEXT_MAX


def _steps_fit(column: Sequence[Any]) -> bool:
    if not set(map(type, column)) <= {float, int}:  # a bool is neither
        return False
    values = np.asarray(column, dtype=np.float64)
    return bool(np.isfinite(values).all() and (values > 0).all() and (values < MAX_STEP_S).all())


def _first_refused(columns: Sequence[Sequence[Any]]) -> int:
    """The place of the first run of a case's series (``SERIES_COLUMNS``, as columns) whose
    value a column check refuses: the one run of a failed check worth reading again whole."""
    for i, (session, recorded_at, median, *texts) in enumerate(zip(*columns, strict=True)):
        fits = _texts_fit([session, recorded_at], False) and _steps_fit([median]) and _texts_fit(texts, True)
        if not fits:
            return i
    return 0


_NUMBERS = (int, float)


def _numbers_fit(
    column: Sequence[Any], nullable: bool, low: float = -math.inf, high: float = math.inf
) -> bool:
    """Every value a finite number in [low, high] (or None): ``_checked_row``'s rules for a
    measured number, over a whole column."""
    present = [v for v in column if v is not None] if nullable else list(column)
    if not set(map(type, present)) <= set(_NUMBERS):  # a bool is neither
        return False
    values = np.asarray(present, dtype=np.float64)
    return bool(np.isfinite(values).all() and (values >= low).all() and (values <= high).all())


def _checked_rows(where: str, raws: Sequence[Sequence[Any]], fix: str = _ROW_FIX) -> list[HistoryRow]:
    """``_checked_row`` of many rows (``VIEWED``'s fields): a view reads a year of each case's
    runs whole (18,250 rows for 50 cases; 0.33 s row by row on the 2-core VM), so the rules run
    column by column, and a table any of them refuses (or whose advisory fields a row would
    drop) is checked row by row, where the run is named."""
    if not raws:
        return []
    columns = list(zip(*raws, strict=True))
    (run_id, case_id, key, torch, git, session, recorded, source, median, efficiency, memory,
     quarantine, verdict, rate, device, runner, project, projected) = columns  # fmt: skip
    fits = (
        all(_texts_fit(c, False) for c in (run_id, case_id, key, session, recorded, source))
        and all(_texts_fit(c, True) for c in (torch, git, quarantine, verdict, runner, project))
        and all(isinstance(c, str) and CASE_ID.fullmatch(c) for c in set(case_id))
        and _steps_fit(median)
        and _numbers_fit(efficiency, True)
        and _numbers_fit(rate, True, low=0.0)
        and _numbers_fit(projected, True, 0.0, 100.0)
        and set(map(type, memory)) <= {int, type(None)}
        and min((m for m in memory if m is not None), default=0) >= 0
        and set(device) <= {"cpu", "cuda", None}
    )  # fmt: skip
    if not fits:
        return [_checked_row(where, r, fix) for r in raws]
    return [HistoryRow(*r) for r in raws]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector held off while a view reads: every row arrives as a tuple
    the collector tracks, and its passes over the ever larger heap took 0.8 of 1.5 s of reading
    10,000 nights x 50 cases. Reading makes no cycles, so nothing waits for it; a pause
    already held by a caller is left to that caller."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@collection_paused()
def read_cases(
    where: str,
    pairs: Sequence[tuple[str, str]],
    series_of: Callable[[tuple[str, str]], list[tuple[Any, ...]]],
    rows_since: Callable[[tuple[str, str], str, str], list[tuple[Any, ...]]],
    row_at: Callable[[tuple[str, str], int], tuple[Any, ...] | None],
    recent: int = RECENT_NIGHTS,
    fix: str = _REBUILD,
    limit: int = MAX_VIEW_RUNS,
    each: Callable[[CaseRead], None] | None = None,
) -> list[CaseRead]:
    """The view of ``pairs`` (hardware key, case), whichever engine: ``series_of`` gives a case's
    ``SERIES_COLUMNS`` in time order, ``rows_since`` its runs recorded from a time on (``VIEWED``;
    the device of those at the latest run's time, the third argument, alone),
    ``row_at`` one run whole by its place in that order; ``each`` is given every case as soon as
    it is read (its change points searched while the next is read). Every value is checked by
    ``_checked_row``'s rules (the columns as a whole; a column that fails names its first bad
    run through ``_checked_row``)."""
    out: list[CaseRead] = []
    total = 0
    for pair in pairs:
        if not CASE_ID.fullmatch(pair[1]):
            raise HistoryError(
                f"history {where}: a case id of the wrong type or size ({pair[1][:60]!r}); {fix}"
            )
        raw = series_of(pair)
        if not raw:
            continue
        total += len(raw)
        if total > limit:  # counted as read, case by case (a count first cost a scan of the table)
            raise HistoryError(
                f"history {where}: more than the {limit} runs one view reads match; "
                "narrow it with --case GLOB and --hardware-key KEY"
            )
        columns = [list(c) for c in zip(*raw, strict=True)]
        sessions, times, medians, quarantines, torches, gits, runners = columns
        fits = (
            _texts_fit(sessions, False) and _texts_fit(times, False) and _steps_fit(medians)
            and all(_texts_fit(c, True) for c in (quarantines, torches, gits, runners))
        )  # fmt: skip
        if not fits:  # the first run a column check refuses, read whole and named by the one rule
            stored = row_at(pair, _first_refused(columns))
            if stored is not None:
                _checked_row(where, stored, fix)
            raise HistoryError(
                f"history {where}: case {pair[1]!r} has a run of the wrong type or size; {fix}"
            )
        if len(set(sessions)) == len(sessions) and not any(quarantines):  # one run a night: most histories
            nights = Nights(sessions, times, list(map(float, medians)), torches, gits, [1] * len(raw))
        else:
            by_session: dict[str, list[int]] = {}
            for i, (session, quarantine) in enumerate(zip(sessions, quarantines, strict=True)):
                if quarantine is None:
                    by_session.setdefault(session, []).append(i)
            nights = Nights.of(sorted(
                (
                    Night(session, min(times[i] for i in at),
                          float(statistics.median(medians[i] for i in at)),
                          torches[at[-1]], gits[at[-1]], len(at))
                    for session, at in by_session.items()
                ),
                key=lambda n: n.recorded_at,
            ))  # fmt: skip
        keep = set(nights.sessions[-recent:]) if nights and recent > 0 else set()
        since = min(nights.times[-recent:]) if keep else None
        recent_rows = rows_since(pair, since, max(times)) if since is not None else []
        whole = _checked_rows(where, [r for r in recent_rows if r[5] in keep], fix)
        out.append(CaseRead(pair[0], pair[1], nights, len(raw), tuple(sorted(set(runners) - {None})), whole))
        if each is not None:
            each(out[-1])
    return out


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first night of the new level
    change: float  # relative change of the level (after / before - 1)
    p_value: float
    before: Night | None = None
    after: Night | None = None


CHANGE_MAX_P = 0.001  # a change point's p-value bound, in every view's search
CHANGE_MIN_SIZE = 3  # nights a level needs on each side


def change_points(
    values: Sequence[float] | np.ndarray,
    max_pvalue: float = CHANGE_MAX_P,
    min_magnitude: float = 0.02,
    min_size: int = CHANGE_MIN_SIZE,
    memo: Memo | None = None,
) -> list[ChangePoint]:
    """Where the level of ``values`` (positive: step times) changed, in order
    (``scaleguard.history.changepoints.detect``; SeriesError, a ValueError, for a series it refuses)."""
    return [
        ChangePoint(s.index, s.change, s.p_value)
        for s in detect(values, max_pvalue, min_magnitude, min_size, memo=memo)
    ]


def min_magnitude_for(
    hardware_key: str, case_id: str, settings: ThresholdSettings | None = None, device: str | None = None
) -> float:
    """The smallest change of level worth a change point for a case: its step threshold on its
    device (CPU 10 %, CUDA 3 % by default; per-case rules apply), never one figure for all. The
    device is the one recorded with the case's runs; only rows without it fall back to the key's
    form (``cpu-...`` or a cluster's ``slurm-cpu-...``, which the old prefix test took for CUDA)."""
    if device not in ("cpu", "cuda"):
        device = "cpu" if hardware_key.startswith(("cpu-", "slurm-cpu-")) else "cuda"
    return (settings or ThresholdSettings()).for_case(case_id, device).step


def device_of(rows: Sequence[HistoryRow]) -> str | None:
    """The device recorded with a case's runs (the latest that says), for ``min_magnitude_for``."""
    return next((r.device for r in reversed(rows) if r.device in ("cpu", "cuda")), None)


def case_change_points(nights: Sequence[Night], **kw: Any) -> list[ChangePoint]:
    """Change points of a case's nightly series, with the nights either side."""
    return with_nights(nights, change_points(columns_of(nights)[1], **kw))


def with_nights(nights: Sequence[Night], points: Sequence[ChangePoint]) -> list[ChangePoint]:
    """``points`` of a case's series with the nights either side of each."""
    return [ChangePoint(c.index, c.change, c.p_value, nights[c.index - 1], nights[c.index]) for c in points]


@dataclass(frozen=True)
class CaseSeries:
    """One case's nights on one hardware key and the change points of that series: computed
    once per view (the terminal and the page share it). ``rows``: the runs a view read whole
    (the last ``RECENT_NIGHTS`` nights; all of them for rows given as rows); ``runs`` and
    ``runners`` count every night's."""

    hardware_key: str
    case_id: str
    rows: list[HistoryRow]
    nights: Sequence[Night]
    points: list[ChangePoint]
    runs: int = 0
    runners: tuple[str, ...] = ()


def reads_of(rows: Sequence[HistoryRow]) -> list[CaseRead]:
    """Rows already read whole, as a view's reads (every run recent)."""
    groups: dict[tuple[str, str], list[HistoryRow]] = {}
    for row in rows:
        groups.setdefault((row.hardware_key, row.case_id), []).append(row)
    return [
        CaseRead(key, case_id, Nights.of(nightly(case_rows)), len(case_rows),
                 tuple(sorted({r.runner for r in case_rows if r.runner})), case_rows)
        for (key, case_id), case_rows in sorted(groups.items())
    ]  # fmt: skip


def analyse(
    rows: Sequence[HistoryRow] | Sequence[CaseRead],
    settings: ThresholdSettings | None = None,
    memo: Memo | None = None,
) -> list[CaseSeries]:
    """Every (key, case) of ``rows`` (or of a view's reads), in order, with its nights and change
    points (the smallest change of level the case's own step threshold, ``min_magnitude_for``;
    ``memo``: a long series' blocks kept between views, ``scaleguard.history.memo``)."""
    reads = [r for r in rows if isinstance(r, CaseRead)] or reads_of(
        [r for r in rows if isinstance(r, HistoryRow)]
    )
    out = []
    for read in sorted(reads, key=lambda r: (r.hardware_key, r.case_id)):
        magnitude = case_magnitude(read, settings)
        out.append(case_series(read, case_change_points(read.nights, min_magnitude=magnitude, memo=memo)))
    return out


def case_magnitude(read: CaseRead, settings: ThresholdSettings | None) -> float:
    """A case's smallest change of level worth a change point (``min_magnitude_for``, by the
    device its latest runs recorded): one rule for every search of a view."""
    return min_magnitude_for(read.hardware_key, read.case_id, settings, device_of(read.recent))


def case_series(read: CaseRead, points: list[ChangePoint]) -> CaseSeries:
    """A case's read with its change points: what the terminal and the page show."""
    return CaseSeries(
        read.hardware_key, read.case_id, read.recent, read.nights, points, read.runs, read.runners
    )


@dataclass(frozen=True)
class Batch:
    """Runs to append, as one source gave them: its cases, their hardware key, where they came
    from ("suite", "ab-A", "ingest", "import"), each case's verdict and projection (what a
    multi-rank case should have done, ``Projection.to_dict()``; kept in the run's record, where
    the page finds it beside the measured efficiency) and the suite's commit."""

    cases: Sequence[CaseEvidence]
    hardware_key: str
    source: str
    verdicts: Mapping[str, str] = field(default_factory=dict)
    suite_commit: str | None = None
    projections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def appendable(batches: Sequence[Batch], where: str, fleet: Fleet) -> list[tuple[Any, ...]]:
    """The rows ``batches`` insert, each refused now if a reader would refuse it later: a key, a
    case id or a text the views cannot read would make every later ``history`` and ``export`` of
    the file exit 2 (a 450-character device name in a derived key did). Pure: call it before the
    file is created, so a refused import leaves nothing behind."""
    from scaleguard.evidence.baseline import check_key
    from scaleguard.evidence.files import FileFormatError

    rows = []
    for batch in batches:
        hardware_key, verdicts, projections = batch.hardware_key, batch.verdicts, batch.projections
        try:
            check_key(hardware_key)
        except FileFormatError as exc:
            raise HistoryError(f"history {where}: not appended: {exc}") from None
        for evidence in batch.cases:
            projection = projections.get(evidence.case_id)
            for run in evidence.runs:
                row = (
                    run.run_id, evidence.case_id, evidence.group_id, evidence.world_size, hardware_key,
                    _text(evidence.versions.get("torch")), _text(evidence.versions.get("torch_git")),
                    _text(evidence.versions.get("cuda")), _text(evidence.versions.get("cudnn")),
                    _text(evidence.versions.get("nccl")), run.commit or batch.suite_commit, run.session,
                    run.recorded_at or "", batch.source, run.median_s, run.samples_per_s,
                    run.scaling_efficiency, run.peak_mem_bytes, run.quarantine,
                    verdicts.get(evidence.case_id),
                    json.dumps({"case": {k: v for k, v in evidence.to_dict().items() if k != "runs"},
                                "run": run.to_dict(),
                                **({"projection": dict(projection)} if projection else {})},
                               allow_nan=False),
                    fleet.runner, fleet.project,
                )  # fmt: skip
                _checked_row(where, as_viewed(row), "not appended; nothing was written")
                rows.append(row)
    return rows


# the stored columns a view reads (``History.rows``), in its order: checked at append as at read
_VIEWED = tuple(
    _COLUMNS.index(name)
    for name in (
        "run_id", "case_id", "hardware_key", "torch", "torch_git", "session", "recorded_at", "source",
        "median_s", "efficiency", "peak_mem_bytes", "quarantine", "verdict", "samples_per_s",
    )
)  # fmt: skip
_FLEET = (_COLUMNS.index("runner"), _COLUMNS.index("project"))


_RECORD_MAX = 4 << 20  # bytes of one stored record: a run's steps and anatomy are far smaller


def check_stored(where: str, row: Sequence[Any], fix: str) -> None:
    """The columns a view does not read, checked before a row is copied (an imported file, a
    spool): a record that is no JSON object would make every later view of a server history
    fail (its views read the record as JSON), a world size that is no integer its insert."""
    run_id = str(row[0])[:60]
    record = row[_COLUMNS.index("record")]
    world = row[_COLUMNS.index("world_size")]
    group = row[_COLUMNS.index("group_id")]
    bad = None
    if type(world) is not int or not 0 < world < 1 << 31:
        bad = "world size"
    elif not isinstance(group, str) or len(group) > _TEXT_MAX:
        bad = "group id"
    elif any(
        v is not None and (not isinstance(v, str) or len(v) > _TEXT_MAX)
        for v in (row[_COLUMNS.index(c)] for c in ("cuda", "cudnn", "nccl", "suite_commit"))
    ):
        bad = "version text"
    elif not isinstance(record, str) or len(record) > _RECORD_MAX:
        bad = "record"
    else:
        try:
            if not isinstance(json.loads(record), dict):
                bad = "record"
        except (ValueError, RecursionError):
            bad = "record"
    if bad is not None:
        raise HistoryError(f"history {where}: run {run_id!r} has a {bad} of the wrong type or size; {fix}")


def as_viewed(row: Sequence[Any]) -> tuple[Any, ...]:
    """A stored row (``_COLUMNS``) in a view's order (``HistoryRow``); the device, which a view
    reads out of the record, left unknown."""
    return (*(row[i] for i in _VIEWED), None, *(row[i] for i in _FLEET))
