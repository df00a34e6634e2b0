"""Parent side: spawn one process per rank, wait with a deadline, reap, read per-rank files.

Rendezvous goes through a fresh ``FileStore`` file per case: no port is chosen, so two suites
on one machine cannot race for one, and nothing listens on a network interface.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from scaleguard.case import CaseSpec
from scaleguard.evidence.files import FileFormatError, read_document
from scaleguard.evidence.records import RankFailure, RankPhase, RankResult
from scaleguard.machine import processes
from scaleguard.ranks import faults, worker
from scaleguard.ranks.protocol import CaseFailedError, Interpreter

GRACE_S = 3.0  # between SIGTERM and SIGKILL
ANATOMY_GRACE_S = 30.0  # for peers of a rank lost in the step anatomy to finish or fail


@dataclass(frozen=True)
class _Exit:
    rank: int
    exitcode: int
    seen_at: float


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def reap(procs: list[BaseProcess], grace_s: float = GRACE_S) -> None:
    """SIGTERM, a grace period, SIGKILL to each rank's group (its loader workers too; a stopped
    process ignores SIGTERM), join. A Ctrl-C during the grace period cuts it short; the SIGKILL
    is sent whatever happens."""
    try:
        processes.stop_groups(procs, ((signal.SIGTERM, grace_s),))
    finally:
        _started_ranks.difference_update(procs)


# every rank process started and not yet reaped. multiprocessing joins its live non-daemon
# children at interpreter exit, without a deadline: a rank that something failed to reap
# (an interrupt in the wrong place) would hang the exit of pytest. Reaped first instead.
_started_ranks: set[BaseProcess] = set()


@atexit.register
def _reap_leftover_ranks() -> None:
    reap([p for p in _started_ranks if p.is_alive()], grace_s=0.5)


def _read_failure(run_dir: Path, rank: int) -> RankFailure | None:
    path = Path(worker.RankFiles.in_dir(run_dir, rank).error)
    if not path.exists():
        return None
    try:
        return RankFailure.from_dict(_read_rank_file(path, "rank error"), f"rank error {path}")
    except FileFormatError:
        return None


def _read_status(run_dir: Path, rank: int) -> str:
    try:
        return Path(worker.RankFiles.in_dir(run_dir, rank).status).read_text(encoding="utf-8").strip()
    except OSError:
        return "not started (no status written: still importing torch?)"


# a rank failing with one of these most likely saw a peer die mid-collective: it is a
# consequence, not the cause, whatever the timing says
_PEER_LOST = re.compile(
    r"DistBackendError|DistNetworkError|Connection (closed|reset)|connection.*peer|recvBytes|"
    r"sendBytes|Broken pipe|NCCL (error|communicator)|watchdog|ProcessGroup.*(abort|timeout)",
    re.IGNORECASE,
)


def _root_cause_rank(exits: list[_Exit], failures: dict[int, RankFailure | None]) -> _Exit:
    """The rank that failed first *as a cause*: a rank that died (by signal, or by exiting
    without an error file or a result) before one that raised, and a rank that raised on its
    own before one whose collective lost a peer; within a class, the parent's own observation
    time (rank-written times of a peer's error can precede the parent seeing a death)."""

    def cause_class(e: _Exit) -> int:
        failure = failures[e.rank]
        if failure is None:
            return 0
        if _PEER_LOST.search(f"{failure.exc_type}: {failure.message}"):
            return 2
        return 1

    return min(exits, key=lambda e: (cause_class(e), e.seen_at))


def _explain_exit(spec: CaseSpec, run_dir: Path, exits: list[_Exit]) -> CaseFailedError:
    """One error naming the rank whose failure caused the others'."""
    failures = {e.rank: _read_failure(run_dir, e.rank) for e in exits}
    first = _root_cause_rank(exits, failures)
    failure = failures[first.rank]
    others = [e.rank for e in exits if e.rank != first.rank]
    tail = f"\n(ranks {others} failed after it)" if others else ""
    if first.exitcode < 0:
        return CaseFailedError(
            spec.case_id,
            first.rank,
            f"killed by {_signal_name(first.exitcode)} (the OOM killer sends SIGKILL) while "
            f"'{_read_status(run_dir, first.rank)}'",
            tail.strip(),
        )
    if failure is not None:
        return CaseFailedError(
            spec.case_id,
            first.rank,
            f"{failure.exc_type}: {failure.message} (during '{failure.phase}')",
            failure.traceback + tail,
        )
    if first.exitcode == 0:
        return CaseFailedError(
            spec.case_id,
            first.rank,
            f"missing result for rank {first.rank}: the process exited 0 without writing "
            f"{Path(worker.RankFiles.in_dir(run_dir, first.rank).result).name} (last activity: "
            f"'{_read_status(run_dir, first.rank)}')",
            tail.strip(),
        )
    return CaseFailedError(
        spec.case_id,
        first.rank,
        f"exited with code {first.exitcode} without writing an error file",
        tail.strip(),
    )


@contextlib.contextmanager
def _started_as(interpreter: Interpreter | None) -> Iterator[None]:
    """Spawn children with ``interpreter``: multiprocessing's executable and the environment
    are read when a child starts, so both are set around the starts and restored after."""
    if interpreter is None:
        yield
        return
    from multiprocessing import spawn

    saved_exe = spawn.get_executable()
    saved_prep = spawn.get_preparation_data
    saved_env = {key: os.environ.get(key) for key, _ in interpreter.env}

    def own_paths(name: str) -> dict[str, Any]:
        # spawn hands the child this process's sys.path (and re-imports our __main__): the
        # other interpreter would then import *this* environment's torch. Without them it keeps
        # its own site-packages, which is the point of the other side
        data = saved_prep(name)
        for key in ("sys_path", "init_main_from_name", "init_main_from_path"):
            data.pop(key, None)
        return data

    spawn.set_executable(interpreter.python)
    spawn.get_preparation_data = own_paths  # type: ignore[assignment]
    os.environ.update(dict(interpreter.env))
    try:
        yield
    finally:
        spawn.set_executable(saved_exe)
        spawn.get_preparation_data = saved_prep  # type: ignore[assignment]
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class PoolKey:
    """What a set of rank processes is fixed to: cases that agree on it can share one."""

    device: str
    nprocs: int
    threads_per_rank: int  # torch's inter-op pool is sized once per process
    # one model per pool: what a case leaves resident (oneDNN kernel caches, modules) is then
    # the same model's. Measured on CPU: a transformer case's peak RSS +4-5 % after a resnet18
    # case in its process, +1-2 % after another transformer case (malloc_trim'd both ways)
    model: str
    interpreter: Interpreter | None

    @classmethod
    def of(cls, spec: CaseSpec, interpreter: Interpreter | None) -> PoolKey:
        return cls(spec.device, spec.nprocs, spec.settings.threads_per_rank, spec.model, interpreter)


class RankPool:
    """Rank processes that run cases one after another (``worker.serve``): process start,
    imports and process-group init are paid once, not per case. Each case still builds its
    model, batches, optimizer and settings fresh, and its peak memory is its own.

    A pool never runs one case twice (repeats and confirm runs are independent evidence, so
    they get fresh processes), and any failure, timeout or lost rank ends it: ``close`` reaps
    its processes by group (SIGTERM, grace, SIGKILL), and the next case gets a fresh pool.
    """

    def __init__(self, key: PoolKey, home: Path) -> None:
        self.key = key
        self.served: set[str] = set()  # one run per case: its size is the runs made so far
        home.mkdir(parents=True, exist_ok=True)
        store_path = str((home / "rendezvous.store").resolve())
        ctx = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self.conns: list[multiprocessing.connection.Connection] = []
        try:
            with _started_as(key.interpreter):
                for rank in range(key.nprocs):
                    mine, theirs = ctx.Pipe()
                    member = worker.Membership(rank, key.nprocs, rank, store_path)
                    proc = ctx.Process(
                        target=worker.serve,
                        args=(member, os.getpid(), theirs),
                        name=f"scaleguard-{key.model}-{key.device}-n{key.nprocs}-rank{rank}",
                        daemon=False,
                    )
                    _started_ranks.add(proc)
                    proc.start()
                    theirs.close()  # the child holds its end: EOF here when it dies
                    self.procs.append(proc)
                    self.conns.append(mine)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def can_run(self, spec: CaseSpec, interpreter: Interpreter | None) -> bool:
        return self.alive and spec.case_id not in self.served and PoolKey.of(spec, interpreter) == self.key

    def run(
        self, spec: CaseSpec, run_dir: Path, timeout_s: float, on_tick: Callable[[], None] = lambda: None
    ) -> list[RankResult]:
        """One run of ``spec`` in this pool's processes.

        Raises:
            CaseFailedError: a rank raised, died, hung past ``timeout_s``, or left no result;
                the pool is closed then.
        """
        run_dir.mkdir(parents=True, exist_ok=True)
        job = worker.Job(
            spec=spec,
            files=tuple(worker.RankFiles.in_dir(run_dir, rank) for rank in range(self.key.nprocs)),
            fault=faults.requested(dict(self.key.interpreter.env) if self.key.interpreter else None),
            index=len(self.served),
        )
        self.served.add(spec.case_id)
        try:
            for conn in self.conns:
                conn.send(job)
            lost = _wait(spec, run_dir, self.procs, self.conns, job.index, timeout_s, on_tick)
            results = _collect(spec, run_dir)
        except BaseException:
            self.close()  # also on KeyboardInterrupt: Ctrl-C during a case leaves no rank behind
            raise
        if lost or not self.alive:
            self.close()  # a rank is gone or stuck: the process group is no longer whole
        return [replace(r, anatomy={}, anatomy_lost=lost[r.rank]) if r.rank in lost else r for r in results]

    def close(self) -> None:
        """Ask the ranks to leave, then reap them (SIGTERM, grace, SIGKILL) whatever they do,
        also when interrupted while waiting for them."""
        try:
            for conn in self.conns:
                with contextlib.suppress(OSError, ValueError):
                    conn.send(None)
            deadline = time.monotonic() + GRACE_S
            for proc in self.procs:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            reap(self.procs)
            for conn in self.conns:
                conn.close()
            self.procs, self.conns = [], []


class Pools:
    """The session's rank pool (one at a time: idle ranks of another world size would hold
    memory and a CUDA context each). ``isolate``: every run gets fresh processes."""

    def __init__(self, home: Path, isolate: bool = False) -> None:
        self.home = home
        self.isolate = isolate or not sys.platform.startswith("linux")  # peak RSS resets via procfs
        self._pool: RankPool | None = None
        self._started = 0

    def run(
        self,
        spec: CaseSpec,
        run_dir: Path,
        timeout_s: float,
        on_tick: Callable[[], None] = lambda: None,
        interpreter: Interpreter | None = None,
    ) -> list[RankResult]:
        if self._pool is None or not self._pool.can_run(spec, interpreter):
            self.close()
            self._started += 1
            self._pool = RankPool(PoolKey.of(spec, interpreter), self.home / f"pool{self._started}")
        pool = self._pool
        try:
            return pool.run(spec, run_dir, timeout_s, on_tick)
        finally:
            if self.isolate or not pool.alive:
                self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def run_case(
    spec: CaseSpec,
    run_dir: Path,
    timeout_s: float,
    on_tick: Callable[[], None] = lambda: None,
    interpreter: Interpreter | None = None,
    pools: Pools | None = None,
) -> list[RankResult]:
    """Run one case to completion or failure: in ``pools`` (processes reused across cases),
    or in fresh processes that end with the call. No process outlives the pool that ran it.

    Args:
        interpreter: run the ranks with another Python (None: this one).

    Raises:
        CaseFailedError: a rank raised, died, hung past ``timeout_s``, or left no result.
    """
    if pools is not None:
        return pools.run(spec, run_dir, timeout_s, on_tick, interpreter)
    once = Pools(run_dir / "pool", isolate=True)
    try:
        return once.run(spec, run_dir, timeout_s, on_tick, interpreter)
    finally:
        once.close()


def _wait(
    spec: CaseSpec,
    run_dir: Path,
    procs: list[BaseProcess],
    conns: list[multiprocessing.connection.Connection],
    job_index: int,
    timeout_s: float,
    on_tick: Callable[[], None],
) -> dict[int, str]:
    """Wait until every rank answered the job or exited; raise for a failed case. Returns the
    ranks lost in the step anatomy after their measured result was written (rank -> how),
    which do not fail it."""
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(procs)))
    lost: dict[int, str] = {}
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            hung = sorted(pending)
            if all(_in_anatomy_with_result(run_dir, rank) for rank in hung):
                # stuck in the anatomy (or waiting there on a lost peer in a collective): the
                # measured results are written; the pool is closed, which stops these ranks
                for rank in hung:
                    lost[rank] = f"rank {rank} did not finish the step anatomy in time and was stopped"
                return lost
            activity = "\n".join(f"  rank {rank}: {_read_status(run_dir, rank)}" for rank in hung)
            raise CaseFailedError(
                spec.case_id,
                hung[0] if len(hung) == 1 else None,
                f"no result within --perf-timeout={timeout_s:g}s; ranks {hung} still running "
                f"and were killed. Last known activity:",
                activity,
            )
        waitables: list[Any] = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        ready = multiprocessing.connection.wait(waitables, timeout=min(remaining, 1.0))
        seen_at = time.monotonic()  # the parent's own clock: when it saw each exit
        on_tick()  # e.g. GPU readings while the ranks run; must not block
        for rank in sorted(pending):
            if conns[rank] in ready and _answered(conns[rank], job_index):
                pending.discard(rank)
        exited = [r for r in sorted(pending) if procs[r].sentinel in ready]
        for rank in exited:
            pending.discard(rank)
        observed = [_exit_of(procs, rank, run_dir, seen_at) for rank in exited]
        exits = [e for e in observed if e is not None]
        for gone in [e for e in exits if _in_anatomy_with_result(run_dir, e.rank)]:
            exits.remove(gone)
            how = f"exited with code {gone.exitcode}"
            if gone.exitcode < 0:
                how = f"killed by {_signal_name(gone.exitcode)}"
            lost[gone.rank] = f"rank {gone.rank} {how} during the step anatomy"
            # its peers fail in their next collective and finish within moments
            deadline = min(deadline, time.monotonic() + ANATOMY_GRACE_S)
        if exits:
            # peers of a dead rank fail within moments; let them write so the cause is known
            for proc in procs:
                if proc.is_alive():
                    proc.join(timeout=0.5)
            later = time.monotonic()
            known = {e.rank for e in exits} | set(lost)
            exits += [
                e
                for rank in range(len(procs))
                if rank not in known and not procs[rank].is_alive()
                and (e := _exit_of(procs, rank, run_dir, later)) is not None
            ]  # fmt: skip
            raise _explain_exit(spec, run_dir, exits)
    return lost


def _answered(conn: multiprocessing.connection.Connection, job_index: int) -> bool:
    """The rank finished this job (its result written); False when its pipe closed (it exited)."""
    try:
        return bool(conn.recv() == job_index)
    except (EOFError, OSError):
        return False


def _in_anatomy_with_result(run_dir: Path, rank: int) -> bool:
    """The rank stopped in the step anatomy, its measured steps already written."""
    return (
        _read_status(run_dir, rank).startswith(RankPhase.ANATOMY.value)
        and Path(worker.RankFiles.in_dir(run_dir, rank).result).exists()
    )


def _exit_of(procs: list[BaseProcess], rank: int, run_dir: Path, seen_at: float) -> _Exit | None:
    """The rank's exit as a failure, or None when it exited 0 with its result written."""
    procs[rank].join(timeout=1.0)
    code = procs[rank].exitcode
    code = -1 if code is None else code
    if code == 0 and Path(worker.RankFiles.in_dir(run_dir, rank).result).exists():
        return None
    return _Exit(rank, code, seen_at)


def _collect(spec: CaseSpec, run_dir: Path) -> list[RankResult]:
    results = []
    for rank in range(spec.nprocs):
        path = Path(worker.RankFiles.in_dir(run_dir, rank).result)
        if not path.exists():
            raise CaseFailedError(
                spec.case_id,
                rank,
                f"missing result for rank {rank}: the process exited 0 "
                f"without writing {path.name} (last activity: "
                f"'{_read_status(run_dir, rank)}')",
            )
        try:
            results.append(RankResult.from_dict(_read_rank_file(path, "rank result"), f"rank result {path}"))
        except FileFormatError as exc:
            raise CaseFailedError(spec.case_id, rank, f"unusable result file: {exc}") from None
    return results


def _read_rank_file(path: Path, kind: str) -> dict[str, Any]:
    """Rank files go through the one validating reader, like every file scaleguard reads."""
    return read_document(path, kind, "a rank wrote it: a scaleguard bug, or a rank that was disturbed")
