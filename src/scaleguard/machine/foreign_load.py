"""What the machine did besides the case: CPU time of processes that are not this session's
(the pytest process, its ranks and their DataLoader workers), steal time, load average, and
other processes on the case's GPUs.

Read from ``/proc`` about once a second while the ranks run (the same tick as the GPU readings).
A run measured while foreign processes used more than a limit (default a quarter of a core) is
*disturbed*: quarantined like a throttled GPU run, never evidence of a regression, measured again
once the machine is quiet, and never written into a baseline. A busy machine is not a
regression; until now a package install beside the suite was reported as a *scaling* regression.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_LIMIT_CORES = 0.25
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcSample:
    """One reading of /proc."""

    unix_time: float
    busy_ticks: int  # all CPUs: user+nice+system+irq+softirq (steal apart)
    steal_ticks: int
    cpu_ticks: dict[int, int]  # pid -> utime+stime (threads included)
    names: dict[int, str]
    parents: dict[int, int]
    loadavg_1m: float


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None  # a process that ended between listdir and read


def read_proc(root: Path = Path("/proc")) -> ProcSample | None:
    """One sample; None where /proc does not exist (not Linux)."""
    stat = _read(root / "stat")
    if stat is None:
        return None
    fields = stat.splitlines()[0].split()[1:]
    values = [int(v) for v in fields] + [0] * 10
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    cpu_ticks: dict[int, int] = {}
    names: dict[int, str] = {}
    parents: dict[int, int] = {}
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        text = _read(entry / "stat")
        if text is None or ")" not in text:
            continue
        pid = int(entry.name)
        # the name may hold spaces and parentheses: it ends at the last ")"
        name = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        try:
            parents[pid] = int(rest[1])
            cpu_ticks[pid] = int(rest[11]) + int(rest[12])  # utime, stime
        except (IndexError, ValueError):
            continue
        names[pid] = name
    loadavg = _read(root / "loadavg")
    return ProcSample(
        unix_time=time.time(),
        busy_ticks=user + nice + system + irq + softirq,
        steal_ticks=steal,
        cpu_ticks=cpu_ticks,
        names=names,
        parents=parents,
        loadavg_1m=float(loadavg.split()[0]) if loadavg else 0.0,
    )


def descendants(root_pid: int, parents: dict[int, int]) -> set[int]:
    """``root_pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    own, stack = set(), [root_pid]
    while stack:
        pid = stack.pop()
        if pid in own:
            continue
        own.add(pid)
        stack += children.get(pid, [])
    return own


@dataclass(frozen=True)
class LoadReport:
    """Foreign load during one run's measured steps."""

    foreign_cores: float  # CPU used by processes not of this session, in cores
    steal_cores: float  # CPU the hypervisor gave to other guests, in cores
    loadavg_1m: float
    top: tuple[tuple[int, str, float], ...]  # (pid, name, cores), largest first
    gpu_processes: tuple[tuple[int, str], ...] = ()  # other processes on the case's GPUs
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "foreign_cores": round(self.foreign_cores, 3),
            "steal_cores": round(self.steal_cores, 3),
            "loadavg_1m": self.loadavg_1m,
            "top": [{"pid": p, "name": n, "cores": round(c, 3)} for p, n, c in self.top],
            "gpu_processes": [{"pid": p, "name": n} for p, n in self.gpu_processes],
            "seconds": round(self.seconds, 2),
        }

    def disturbed(self, limit_cores: float) -> str | None:
        """Why the run is no evidence, or None."""
        if self.gpu_processes:
            who = ", ".join(f"pid {p} {n}" for p, n in self.gpu_processes[:3])
            return f"another process used the case's GPU during the run ({who})"
        if self.foreign_cores > limit_cores:
            who = ", ".join(f"pid {p} {n} {c:.2f}" for p, n, c in self.top[:3]) or "short-lived processes"
            return f"another process used {self.foreign_cores:.2f} cores during the run ({who})"
        if self.steal_cores > limit_cores:
            return f"the hypervisor took {self.steal_cores:.2f} cores (steal time) during the run"
        return None


def account(samples: list[ProcSample], own_root: int, window: tuple[float, float]) -> LoadReport | None:
    """Foreign CPU over the sample intervals that overlap ``window`` (unix times).

    Per interval: the total busy time minus this session's processes (pytest and its
    descendants, as present at either end); where one of ours ended inside the interval (its
    last ticks are gone), the sum over foreign processes alone. Steal is reported apart.
    """
    start, end = window
    pairs = [(a, b) for a, b in itertools.pairwise(samples) if b.unix_time >= start and a.unix_time <= end]
    if not pairs:
        return None
    foreign = steal = seconds = 0.0
    per_pid: dict[int, float] = {}
    for a, b in pairs:
        dt = b.unix_time - a.unix_time
        if dt <= 0:
            continue
        own = descendants(own_root, a.parents) | descendants(own_root, b.parents)
        both = a.cpu_ticks.keys() & b.cpu_ticks.keys()
        deltas = {pid: max(0, b.cpu_ticks[pid] - a.cpu_ticks[pid]) for pid in both}
        foreign_pids = {pid: d for pid, d in deltas.items() if pid not in own and d > 0}
        for pid, d in foreign_pids.items():
            per_pid[pid] = per_pid.get(pid, 0.0) + d / _TICKS
        own_gone = any(pid not in b.cpu_ticks for pid in own & a.cpu_ticks.keys())
        total = max(0, b.busy_ticks - a.busy_ticks)
        ours = sum(d for pid, d in deltas.items() if pid in own)
        interval = sum(foreign_pids.values()) if own_gone else max(total - ours, sum(foreign_pids.values()))
        foreign += interval / _TICKS
        steal += max(0, b.steal_ticks - a.steal_ticks) / _TICKS
        seconds += dt
    if seconds <= 0:
        return None
    names = {pid: name for s in samples for pid, name in s.names.items()}
    top = sorted(((pid, names.get(pid, "?"), t / seconds) for pid, t in per_pid.items()), key=lambda x: -x[2])
    return LoadReport(
        foreign_cores=foreign / seconds,
        steal_cores=steal / seconds,
        loadavg_1m=max(s.loadavg_1m for s in samples),
        top=tuple(top[:5]),
        seconds=seconds,
    )


@dataclass
class LoadMonitor:
    """Samples /proc about once a second while a run's ranks run (``tick`` must not block)."""

    own_root: int = field(default_factory=os.getpid)
    period_s: float = 1.0
    root: Path = Path("/proc")
    samples: list[ProcSample] = field(default_factory=list)
    _last: float = float("-inf")

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last < self.period_s:
            return
        self._last = now
        sample = read_proc(self.root)
        if sample is not None:
            self.samples.append(sample)

    def report(self, window: tuple[float, float], gpu_pids: Iterable[int] = ()) -> LoadReport | None:
        """The foreign load over ``window``; ``gpu_pids``: processes NVML saw on the case's GPUs."""
        self.tick()
        report = account(self.samples, self.own_root, window)
        if report is None:
            return None
        # ranks have exited by now: ours is whatever descended from us in any sample; a PID no
        # sample saw lives in another PID namespace and cannot be attributed, so it is left out
        own: set[int] = set()
        names: dict[int, str] = {}
        for sample in self.samples:
            own |= descendants(self.own_root, sample.parents)
            names.update(sample.names)
        others = tuple((pid, names[pid]) for pid in sorted(set(gpu_pids)) if pid in names and pid not in own)
        return LoadReport(**{**report.__dict__, "gpu_processes": others})


def wait_quiet(limit_cores: float, max_wait_s: float, root: Path = Path("/proc")) -> float | None:
    """Wait, in one-second looks, until foreign load is under ``limit_cores`` (bounded by
    ``max_wait_s``); returns the last foreign load seen (None without /proc)."""
    own_root = os.getpid()
    deadline = time.monotonic() + max_wait_s
    load = None
    while True:
        first = read_proc(root)
        time.sleep(1.0)
        second = read_proc(root)
        if first is None or second is None:
            return None
        report = account([first, second], own_root, (first.unix_time, second.unix_time))
        load = report.foreign_cores if report else None
        if load is None or load <= limit_cores or time.monotonic() >= deadline:
            return load
