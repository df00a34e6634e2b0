"""A view's change points searched beside its reading: worker processes search the long series
the reader has already handed over while it reads the next ones.

A view of years of nights spends its time in two places of about equal size: reading the
series (one core: the database driver makes a Python object of every value) and searching them
(``changepoints.detect``: a block search and a merge per case; 10,000 nights x 50 cases, 2.1 s of
reading and 2.5 s of searching on the 2-core VM, docs/measured.md). Done one after the other
they add up; here a case is searched while the next is read. Workers (spawned: nothing of the
reader's connections, locks or threads is inherited) take a long series' values and the memo
entries its blocks already have (a file in the reader's private temporary directory; the pipe
carries small messages alone, so no send can wait on a worker that stopped reading), search
it, and send back the steps and the blocks they had to search; the reader keeps the memo, the
history and every decision. Once everything is read the reader searches what is still waiting
itself, beside them.

Only the search moves: the answer is ``history.analyse``'s, step for step (a test compares
them). A short series is searched where it is read (its search costs less than sending it). A
worker that dies or holds one case past ``TASK_DEADLINE_S`` is stopped and its cases searched
by the reader: a view never waits without a deadline, never leaves a process behind (a worker
dies with its reader: its pipe's end, and PR_SET_PDEATHSIG), and never depends on the workers
for its answer.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from scaleguard.evidence.verdict import ThresholdSettings
from scaleguard.history import database as history

if TYPE_CHECKING:
    from scaleguard.history.store import Store


class ViewMemo(Protocol):
    """What a view's search needs of ``memo.ChangePointMemo``: a case's hits and new entries,
    and whole series' answers."""

    def lookup(self, store: Store, values: Sequence[float]) -> dict[str, list[int]]: ...

    def put(self, digest: str, found: list[int]) -> None: ...

    def steps(
        self, digest: str, nights: int, store: Store | None = None, place: str | None = None
    ) -> list[tuple[int, float, float]] | None: ...

    def put_steps(
        self, digest: str, steps: Sequence[tuple[int, float, float]], place: str | None = None
    ) -> None: ...


HEAVY_NIGHTS = 1024  # a series this long is worth a worker (its search ~30 ms on the 2-core VM)
MAX_WORKERS = 4  # the search of 50 long series is ~2.5 s of one core: more would not pay their start
DEPTH = 2  # cases a worker holds at once: it never waits for the reader between two of them
TASK_DEADLINE_S = 120.0  # one case's search (10,000 nights: under 0.1 s); past this the worker is stopped
START_AT = 2  # long series read before workers are started (one long case: searched in place)

Found = tuple[list[tuple[int, float, float]], dict[str, list[int]]]  # (steps, blocks searched)


def _search_head(min_magnitude: float) -> bytes:
    """Every setting and tunable a series' answer depends on besides its values (with
    ``changepoints.ANSWER_VERSION``)."""
    from scaleguard.history import changepoints as cp

    tunables = (
        cp.ANSWER_VERSION, cp.BLOCK_VERSION, cp.LONG_SERIES, cp.BLOCK, cp.BLOCK_OVERLAP, cp.CANDIDATE_P,
        cp.SEARCH_EXPONENT, cp.REFINE_NIGHTS, cp.OUTLIER_MADS, cp.COARSE_BLOCKS, history.CHANGE_MAX_P,
        history.CHANGE_MIN_SIZE, min_magnitude,
    )  # fmt: skip
    return "|".join(map(repr, tunables)).encode()


def series_digest(values: np.ndarray, min_magnitude: float) -> str:
    """What a series' change points depend on: its values, its smallest change and the search
    (its settings, its tunables and ``changepoints.ANSWER_VERSION``): a view that changes
    nothing (no night since the last one) takes every long case's answer from the memo."""
    return hashlib.sha256(_search_head(min_magnitude) + values.tobytes()).hexdigest()


def series_place(hardware_key: str, case_id: str, min_magnitude: float, scope: str = "") -> str:
    """Where the history keeps a case's latest answer for every viewer (``memo``): one place a
    case, setting and view's narrowing (``scope``: its runner and project), the answer's
    ``series_digest`` inside the entry, so the history holds one answer a case, never one a
    night, and a runner narrowed view does not take the whole fleet's place."""
    text = "|".join(("series", hardware_key, case_id, scope)).encode()
    return hashlib.sha256(_search_head(min_magnitude) + b"|" + text).hexdigest()


def search(values: Sequence[float] | np.ndarray, min_magnitude: float, hits: dict[str, list[int]]) -> Found:
    """One case's change points as ``history.change_points`` finds them, with the memo entries
    ``hits`` (digest -> candidates): (index, change, p) of each step, and the blocks searched."""
    memo = _Hits(hits)
    points = history.change_points(values, min_magnitude=min_magnitude, memo=memo)
    return [(p.index, p.change, p.p_value) for p in points], memo.new


class _Hits:
    """``changepoints.Memo`` over the entries the reader looked up, recording what is new."""

    def __init__(self, hits: dict[str, list[int]]) -> None:
        self.hits = hits
        self.new: dict[str, list[int]] = {}

    def get(self, digest: str) -> list[int] | None:
        return self.new.get(digest, self.hits.get(digest))

    def put(self, digest: str, found: list[int]) -> None:
        self.new[digest] = list(found)


def _serve(conn: Connection) -> None:
    """A worker: (index, task file) in, (index, found or None) out, until the
    reader closes its end or sends None. A task file holds the case's values (float64 bytes),
    its smallest change and its memo hits: through the pipe go small messages alone, so a
    reader's send never waits on a worker that stopped reading."""
    import pickle
    import signal

    from scipy.special import stdtr  # noqa: F401 -- the search's, imported while the reader reads

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle: it stops us
    try:  # die with the reader: a reader killed outright leaves no worker
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, path = task
        try:
            with open(path, "rb") as handle:  # the reader's own file, in its own private directory
                raw, magnitude, hits = pickle.load(handle)
            found: Found | None = search(np.frombuffer(raw, dtype=np.float64), magnitude, hits)
        except Exception:  # noqa: BLE001 -- the reader searches it again, where it is raised and said
            found = None
        try:
            conn.send((index, found))
        except (OSError, ValueError):
            return


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(theirs,), daemon=True, name="scaleguard-history-search")
        self.proc.start()
        theirs.close()
        self.held: dict[int, float] = {}  # index -> when it was sent

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


def worker_count() -> int:
    """Workers beside the reader: one less than the cores this process may use (the reader
    reads on one), at most ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(0, min(MAX_WORKERS, cores - 1))


class Search:
    """The change points of a view's cases, handed over one by one as they are read (``submit``,
    a view's ``each``), with ``workers`` processes beside the reader (None: ``worker_count``);
    ``finish`` returns ``history.analyse``'s answer."""

    def __init__(
        self,
        store: Store,
        memo: ViewMemo,
        settings: ThresholdSettings | None,
        workers: int | None = None,
        scope: str = "",
    ) -> None:
        self.store = store
        self.scope = scope  # the view's narrowing (runner, project): part of each answer's place
        self.memo = memo
        self.settings = settings
        self.workers_wanted = worker_count() if workers is None else workers
        self.workers: list[_Worker] = []
        self.reads: list[history.CaseRead] = []
        self.found: dict[int, list[tuple[int, float, float]]] = {}
        self.tasks: dict[int, tuple[float, dict[str, list[int]]]] = {}  # (smallest change, memo hits)
        self.digests: dict[int, str] = {}  # each long series' ``series_digest``: its answer kept
        self.places: dict[int, str] = {}  # each long series' ``series_place`` in the history
        self.arrays: dict[int, np.ndarray] = {}  # each long series' values, made once
        self.pending: list[int] = []  # for whoever is free first
        self.mine: list[int] = []  # a retired worker's: the reader searches them
        self.heavy = 0
        self.directory: str | None = None  # the task files, removed at close

    def __enter__(self) -> Search:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        import shutil

        workers, self.workers = self.workers, []
        for worker in workers:
            worker.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def submit(self, read: history.CaseRead) -> None:
        index = len(self.reads)
        self.reads.append(read)
        magnitude = history.case_magnitude(read, self.settings)
        values = history.columns_of(read.nights)[1]
        if len(values) >= HEAVY_NIGHTS:  # a long series viewed before, unchanged: its answer
            self.arrays[index] = np.asarray(values, dtype=np.float64)
            digest = self.digests[index] = series_digest(self.arrays[index], magnitude)
            place = self.places[index] = series_place(read.hardware_key, read.case_id, magnitude, self.scope)
            kept = self.memo.steps(digest, len(values), self.store, place)
            if kept is not None:
                self.found[index] = kept
                return
        self.tasks[index] = (magnitude, self.memo.lookup(self.store, values))
        if len(values) < HEAVY_NIGHTS or self.workers_wanted == 0:
            self._here(index)
            return
        self.heavy += 1
        self.pending.append(index)
        if not self.workers and self.heavy >= START_AT:
            self._start()
        if self.workers:
            self._pump(0.0)

    def finish(self) -> list[history.CaseSeries]:
        """Every case searched (the reader takes its share, then waits for the workers' last,
        each with its deadline), in ``history.analyse``'s order and shape."""
        while self.pending or self.mine or any(w.held for w in self.workers):
            if self.workers:
                self._pump(0.0)
            if self.mine:
                self._here(self.mine.pop())
            elif self.pending:
                self._here(self.pending.pop())  # the last read: the workers take the first
            else:
                self._pump(0.05)
        self.close()
        out = []
        for i, read in sorted(enumerate(self.reads), key=lambda kv: (kv[1].hardware_key, kv[1].case_id)):
            points = [history.ChangePoint(*step) for step in self.found[i]]
            out.append(history.case_series(read, history.with_nights(read.nights, points)))
        return out

    def _here(self, index: int) -> None:
        magnitude, hits = self.tasks[index]
        self._apply(index, search(history.columns_of(self.reads[index].nights)[1], magnitude, hits))

    def _apply(self, index: int, found: Found) -> None:
        steps, new = found
        self.found[index] = steps
        for digest, candidates in new.items():
            self.memo.put(digest, candidates)
        if index in self.digests:
            self.memo.put_steps(self.digests[index], steps, self.places[index])

    def _start(self) -> None:
        from scaleguard.machine.processes import spawning_without_main

        ctx = multiprocessing.get_context("spawn")
        try:
            with spawning_without_main():
                for _ in range(self.workers_wanted):
                    self.workers.append(_Worker(ctx))
        except OSError:  # no process to be had: the reader searches everything itself
            self.close()
            self.workers_wanted = 0

    def _pump(self, wait_s: float) -> None:
        """Results taken; a dead or stuck worker retired (its cases the reader's); free workers
        given cases. Waits up to ``wait_s`` for a result."""
        from multiprocessing.connection import wait

        busy = [w.conn for w in self.workers if w.held]
        ready = set(wait(busy, timeout=wait_s)) if wait_s and busy else set()
        for worker in list(self.workers):
            gone = False
            while worker.held and (worker.conn in ready or worker.conn.poll(0)):
                ready.discard(worker.conn)
                try:
                    index, found = worker.conn.recv()
                except (EOFError, OSError):
                    gone = True  # its end closed: dead, whatever its process says yet
                    break
                if worker.held.pop(index, None) is None:
                    continue
                if found is None:
                    self.mine.append(index)  # searched here, where its error is raised as it would be
                else:
                    self._apply(index, found)
            now = time.monotonic()
            stuck = any(now - sent > TASK_DEADLINE_S for sent in worker.held.values())
            if worker.held and (gone or stuck or not worker.proc.is_alive()):  # results drained above
                self._retire(worker)
        for worker in list(self.workers):
            while self.pending and len(worker.held) < DEPTH:
                index = self.pending.pop(0)
                worker.held[index] = time.monotonic()
                try:
                    worker.conn.send((index, self._task_file(index)))
                except (OSError, ValueError):  # gone: this case and what it held are the reader's
                    self._retire(worker)
                    break

    def _task_file(self, index: int) -> str:
        import pickle
        import tempfile

        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="scaleguard-history-search-")
        magnitude, hits = self.tasks[index]
        path = os.path.join(self.directory, f"case{index}.pickle")
        task = (self.arrays[index].tobytes(), magnitude, hits)
        with open(path, "wb") as handle:
            pickle.dump(task, handle, protocol=pickle.HIGHEST_PROTOCOL)
        return path

    def _retire(self, worker: _Worker) -> None:
        """A worker that died or held a case past its deadline: stopped; its cases the reader's."""
        self.workers.remove(worker)
        self.mine.extend(worker.held)
        worker.held.clear()
        worker.stop()
