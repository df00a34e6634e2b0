"""The change-point memo: a long series' block candidates kept between views
(``changepoints.Memo``), in a small SQLite file of the runner's own (``.scaleguard/`` beside the
spool), whichever engine holds the history.

Content-addressed: an entry's key is the digest of the block's values and of every setting its
candidates depend on, so the memo can only save work, never change an answer; one memo serves
every history, and a history moved, merged or edited finds what still applies. It is a cache and
nothing more: a memo that cannot be opened, read or written (a read-only directory, a corrupt or
foreign file, a lock held past a short deadline) is skipped with one note, and the view computes
what it needs. Entries unused for ``KEEP_DAYS`` go at the next write.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from pathlib import Path

NAME = "changepoint-memo.sqlite"
KEEP_DAYS = 90
LOCK_S = 2.0  # a memo is never worth waiting for: another view holding it means compute
MAX_ENTRY = 4096  # characters of one entry: a block of 576 nights has at most ~190 candidates
_SCHEMA = 1


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

    def get(self, digest: str) -> list[int] | None:
        if digest in self._new:
            return self._new[digest]
        db = self._open()
        if db is None:
            return None
        try:
            row = db.execute("SELECT found FROM blocks WHERE digest = ?", (digest,)).fetchone()
        except sqlite3.Error as exc:
            self._skip(exc)
            return None
        if row is None or not isinstance(row[0], str) or len(row[0]) > MAX_ENTRY:
            return None
        try:
            found = json.loads(row[0])
        except ValueError:
            return None
        if not isinstance(found, list) or not all(type(k) is int for k in found):
            return None  # an entry no writer of ours made: searched again (and overwritten)
        self._used.append(digest)
        return found

    def put(self, digest: str, found: list[int]) -> None:
        self._new[digest] = list(found)
        self._open()

    def close(self) -> None:
        """Writes the new entries and the use of the old in one short transaction."""
        if self._db is None:
            return
        now = time.time()
        try:
            if self._new or self._used:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO blocks VALUES (?, ?, ?)",
                    [(d, json.dumps(f), now) for d, f in self._new.items()],
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
