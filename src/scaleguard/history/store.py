"""One door to a history, whichever engine holds it, and the spool that keeps a night when
the server is away.

``open_history`` opens a file (SQLite) or a server (PostgreSQL) behind one interface: append
rows, read the views' rows, read raw rows. ``deliver`` is how a session or a command appends:
to a file directly; to a server after sending on what an earlier session spooled, and, when
the server cannot be reached or goes away mid-append (its transaction rolled back), into a
local spool, an SQLite history beside the default one, named after the server (host, port,
database; never the password). Exactly once: the spool's rows go to the server in one
transaction, are deleted from the spool only after it committed, and the server keeps a run it
already holds (hardware key, run id) as it is, so a crash between the two sends nothing twice.
"""

from __future__ import annotations

import hashlib
import shlex
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from scaleguard.evidence.runs import CaseEvidence
from scaleguard.history.database import (
    LOCK_TIMEOUT_S,
    RECENT_NIGHTS,
    CaseRead,
    Fleet,
    History,
    HistoryError,
    HistoryRow,
)
from scaleguard.history.target import HistoryTarget, ServerDsn


class Store(Protocol):
    """What every engine's history offers (``History``: SQLite; ``ServerHistory``: PostgreSQL)."""

    notes: list[str]  # what a reader should know (a snapshot, a network file system)

    def append(
        self,
        cases: Iterable[CaseEvidence],
        hardware_key: str,
        source: str,
        verdicts: dict[str, str] | None = None,
        suite_commit: str | None = None,
        fleet: Fleet | None = None,
    ) -> int: ...

    def append_rows(self, rows: Sequence[tuple[Any, ...]]) -> int: ...

    def raw_rows(self) -> list[tuple[Any, ...]]: ...

    def rows(
        self,
        hardware_key: str | None = None,
        case_glob: str = "*",
        runner: str | None = None,
        project: str | None = None,
    ) -> list[HistoryRow]: ...

    def view(
        self,
        hardware_key: str | None = None,
        case_glob: str = "*",
        runner: str | None = None,
        project: str | None = None,
        recent: int = RECENT_NIGHTS,
        each: Callable[[CaseRead], None] | None = None,
    ) -> list[CaseRead]: ...

    def remembered_blocks(self, digests: Sequence[str]) -> dict[str, str]: ...

    def remember_blocks(self, entries: Sequence[tuple[str, str]]) -> bool: ...

    def close(self) -> None: ...

    def __enter__(self) -> Store: ...

    def __exit__(self, *exc: object) -> None: ...


def open_history(target: HistoryTarget, readonly: bool = False, timeout_s: float = LOCK_TIMEOUT_S) -> Store:
    if isinstance(target, ServerDsn):
        from scaleguard.history.server import ServerHistory

        return ServerHistory(target, timeout_s=timeout_s, readonly=readonly)
    return History(target, timeout_s=timeout_s, readonly=readonly)


def spool_path(directory: Path, dsn: ServerDsn) -> Path:
    """The spool of one server: its host, port, database and user name it (a changed password
    keeps the spool; another server never receives this one's runs)."""
    parsed = urllib.parse.urlsplit(dsn.dsn)
    ident = f"{parsed.hostname}:{parsed.port}/{parsed.path.lstrip('/')}?{parsed.username}"
    return directory / f"history-spool-{hashlib.sha256(ident.encode()).hexdigest()[:12]}.sqlite"


@dataclass(frozen=True)
class Delivery:
    """What an append did: runs new on the history, runs sent on from the spool, runs kept in
    the spool (the server away), and the one line that says so."""

    appended: int
    sent: int
    spooled: int
    line: str


def send_spool(db: Store, spool: Path) -> int:
    """The spool's runs onto the server ``db`` (one transaction), then out of the spool; how many
    the server did not hold yet. A spool never written is no work."""
    if not spool.exists():
        return 0
    with History(spool) as kept:
        rows = kept.raw_rows()
        if not rows:
            return 0
        added = db.append_rows(rows)
        kept.delete_runs([(row[4], row[0]) for row in rows])  # hardware_key, run_id
    return added


def deliver(target: HistoryTarget, rows: Sequence[tuple[Any, ...]], spool_dir: Path) -> Delivery:
    """Append ``rows`` (made by ``database.appendable``) to the history at ``target``."""
    if not isinstance(target, ServerDsn):
        with History(target) as file:
            added = file.append_rows(rows)
        notes = "".join(f"; {note}" for note in file.notes)
        return Delivery(added, 0, 0, f"history {target}: {added} runs appended{notes}")
    spool = spool_path(spool_dir, target)
    sent = 0
    try:
        with open_history(target) as db:
            sent = send_spool(db, spool)
            added = db.append_rows(rows)
    except HistoryError as exc:  # unreachable, gone mid-write, a role that may not write: kept
        with History(spool) as kept:
            spooled = kept.append_rows(rows)
        return Delivery(
            0, sent, spooled,
            f"history {target} not reached ({str(exc).removeprefix(f'history {target}: ')}): "
            f"{spooled} runs kept in {spool}; the next session that reaches it sends them first "
            f"(or: scaleguard history send --spool-dir {shlex.quote(str(spool_dir))}, same --history)",
        )  # fmt: skip
    earlier = f" (and {sent} runs an earlier session had spooled)" if sent else ""
    return Delivery(added, sent, 0, f"history {target}: {added} runs appended{earlier}")
