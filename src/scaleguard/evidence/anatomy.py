"""Step anatomy: where one training step's time goes, and what moved when a case regressed.

The record of it (``Anatomy``) and what a change of it says (``explain``) live here; the rank
side that measures it (the phased and profiled steps) is ``scaleguard.ranks.profiling``.

Measured **after** the measured steps, never inside them: a few extra steps are run phase by
phase with the device synchronised at every boundary (data, forward, backward, optimizer), once
with gradient synchronisation and once without it (DDP's ``no_sync``). The backward time that
only the synchronised steps pay is the **exposed communication**: all-reduce time that overlap
did not hide, rank imbalance included. One more step runs under ``torch.profiler`` for a
compact table of the costliest ops (device time on CUDA, self CPU time on CPU) and a
Chrome-trace file of rank 0 (opens in Perfetto or chrome://tracing). On CUDA that step also
gives the GPU's busy time (all kernels) and the costliest ops by host time: a step that grew
while the GPU's busy time did not grew on the host (launches, Python, hooks, data), and the
story then names the host op that carries it rather than a device op that did not move.

The synchronised phases are slower than a real step (no overlap across phase boundaries), so the
categories explain a step; they do not add up to the measured median. What a REGRESSED story
uses is their change against the baseline's runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scaleguard.evidence.files import MAX_STEP_S, Fields

PHASES = ("data", "forward", "backward", "optimizer")  # the boundaries of one phased step
CATEGORIES = (*PHASES, "exposed communication")
# rows kept per table: deep enough that an op missing from a run's table took little of the
# step (a missing op counts as the table's last row, so a change is never overstated)
TOP_OPS = 24
# the row that holds device time launched outside any op
OUTSIDE_OPS = "kernels outside any op"


@dataclass(frozen=True)
class OpTime:
    name: str
    calls: float  # per step
    ms: float  # per step: device time on CUDA, self CPU time on CPU


@dataclass(frozen=True)
class Anatomy:
    """One run's step anatomy (rank 0's): milliseconds per step by category and the top ops."""

    ms: dict[str, float]  # category -> median ms per step over the anatomy steps
    top_ops: tuple[OpTime, ...]
    op_clock: str  # "device" or "cpu": what the op times are
    steps: int
    cost_s: float  # wall time the anatomy added to the run
    trace: str | None = None  # rank 0's Chrome trace (a path on the machine that ran it)
    grad_bytes: int = 0  # gradients a step all-reduces (unsharded), for the bandwidth bound
    # CUDA only: the profiled step's kernel time in all (ms), and its ops by self host time
    device_busy_ms: float | None = None
    host_ops: tuple[OpTime, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "ms": {k: round(v, 4) for k, v in self.ms.items()},
            "top_ops": [{"name": o.name, "calls": o.calls, "ms": round(o.ms, 4)} for o in self.top_ops],
            "op_clock": self.op_clock,
            "steps": self.steps,
            "cost_s": round(self.cost_s, 3),
            "trace": self.trace,
            "grad_bytes": self.grad_bytes,
            "device_busy_ms": None if self.device_busy_ms is None else round(self.device_busy_ms, 4),
            "host_ops": [{"name": o.name, "calls": o.calls, "ms": round(o.ms, 4)} for o in self.host_ops],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str, fix: str) -> Anatomy:
        f = Fields.of(data, where, fix)
        ms: dict[str, float] = {}
        for key, value in f.raw_dict("ms").items():
            if key not in CATEGORIES:
                raise f.fail("ms", f"has an unknown category {key!r}; known: {', '.join(CATEGORIES)}")
            ms[key] = float(Fields.of({"v": value}, f"{where}.ms", fix).number("v") or 0.0)

        def op_table(key: str, optional: bool = False) -> tuple[OpTime, ...]:
            ops = []
            for index, item in enumerate(f.items(key, optional)[:TOP_OPS]):
                o = Fields.of(item, f"{where}.{key}[{index}]", fix)
                ops.append(
                    OpTime(o.string("name"), float(o.number("calls") or 0.0), float(o.number("ms") or 0.0))
                )
            return tuple(ops)

        busy = f.number("device_busy_ms", 0.0, MAX_STEP_S * 1e3, optional=True)
        top = op_table("top_ops")
        if f.string("op_clock") == "device" and busy is None:
            # written before device-side annotations were left out of the kernel sum: its
            # "kernels outside any op" row was those annotations (24.8 ms of a GPT-2 step's
            # 86 ms in the committed H200 baseline), not kernels
            top = tuple(o for o in top if o.name != OUTSIDE_OPS)
        return cls(
            ms=ms,
            top_ops=top,
            op_clock=f.string("op_clock"),
            steps=int(f.integer("steps", 1, 10_000) or 1),
            cost_s=float(f.number("cost_s") or 0.0),
            trace=f.text("trace", optional=True),
            grad_bytes=int(f.integer("grad_bytes", optional=True) or 0),
            device_busy_ms=None if busy is None else float(busy),
            host_ops=op_table("host_ops", optional=True),
        )


def _median_ms(anatomies: Sequence[Anatomy]) -> dict[str, float]:
    keys = {k for a in anatomies for k in a.ms}
    return {k: statistics.median(a.ms.get(k, 0.0) for a in anatomies) for k in keys}


# a table with at least this many rows was cut: an op missing from it took at most its last row
FULL_TABLE = 8


def _median_ops(anatomies: Sequence[Anatomy], table: str, names: set[str]) -> dict[str, float]:
    tables: list[tuple[OpTime, ...]] = [getattr(a, table) for a in anatomies]

    def missing(t: tuple[OpTime, ...]) -> float:
        # an op missing from a cut table took less than that table's last row: counting it
        # as that row (not 0) means an op that only moved up into the table is not "new"
        return min(o.ms for o in t) if len(t) >= FULL_TABLE else 0.0

    per = [({o.name: o.ms for o in t}, missing(t)) for t in tables]
    return {n: statistics.median(p.get(n, floor) for p, floor in per) for n in names}


# an op is named as a cause only when its change is at least this share of the step's change
MATERIAL_SHARE = 0.25
# the GPU's busy time carrying less than this share of the step's change: a host-side change
HOST_SIDE_SHARE = 0.5


def explain(
    old: Sequence[Anatomy],
    new: Sequence[Anatomy],
    floor_ms: float = 0.05,
    step_change_ms: float | None = None,
) -> str | None:
    """What moved between the baseline's anatomies and this session's, said with what is
    material, e.g. ``slower: backward +1.41 ms/step (30.23 -> 31.63), optimizer +0.53 ms/step;
    phases explain 1.9 of 2.7 ms; no single op stands out (largest: aten::mm +0.07 ms/step, 3 %
    of the change)``. None when either side has no anatomy. On CUDA it says the GPU's busy time
    too; when that carries less than half the change, the change is on the host and the op named
    is the one whose host time grew (``top host op``).

    Args:
        step_change_ms: how much the measured step moved; the phases' and ops' changes are
            weighed against it (an op is named only when it carries >= 25 % of it).
    """
    if not old or not new:
        return None
    before, after = _median_ms(old), _median_ms(new)
    moved = sorted(
        ((k, after.get(k, 0.0) - before.get(k, 0.0)) for k in CATEGORIES if k in before or k in after),
        key=lambda kv: -kv[1],
    )
    grew = [(k, d) for k, d in moved if d > floor_ms]
    if not grew:
        return "step anatomy: no category grew by more than 0.05 ms/step"
    # the categories that carry the change: the largest, and others at least a third of it
    named = [(k, d) for k, d in grew if d >= grew[0][1] / 3][:3]
    parts = [f"{k} +{d:.2f} ms/step ({before.get(k, 0.0):.2f} -> {after.get(k, 0.0):.2f})" for k, d in named]
    text = "slower: " + ", ".join(parts)
    change = step_change_ms if step_change_ms is not None and step_change_ms > 0 else None
    if change is not None:
        # phases are measured drained at every boundary: their sum is not the step, their net
        # change is what compares with the step's change (the synchronised backward already
        # holds the exposed communication: not added twice)
        explained = sum(d for k, d in moved if k in PHASES)
        text += f"; phases explain {explained:.1f} of {change:.1f} ms"
    reference = change if change is not None else sum(d for _, d in grew)
    table, label = "top_ops", "top op"
    busy_old = [a.device_busy_ms for a in old if a.device_busy_ms is not None]
    busy_new = [a.device_busy_ms for a in new if a.device_busy_ms is not None]
    if busy_old and busy_new:
        b0, b1 = statistics.median(busy_old), statistics.median(busy_new)
        text += f"; GPU busy {b0:.1f} -> {b1:.1f} ms/step"
        if b1 - b0 < HOST_SIDE_SHARE * reference:
            # the step grew, the kernels did not: the time went to the host (a launch-bound
            # step shows it, a device-bound one hides it behind its queue). Device ops cannot
            # say which part of the host: their host-time table can
            text += " (the rest of the change is on the host: launches, Python, hooks, data)"
            if all(a.host_ops for a in (*old, *new)):
                table, label = "host_ops", "top host op"
    if old[0].op_clock == new[0].op_clock:
        listed_before = {o.name for a in old for o in getattr(a, table)}
        names = listed_before | {o.name for a in new for o in getattr(a, table)}
        ops_before, ops_after = _median_ops(old, table, names), _median_ops(new, table, names)
        deltas = sorted(((n, ops_after[n] - ops_before[n]) for n in names), key=lambda kv: -kv[1])
        if deltas and deltas[0][1] > floor_ms:
            name, delta = deltas[0]
            base = ops_before[name]
            if name not in listed_before:
                rel = (
                    " (new in the top ops)"
                    if base == 0
                    else " or more (below the last row of the baseline's op tables)"
                )
            else:
                rel = f" ({delta / base:+.0%})" if base > 0 else " (new in the top ops)"
            if delta >= MATERIAL_SHARE * reference:
                text += f"; {label}: {name} +{delta:.2f} ms/step{rel}"
            else:
                text += (
                    f"; no single op stands out (largest: {name} +{delta:.2f} ms/step, "
                    f"{delta / reference:.0%} of the change)"
                )
        else:
            text += "; no single op stands out"
    return text


def summary(anatomy: Anatomy) -> str:
    """One line: ms per step by category, e.g. ``forward 5.20, backward 9.81, ...``."""
    return ", ".join(f"{k} {anatomy.ms[k]:.2f}" for k in CATEGORIES if k in anatomy.ms) + " ms/step"
