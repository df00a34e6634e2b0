"""The change-point memo: a long series' block candidates kept between views
(``changepoints.Memo``), at two places. Whole blocks (all their nights in: they never change once
the series has grown past them) in the history itself (table ``changepoint_blocks``, schema 5),
where every viewer of the fleet's history finds them: a first view of a history moved in, or from
a fresh runner, searched 1,000 blocks for 10,000 nights x 50 cases (8.4 s on the 2-core VM). The
rest (each series' last, growing block) and everything a reader's role may not give the history,
in a small SQLite file of the runner's own (``.scaleguard/`` beside the spool). Each long
series' whole answer (its change points) in both: the runner's file by the series' digest, the
history at one place a case (``analysis.series_place``) holding the latest answer with the
digest of the series it answers, so an ephemeral runner, whose file is always empty, views what
another viewer has searched since the last night at the speed of a runner that viewed it itself
(a fresh runner's view of 10,000 nights x 50 cases merged every case again: 0.8 s of search).

Content-addressed: an entry's key is the digest of the block's values and of every setting its
candidates depend on, so the memo can only save work, never change an answer; one memo serves
every history, and a history moved, merged or edited finds what still applies. It is a cache and
nothing more: a memo that cannot be opened, read or written (a read-only directory, a corrupt or
foreign file, a lock held past a short deadline) is skipped with one note, and the view computes
what it needs. Entries unused for ``KEEP_DAYS`` go at the next write.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleguard.evidence.verdict import ThresholdSettings
from scaleguard.history import database as history
from scaleguard.history.changepoints import block_keys

if TYPE_CHECKING:
    from scaleguard.history.store import Store

NAME = "changepoint-memo.sqlite"
KEEP_DAYS = 90
LOCK_S = 2.0  # a memo is never worth waiting for: another view holding it means compute
MAX_ENTRY = history.MAX_BLOCK_ENTRY  # characters: a block of 576 nights has at most ~190 candidates
SHARED_MAX = 100_000  # whole blocks one view asks the history for (10,000 nights x 50 cases: 950)
_SCHEMA = 1
MAX_STEPS_ENTRY = 1 << 20  # characters: ~25,000 steps, more than any series of ours holds
SERIES_PREFIX = "series:"  # a whole series' answer, beside the blocks' (whose keys are bare digests)


class ChangePointMemo:
    """``changepoints.Memo`` on an SQLite file; ``note`` says why it was skipped (None: used)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / NAME
        self.note: str | None = None
        self._db: sqlite3.Connection | None = None
        self._opened = False
        self._new: dict[str, list[int]] = {}
        self._used: list[str] = []
        self._shared: dict[str, list[int]] = {}  # what the history holds of the whole blocks
        self._whole: set[str] = set()  # the whole blocks of the series viewed
        self._local: dict[str, list[int]] = {}  # entries the runner's file gave
        self._asked = 0  # whole blocks asked of the history in this view
        self._new_steps: dict[str, list[list[float]]] = {}  # whole series' answers (``steps``)
        self._shared_places: dict[str, str | None] = {}  # place -> the series the history answers there
        self._new_places: dict[str, str] = {}  # place -> the entry this view would give it
        self._answered: dict[str, str] = {}  # place -> the series this view searched for it

    def _open(self) -> sqlite3.Connection | None:
        """The file, opened on first use: a view of short series never makes one."""
        if self._opened:
            return self._db
        self._opened = True
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.path.is_symlink() or (
                os.path.lexists(self.path) and not stat.S_ISREG(os.stat(self.path).st_mode)
            ):  # a FIFO would block SQLite's first read; a link would write where it points
                raise OSError("not a regular file")
            db = sqlite3.connect(self.path, timeout=LOCK_S, isolation_level=None)
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, _SCHEMA):
                    raise sqlite3.DatabaseError(f"a memo of schema {version}, not {_SCHEMA}")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS blocks "
                    "(digest TEXT PRIMARY KEY, found TEXT NOT NULL, used REAL NOT NULL)"
                )
                db.execute(f"PRAGMA user_version = {_SCHEMA}")
            except sqlite3.Error:
                db.close()  # a junk or foreign file: its handle closed, not left to the collector
                raise
            self._db = db
        except (sqlite3.Error, OSError) as exc:
            self.note = f"change-point memo {self.path} skipped ({exc}); every block searched"
        return self._db

    def lookup(self, store: Store, values: Sequence[float]) -> dict[str, list[int]]:
        """The entries ``detect`` will find for the blocks of ``values`` (a case's nightly
        values, as ``history.analyse`` searches them): digest -> candidates. What ``store``
        remembers of the whole ones is asked for once per case (at most ``SHARED_MAX`` blocks a
        view), the rest looked up in the runner's file."""
        keys = block_keys(values)
        whole = sorted({digest for digest, is_whole in keys if is_whole} - self._whole)
        self._whole.update(whole)
        asked = whole[: max(0, SHARED_MAX - self._asked)]
        if asked:
            self._asked += len(asked)
            for digest, text in store.remembered_blocks(asked).items():
                found = _parsed(text)
                if found is not None and digest in self._whole:
                    self._shared[digest] = found
        hits = {}
        for digest, _ in keys:
            found = self.get(digest)
            if found is not None:
                hits[digest] = found
        return hits

    def to_share(self) -> list[tuple[str, str]]:
        """The whole blocks this view searched or found in the runner's file that the history
        does not hold as they are (missing, or an entry that did not fit its block and was
        searched again): (digest, JSON) for ``Store.remember_blocks``."""
        known = {**self._local, **self._new}
        blocks = [
            (d, json.dumps(known[d]))
            for d in sorted(self._whole & known.keys())
            if self._shared.get(d) != known[d]
        ]
        answers = [
            (place, entry)
            for place, entry in sorted(self._new_places.items())
            if self._shared_places.get(place) != self._answered[place] and len(entry) <= MAX_ENTRY
        ]
        return blocks + answers

    def get(self, digest: str) -> list[int] | None:
        if digest in self._new:
            return self._new[digest]
        if digest in self._shared:
            return self._shared[digest]
        db = self._open()
        if db is None:
            return None
        try:
            row = db.execute("SELECT found FROM blocks WHERE digest = ?", (digest,)).fetchone()
        except sqlite3.Error as exc:
            self._skip(exc)
            return None
        found = _parsed(row[0]) if row is not None else None
        if found is None:
            return None  # an entry no writer of ours made: searched again (and overwritten)
        self._used.append(digest)
        self._local[digest] = found
        return found

    def put(self, digest: str, found: list[int]) -> None:
        self._new[digest] = list(found)
        self._open()  # kept here too: a whole block the history may not be given (a reader's role)

    def steps(
        self, digest: str, nights: int, store: Store | None = None, place: str | None = None
    ) -> list[tuple[int, float, float]] | None:
        """A whole series' answer (``analysis.series_digest``: its values and every setting
        the answer depends on), as a view that searched the same series found it: (index,
        change, p) of each step. The runner's file first, then the history's ``place`` for the
        case (``analysis.series_place``: the latest answer any viewer of the fleet gave it, which
        serves only the series it names); None when neither holds one that a writer of ours
        could have made for ``nights`` nights (then the series is searched, and kept)."""
        found = self._local_steps(digest, nights)
        if found is None and store is not None and place is not None:
            entry = _json_list(store.remembered_blocks([place]).get(place), MAX_ENTRY)
            named = entry[0] if entry is not None and len(entry) == 2 else None
            self._shared_places[place] = named if isinstance(named, str) else None
            if entry is not None and named == digest:
                found = _steps_of(entry[1], nights)
        return found

    def _local_steps(self, digest: str, nights: int) -> list[tuple[int, float, float]] | None:
        db = self._open()
        if db is None:
            return None
        key = SERIES_PREFIX + digest
        try:
            row = db.execute("SELECT found FROM blocks WHERE digest = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            self._skip(exc)
            return None
        found = _parsed_steps(row[0], nights) if row is not None else None
        if found is not None:
            self._used.append(key)
        return found

    def put_steps(
        self, digest: str, steps: Sequence[tuple[int, float, float]], place: str | None = None
    ) -> None:
        """Keeps a searched series' answer in the runner's file, and for the history's ``place``
        (given at ``to_share``, where the history does not already hold this very answer)."""
        self._new_steps[SERIES_PREFIX + digest] = [list(step) for step in steps]
        if place is not None:
            self._new_places[place] = json.dumps([digest, self._new_steps[SERIES_PREFIX + digest]])
            self._answered[place] = digest
        self._open()

    def close(self) -> None:
        """Writes the new entries and the use of the old in one short transaction."""
        if self._db is None:
            return
        now = time.time()
        try:
            if self._new or self._new_steps or self._used:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO blocks VALUES (?, ?, ?)",
                    [(d, json.dumps(f), now) for d, f in [*self._new.items(), *self._new_steps.items()]],
                )
                self._db.executemany(
                    "UPDATE blocks SET used = ? WHERE digest = ?", [(now, d) for d in self._used]
                )
                self._db.execute("DELETE FROM blocks WHERE used < ?", (now - KEEP_DAYS * 86400,))
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._skip(exc)
        finally:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _skip(self, exc: Exception) -> None:
        self.note = f"change-point memo {self.path} skipped ({exc}); every block searched"
        if self._db is not None:
            try:
                self._db.close()
            finally:
                self._db = None


def _json_list(text: object, limit: int) -> list[Any] | None:
    """An entry's JSON list, or None (not text, longer than ``limit`` characters, not a list)."""
    if not isinstance(text, str) or len(text) > limit:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, list) else None


def _parsed_steps(text: object, nights: int) -> list[tuple[int, float, float]] | None:
    """A series' answer as our writers make it (a JSON list of [index, change, p], the indices
    increasing within the series), or None."""
    return _steps_of(_json_list(text, MAX_STEPS_ENTRY), nights)


def _steps_of(found: object, nights: int) -> list[tuple[int, float, float]] | None:
    """``_parsed_steps`` of an entry already read as JSON."""
    if not isinstance(found, list):
        return None
    out: list[tuple[int, float, float]] = []
    for step in found:
        if not (isinstance(step, list) and len(step) == 3 and type(step[0]) is int):
            return None
        index, change, p = step
        if not all(type(v) in (int, float) and math.isfinite(v) for v in (change, p)):
            return None
        if not (0 < index < nights and (not out or index > out[-1][0]) and change > -1 and 0 <= p <= 1):
            return None
        out.append((index, float(change), float(p)))
    return out


def _parsed(text: object) -> list[int] | None:
    """An entry as our writers make it (a JSON list of night indices), or None."""
    found = _json_list(text, MAX_ENTRY)
    if found is None or not all(type(k) is int for k in found):
        return None
    return found


def viewed(
    store: Store,
    settings: ThresholdSettings | None,
    directory: Path,
    hardware_key: str | None = None,
    case_glob: str = "*",
    runner: str | None = None,
    project: str | None = None,
    recent: int = history.RECENT_NIGHTS,
    workers: int | None = None,
) -> tuple[list[history.CaseSeries], list[str]]:
    """``store.view`` and ``history.analyse`` of what it reads, each case searched as soon as it
    is read, beside the reading (``scaleguard.history.analysis``), with both memos: the whole
    blocks ``store`` remembers, the runner's file for the rest. The whole blocks searched here
    are given to ``store`` for every later viewer, where its role may write (never waited for).
    Returns the series and what a reader should know (a memo skipped)."""
    from scaleguard.history.analysis import Search

    memo = ChangePointMemo(directory)
    scope = "" if runner is None and project is None else f"runner={runner}|project={project}"
    # the collector held off over the reading and the search: both make objects by the million
    # and no cycles, and every pass walks what was read (0.8 s of a view of 500,000 runs)
    try:
        with history.collection_paused(), Search(store, memo, settings, workers, scope) as search:
            store.view(hardware_key, case_glob, runner, project, recent, each=search.submit)
            series = search.finish()
    finally:
        memo.close()
    share = memo.to_share()
    if share:
        store.remember_blocks(share)  # a reader's role keeps them in its own file alone
    return series, [memo.note] if memo.note else []


def search_ahead(
    store: Store,
    settings: ThresholdSettings | None,
    directory: Path,
    hardware_key: str | None = None,
    case_id: str | None = None,
) -> int:
    """After a session appended a night: the change points of its hardware key's long series
    searched once, for every viewer (``viewed``: each case's growing block and merge, the
    answers given to the history), so the first view after a night reads them instead of
    searching 50 cases again (0.8-1.2 s of a view of 10,000 nights x 50 cases on the 2-core
    VM); after an import (no key: every series). One appended case (``case_id``) is read first:
    a history of short series, where a view searches little, costs that one read and nothing
    more. Returns how many long series were searched ahead."""
    from scaleguard.history.changepoints import LONG_SERIES

    if case_id is not None and not any(
        len(read.nights) > LONG_SERIES for read in store.view(hardware_key, case_id, recent=0)
    ):
        return 0
    series, _ = viewed(store, settings, directory, hardware_key)
    return sum(len(one.nights) > LONG_SERIES for one in series)
