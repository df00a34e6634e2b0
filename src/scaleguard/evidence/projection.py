"""What a DDP (or FSDP2) case at world size N should do, projected from the same session's
world-size-1 run. FSDP2's units, their gathers and scatters: ``fsdp_exposed_ms``, ``_fsdp_paid``.

The inputs (``ScalingInputs``, measured in every DDP run by ``ranks.overlap``):
- from world size 1: the per-rank compute phase by phase (data, forward, backward, optimizer) and
  when each parameter's gradient becomes ready within the backward;
- from world size N: DDP's buckets as it rebuilt them (bytes and parameters, in reduction order)
  and each bucket's all-reduce timed alone at this world size.

The model (as dPRO, Daydream and Echo do from profiles, reduced to DDP's one overlap):
- per-rank compute at N is world size 1's phases scaled by the per-rank batch (data, forward and
  backward with the batch; the optimizer not), anchored to world size 1's measured step;
- a bucket can start once its last gradient is ready and the bucket before it is done (DDP
  reduces in order, one at a time); its all-reduce takes what the probe measured;
- the step is the compute plus whatever all-reduce outlasts the backward (exposed), so the
  efficiency is world size 1's rate over N x the projected rate.
What it leaves out, by design: compute slowing while communication overlaps it (cores or memory
bandwidth shared with the collective: measured in docs/measured.md), stragglers, the data
loader's contention. The gap between projection and measurement is that remainder.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scaleguard.evidence.files import Fields

MAX_PARAMS = 1_000_000  # parameters of one model: bounds what a stored record may hold
PHASE_NAMES = ("data", "forward", "backward", "optimizer")
BATCH_PHASES = ("data", "forward", "backward")  # grow with the per-rank batch; the optimizer does not


def _index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_PARAMS


@dataclass(frozen=True)
class ScalingInputs:
    """One run's measured inputs of the projection (rank 0's; schema 5 of the run record)."""

    phase_ms: dict[str, float]  # compute only (gradient all-reduce skipped), median of a few steps
    # world size 1 of strong scaling: the same at the smaller per-rank batches of larger worlds
    phase_ms_at: dict[int, dict[str, float]] = field(default_factory=dict)
    ready: tuple[float, ...] = ()  # each parameter's gradient ready, fraction of the backward
    buckets: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (bytes, parameter indices), in order
    bucket_s: tuple[float, ...] = ()  # each bucket's all-reduce alone, slowest rank, seconds
    rank_compute_ms: tuple[float, ...] = ()  # every rank's compute-only step (a straggler shows)
    # FSDP2: its units in forward order, (bytes gathered, times a step gathers them), and each
    # unit's all-gather and reduce-scatter alone at this world size, slowest rank, seconds
    units: tuple[tuple[int, int], ...] = ()
    gather_s: tuple[float, ...] = ()
    scatter_s: tuple[float, ...] = ()

    @property
    def has_comm(self) -> bool:
        """Measured at world size > 1: the collectives a projection needs."""
        return bool(self.buckets or self.units)

    def comm_layout(self) -> tuple[int, ...]:
        """What must match for two runs' collectives to be compared one by one."""
        if self.units:
            return tuple(size for size, _ in self.units)
        return tuple(size for size, _ in self.buckets)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase_ms": dict(self.phase_ms), "ready": list(self.ready)}
        if self.phase_ms_at:
            out["phase_ms_at"] = {str(b): dict(ms) for b, ms in self.phase_ms_at.items()}
        if self.rank_compute_ms:
            out["rank_compute_ms"] = list(self.rank_compute_ms)
        if self.buckets:
            out["buckets"] = [[size, list(params)] for size, params in self.buckets]
            out["bucket_s"] = list(self.bucket_s)
        if self.units:
            out["units"] = [list(unit) for unit in self.units]
            out["gather_s"], out["scatter_s"] = list(self.gather_s), list(self.scatter_s)
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str, fix: str) -> ScalingInputs:
        f = Fields.of(data, where, fix)
        phase_ms = f.floats("phase_ms", 0.0, 1e9)
        if set(phase_ms) != set(PHASE_NAMES):
            raise f.fail("phase_ms", f"must hold exactly {', '.join(PHASE_NAMES)}")
        phase_ms_at = {}
        for batch, ms in list(f.raw_dict("phase_ms_at", optional=True).items())[:64]:
            inner = Fields.of({"ms": ms}, f"{where}.phase_ms_at", fix).floats("ms", 0.0, 1e9)
            size = int(batch) if batch.isascii() and batch.isdigit() and len(batch) <= 9 else 0
            if size <= 0 or set(inner) != set(PHASE_NAMES):
                raise f.fail("phase_ms_at", f"entry {batch[:20]!r} must be a batch size and its phases")
            phase_ms_at[size] = inner
        ready = f.items("ready", optional=True)
        if len(ready) > MAX_PARAMS or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0 for x in ready
        ):
            raise f.fail("ready", "must be a list of fractions in [0, 1]")
        raw = f.items("buckets", optional=True)
        seconds = f.items("bucket_s", optional=True)
        buckets = []
        for index, item in enumerate(raw[:MAX_PARAMS]):
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not isinstance(item[0], int)
                or isinstance(item[0], bool)
                or not 0 <= item[0] < 2**50
                or not isinstance(item[1], list)
                or not all(_index(i) for i in item[1])
            ):
                raise f.fail("buckets", f"entry {index} must be [bytes, [parameter indices]]")
            buckets.append((item[0], tuple(item[1])))
        if len(seconds) != len(buckets) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and 0.0 <= s < 1e6 for s in seconds
        ):
            raise f.fail("bucket_s", "must hold one non-negative time per bucket")
        units = []
        for index, item in enumerate(f.items("units", optional=True)[:MAX_PARAMS]):
            if (
                not isinstance(item, list)
                or len(item) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
                or not 0 < item[0] < 2**50
                or item[1] not in (1, 2)
            ):
                raise f.fail("units", f"entry {index} must be [bytes, times gathered (1 or 2)]")
            units.append((item[0], item[1]))
        timed = {name: f.items(name, optional=True) for name in ("gather_s", "scatter_s")}
        for name, values in timed.items():
            if len(values) != len(units) or not all(
                isinstance(s, (int, float)) and not isinstance(s, bool) and 0.0 <= s < 1e6 for s in values
            ):
                raise f.fail(name, "must hold one non-negative time per unit")
        ranks = f.items("rank_compute_ms", optional=True)
        if len(ranks) > MAX_PARAMS or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x < 1e9 for x in ranks
        ):
            raise f.fail("rank_compute_ms", "must be a list of non-negative milliseconds")
        return cls(
            phase_ms=phase_ms,
            phase_ms_at=phase_ms_at,
            rank_compute_ms=tuple(float(x) for x in ranks),
            ready=tuple(float(x) for x in ready),
            buckets=tuple(buckets),
            bucket_s=tuple(float(s) for s in seconds),
            units=tuple(units),
            gather_s=tuple(float(s) for s in timed["gather_s"]),
            scatter_s=tuple(float(s) for s in timed["scatter_s"]),
        )


@dataclass(frozen=True)
class Projection:
    """A DDP case's projected step and efficiency at its world size, with the parts."""

    world_size: int
    step_ms: float  # projected step
    efficiency: float  # projected scaling efficiency
    compute_ms: float  # per-rank compute, world size 1's scaled to this per-rank batch
    backward_ms: float  # of which the backward, under which the all-reduce may hide
    comm_ms: float  # every bucket's all-reduce, back to back
    exposed_ms: float  # what of it outlasts the backward
    buckets: int
    ws1_step_ms: float
    overlap: bool = True  # the all-reduce may hide under the backward (False: gloo on CPU)
    offset_ms: float = 0.0  # ws1's step beyond its compute-only phases (DDP's own work per step)
    jitter: float = 1.0  # the slowest of N ranks over one rank's median (ws1's step spread)
    mode: str = "ddp"  # "fsdp": FSDP2's all-gathers and reduce-scatters per unit
    paid: bool = False  # FSDP: the collectives as it pays them (a small step at N less ws1's)

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "step_ms": round(self.step_ms, 4),
            "efficiency": round(self.efficiency, 4),
            "compute_ms": round(self.compute_ms, 4),
            "backward_ms": round(self.backward_ms, 4),
            "comm_ms": round(self.comm_ms, 4),
            "exposed_ms": round(self.exposed_ms, 4),
            "buckets": self.buckets,
            "ws1_step_ms": round(self.ws1_step_ms, 4),
            "overlap": self.overlap,
            "offset_ms": round(self.offset_ms, 4),
            "jitter": round(self.jitter, 4),
            "mode": self.mode,
            "paid": self.paid,
        }

    def describe(self, measured: float | None) -> str:
        said = f"; measured {measured:.2f}" if measured is not None else ""
        plural = "s" if self.buckets != 1 else ""
        what = (
            f"all-gathers and reduce-scatters of {self.buckets} FSDP unit{plural}"
            if self.mode == "fsdp"
            else f"all-reduce of {self.buckets} bucket{plural}"
        )
        how = (
            f"{self.comm_ms:.1f} ms as FSDP pays them (a small step at ws{self.world_size} less ws1's)"
            if self.paid
            else f"{self.comm_ms:.1f} ms alone"
        )
        return (
            f"ws{self.world_size} projected efficiency {self.efficiency:.2f}{said} (from ws1: compute "
            f"{self.compute_ms:.1f} ms/step, backward {self.backward_ms:.1f}; {what} {how}, "
            f"{self.exposed_ms:.1f} ms of it projected exposed"
            f"{'' if self.overlap else ': gloo on CPU shares the cores, no overlap'})"
        )


def exposed_ms(backward_ms: float, ready: Sequence[float], seconds: Sequence[float], overlap: bool) -> float:
    """DDP's overlap: bucket k starts when its last gradient is ready (``ready[k]``, a fraction
    of the backward) and bucket k-1 is done; what runs past the backward's end is exposed.
    Without ``overlap`` (gloo on CPU: the collective's threads share the rank's cores with the
    backward) every bucket's all-reduce adds to the step."""
    if not overlap:
        return sum(seconds) * 1e3
    end = 0.0
    for fraction, s in zip(ready, seconds, strict=True):
        end = max(end, fraction * backward_ms) + s * 1e3
    return max(0.0, end - backward_ms)


def fsdp_exposed_ms(
    forward_ms: float,
    backward_ms: float,
    units: Sequence[tuple[int, int]],
    gather_s: Sequence[float],
    scatter_s: Sequence[float],
    overlap: bool,
) -> float:
    """FSDP2's collectives beyond the compute. Without ``overlap`` (gloo on CPU) every unit's
    all-gathers (two for a resharded unit: forward and backward; one for the root) and its
    reduce-scatter add to the step. With it, one channel runs them in the order FSDP2 issues
    them: the forward's all-gathers back to back (each unit computes once its parameters are in
    and the unit before it is done), then in backward each unit's all-gather prefetched when the
    unit after it starts its backward, and its reduce-scatter once its backward is done. A
    unit's share of the forward and backward is its share of the bytes (the model has no
    per-unit timing: a unit heavy in compute and light in parameters, or the reverse, moves it)."""
    if not overlap:
        return sum(g * a + r for (_, g), a, r in zip(units, gather_s, scatter_s, strict=True)) * 1e3
    total = max(1, sum(size for size, _ in units))
    share = [size / total for size, _ in units]
    ag = [a * 1e3 for a in gather_s]
    rs = [r * 1e3 for r in scatter_s]
    channel = compute = 0.0
    for i in range(len(units)):  # forward: gathers back to back from the step's start
        channel += ag[i]
        compute = max(compute, channel) + share[i] * forward_ms
    order = list(reversed(range(len(units))))

    def run(issued: float, ms: float) -> float:
        nonlocal channel
        channel = max(channel, issued) + ms
        return channel

    ready = {order[0]: run(compute, ag[order[0]]) if units[order[0]][1] == 2 else compute}
    for k, i in enumerate(order):
        start = max(compute, ready[i])
        if k + 1 < len(order):  # the next unit's all-gather, prefetched as this one starts
            nxt = order[k + 1]
            ready[nxt] = run(start, ag[nxt]) if units[nxt][1] == 2 else start
        compute = start + share[i] * backward_ms
        run(compute, rs[i])
    return max(0.0, max(compute, channel) - forward_ms - backward_ms)


@dataclass(frozen=True)
class Comm:
    """One step's collectives as measured alone, the medians of several runs: DDP's buckets
    (each all-reduce and when its last gradient is ready) or FSDP2's units."""

    mode: str  # "ddp" or "fsdp"
    seconds: tuple[float, ...]  # DDP: each bucket's all-reduce; FSDP: each unit's all-gather
    fractions: tuple[float, ...] = ()  # DDP: each bucket's last gradient ready, of the backward
    units: tuple[tuple[int, int], ...] = ()  # FSDP: (bytes, times gathered) per unit
    scatter: tuple[float, ...] = ()  # FSDP: each unit's reduce-scatter

    @classmethod
    def of(cls, inputs: Sequence[ScalingInputs], ready: Sequence[float] | None = None) -> Comm:
        first = inputs[0]
        if first.units:
            return cls(
                "fsdp", _medians([s.gather_s for s in inputs]), units=first.units,
                scatter=_medians([s.scatter_s for s in inputs]),
            )  # fmt: skip
        ready = _median_ready(inputs) if ready is None else ready
        fractions = tuple(
            max((ready[i] for i in params if i < len(ready)), default=1.0) for _, params in first.buckets
        )
        return cls("ddp", _medians([s.bucket_s for s in inputs]), fractions=fractions)

    @property
    def collective(self) -> str:
        return "all-gather/reduce-scatter" if self.mode == "fsdp" else "all-reduce"

    @property
    def count(self) -> int:
        return len(self.units) if self.mode == "fsdp" else len(self.seconds)

    @property
    def alone_ms(self) -> float:
        """Every collective of a step back to back."""
        if self.mode == "fsdp":
            return (
                sum(g * a + r for (_, g), a, r in zip(self.units, self.seconds, self.scatter, strict=True))
                * 1e3
            )
        return sum(self.seconds) * 1e3

    def exposed_ms(self, forward_ms: float, backward_ms: float, overlap: bool) -> float:
        if self.mode == "fsdp":
            return fsdp_exposed_ms(forward_ms, backward_ms, self.units, self.seconds, self.scatter, overlap)
        return exposed_ms(backward_ms, self.fractions, self.seconds, overlap)

    def with_costs_of(self, other: Comm) -> Comm:
        """This layout and overlap with ``other``'s measured cost (the counterfactual's swap)."""
        return replace(self, seconds=other.seconds, scatter=other.scatter)


def _medians(columns: Sequence[Sequence[float]]) -> tuple[float, ...]:
    return tuple(statistics.median(col) for col in zip(*columns, strict=True))


def expected_max(samples: Sequence[float], n: int) -> float:
    """E[max of ``n`` independent draws] from the empirical distribution of ``samples``, over
    its median: a step that waits for every rank takes the slowest rank's time, so N ranks
    that each jitter as world size 1 does lose this factor (order statistics, exact)."""
    ordered = sorted(samples)
    m = len(ordered)
    if m == 0 or n < 2:
        return 1.0
    mean_max = sum(x * ((i / m) ** n - ((i - 1) / m) ** n) for i, x in enumerate(ordered, start=1))
    return mean_max / statistics.median(ordered)


def project(
    ws1: Sequence[Any], wsn: Sequence[Any], ws1_batch: int, wsn_batch: int, world_size: int,
    ws1_global: int, wsn_global: int, overlap: bool,
) -> Projection | None:  # fmt: skip
    """The projection from ``ws1``'s runs (RunRecords of world size 1 of the group, this session)
    and ``wsn``'s (this case's runs); None when either lacks its inputs."""
    one = [r for r in ws1 if r.scaling is not None]
    many = [r.scaling for r in wsn if r.scaling is not None and r.scaling.has_comm]
    if not one or not many or world_size < 2 or len({s.comm_layout() for s in many}) != 1:
        return None
    ws1_step_ms = math.exp(statistics.fmean(math.log(r.median_s) for r in ws1)) * 1e3
    inputs = [r.scaling for r in one]
    phase = {n: statistics.median(s.phase_ms[n] for s in inputs) for n in PHASE_NAMES}
    # what world size 1's step holds beyond its compute-only phases: DDP's own work on the
    # buckets (copies, hooks) on CPU, less the host/device overlap the drained phases lose on
    # a GPU. A fixed cost per step, not one that shrinks with the batch: added, not scaled.
    # The phases are taken after the measured steps, so this also holds what the machine's speed
    # did between the two (-18 to +19 ms on a 65-96 ms step, on a noisy 2-core VM: measured.md)
    offset = ws1_step_ms - sum(phase.values())
    at = [s.phase_ms_at[wsn_batch] for s in inputs if wsn_batch in s.phase_ms_at]
    if wsn_batch == ws1_batch or not at:
        # weak scaling (the same batch), or no measurement at this batch: in proportion
        scale = wsn_batch / ws1_batch
        scaled = {n: phase[n] * (scale if n in BATCH_PHASES else 1.0) for n in PHASE_NAMES}
    else:
        scaled = {n: statistics.median(ms[n] for ms in at) for n in PHASE_NAMES}
    fsdp = bool(many[0].units)
    paid = _fsdp_paid(inputs, many) if fsdp and not overlap else None
    if paid is not None:  # each rank steps the optimizer over its shard alone: measured at N
        scaled["optimizer"] = paid[1]
    elif fsdp:
        scaled["optimizer"] /= world_size
    compute = max(1e-6, sum(scaled.values()) + offset)
    # each rank jitters as world size 1's steps did; the step waits for the slowest
    jitter = expected_max([x for r in one for x in r.step_s], world_size)
    compute *= jitter
    backward = scaled["backward"]
    comm = Comm.of(many, ready=None if fsdp else _median_ready(inputs))  # DDP: ws1's gradient timing
    exposed = comm.exposed_ms(scaled["forward"], backward, overlap) if paid is None else paid[0]
    step = compute + exposed
    efficiency = (wsn_global / step) / (ws1_global / ws1_step_ms * world_size)
    return Projection(
        world_size=world_size, step_ms=step, efficiency=efficiency, compute_ms=compute, backward_ms=backward,
        comm_ms=comm.alone_ms if paid is None else paid[0], exposed_ms=exposed, buckets=comm.count,
        ws1_step_ms=ws1_step_ms, overlap=overlap, offset_ms=offset, jitter=jitter, mode=comm.mode,
        paid=paid is not None,
    )  # fmt: skip


def _fsdp_paid(ws1: Sequence[ScalingInputs], wsn: Sequence[ScalingInputs]) -> tuple[float, float] | None:
    """(FSDP's collectives as it pays them at N, ms/step; the sharded optimizer at N, ms): a step
    of almost no compute (the smallest batch both measured, ``ranks.overlap``) at N less the
    same at world size 1, forward and backward. None where either lacks it (older runs).
    On CPU gloo the collectives alone undercounted this 4-7 x (docs/measured.md): FSDP2 adds
    copies, its reduce-scatter's chunking and an asynchronous wait per unit."""
    shared = set.intersection(*(set(s.phase_ms_at) for s in [*ws1, *wsn]))
    if not shared:
        return None
    probe = min(shared)
    one = {n: statistics.median(s.phase_ms_at[probe][n] for s in ws1) for n in PHASE_NAMES}
    many = {n: statistics.median(s.phase_ms_at[probe][n] for s in wsn) for n in PHASE_NAMES}
    paid = max(0.0, many["forward"] - one["forward"]) + max(0.0, many["backward"] - one["backward"])
    return paid, many["optimizer"]


def _median_ready(inputs: Sequence[ScalingInputs]) -> list[float]:
    lengths = {len(s.ready) for s in inputs}
    if len(lengths) != 1:
        return list(inputs[0].ready)
    return [statistics.median(col) for col in zip(*(s.ready for s in inputs), strict=True)]


@dataclass(frozen=True)
class Cause:
    """A scaling change split by counterfactual: the step re-projected with one measured input
    swapped at a time; the three parts add up to the measured change."""

    gap_ms: float  # the measured step change (or the gap to the projection)
    compute_ms: float  # the slowest rank's compute alone, swapped
    comm_ms: float  # the all-reduce's cost alone, swapped
    rest_ms: float  # what neither explains: overlap lost, waiting
    straggler: tuple[int, float] | None  # (rank, ms over the others' median) when one rank alone grew
    comm_alone: tuple[float, float]  # the step's collectives alone, before and after (ms)
    collective: str = "all-reduce"  # what they are: DDP's all-reduce, FSDP's gathers and scatters

    @property
    def named(self) -> str | None:
        """The cause that explains more than half of the gap, or None."""
        if self.gap_ms <= 0:
            return None
        parts = {"compute": self.compute_ms, "communication": self.comm_ms, "rest": self.rest_ms}
        name, ms = max(parts.items(), key=lambda kv: kv[1])
        if ms <= 0.5 * self.gap_ms:
            return None
        if name == "compute":
            return "a straggler" if self.straggler else "slower compute on every rank"
        if name == "communication":
            return "communication got slower"
        return "overlap lost or waiting (exposed communication grew at equal bandwidth)"

    def describe(self, against: str) -> str:
        straggler = (
            f"; rank {self.straggler[0]} computes {self.straggler[1]:.1f} ms/step more than the others"
            if self.straggler
            else ""
        )
        named = self.named
        verdict = f"cause: {named}" if named else "no single cause explains more than half"
        return (
            f"{verdict} ({against} {self.gap_ms:+.1f} ms/step = compute {self.compute_ms:+.1f} (slowest "
            f"rank){straggler} + {self.collective} alone {self.comm_ms:+.1f} ({self.comm_alone[0]:.1f} -> "
            f"{self.comm_alone[1]:.1f} ms) + the rest {self.rest_ms:+.1f}: overlap and waiting)"
        )


def _slowest(inputs: ScalingInputs) -> float:
    return max(inputs.rank_compute_ms) if inputs.rank_compute_ms else sum(inputs.phase_ms.values())


def _straggler(inputs: Sequence[ScalingInputs], d_compute: float) -> tuple[int, float] | None:
    """(rank, ms over the others' median) when one rank alone carries most of a compute change
    (over half of it, and 20 % over the others): a straggler, not slower compute everywhere.
    Runs whose rank count differs from the first's are left out (no column to align)."""
    with_ranks = [s.rank_compute_ms for s in inputs if len(s.rank_compute_ms) >= 2]
    ranks = [r for r in with_ranks if len(r) == len(with_ranks[0])] if with_ranks else []
    if not ranks or d_compute <= 0:
        return None
    per_rank = [statistics.median(col) for col in zip(*ranks, strict=True)]
    worst = max(range(len(per_rank)), key=lambda r: per_rank[r])
    others = statistics.median(x for r, x in enumerate(per_rank) if r != worst)
    extra = per_rank[worst] - others
    return (worst, extra) if extra > 0.5 * d_compute and extra > 0.2 * others else None


def _side(runs: Sequence[Any]) -> tuple[list[ScalingInputs], float] | None:
    inputs = [r.scaling for r in runs if r.scaling is not None and r.scaling.has_comm]
    if not inputs or len({s.comm_layout() for s in inputs}) != 1:
        return None
    return inputs, math.exp(statistics.fmean(math.log(r.median_s) for r in runs)) * 1e3


def explain(old: Sequence[Any], new: Sequence[Any], overlap: bool) -> Cause | None:
    """Why a multi-rank DDP case's step changed between two sets of runs (the baseline's and
    tonight's, or tonight's against its projection's inputs): swap the slowest rank's compute,
    then the buckets' all-reduce cost, into the old side's model; the rest is what is left."""
    a, b = _side(old), _side(new)
    if a is None or b is None:
        return None
    (old_in, old_step), (new_in, new_step) = a, b
    if old_in[0].comm_layout() != new_in[0].comm_layout():
        return None  # another bucket or unit layout: not the same model to swap inputs in

    def median_of(inputs: list[ScalingInputs]) -> tuple[float, float, float, Comm]:
        compute = statistics.median(_slowest(s) for s in inputs)
        forward = statistics.median(s.phase_ms["forward"] for s in inputs)
        backward = statistics.median(s.phase_ms["backward"] for s in inputs)
        return compute, forward, backward, Comm.of(inputs)

    c0, w0, b0, m0 = median_of(old_in)
    c1, w1, b1, m1 = median_of(new_in)

    def model(compute: float, forward: float, backward: float, comm: Comm) -> float:
        return compute + comm.exposed_ms(forward, backward, overlap)

    base = model(c0, w0, b0, m0)
    d_compute = model(c1, w1, b1, m0) - base
    d_comm = model(c0, w0, b0, m0.with_costs_of(m1)) - base
    gap = new_step - old_step
    straggler = _straggler(new_in, d_compute)
    return Cause(
        gap_ms=gap, compute_ms=d_compute, comm_ms=d_comm, rest_ms=gap - d_compute - d_comm,
        straggler=straggler, comm_alone=(m0.alone_ms, m1.alone_ms), collective=m0.collective,
    )  # fmt: skip


def explain_projection(projection: Projection, new: Sequence[Any]) -> Cause | None:
    """Why a case runs below its projection: the slowest rank's measured compute swapped for the
    projected one (from ws1); the all-reduce is tonight's in both, so what compute does not
    explain is overlap lost and waiting."""
    side = _side(new)
    if side is None:
        return None
    inputs, step = side
    slowest = statistics.median(_slowest(s) for s in inputs)
    measured_compute = (slowest + projection.offset_ms) * projection.jitter
    # an FSDP rank's phases hold its collectives (there is no all-reduce to skip): compared
    # with the projected compute and collectives together
    projected = projection.compute_ms + (projection.exposed_ms if projection.mode == "fsdp" else 0.0)
    d_compute = measured_compute - projected
    gap = step - projection.step_ms
    straggler = _straggler(inputs, d_compute)
    comm = projection.comm_ms
    return Cause(
        gap_ms=gap, compute_ms=d_compute, comm_ms=0.0, rest_ms=gap - d_compute, straggler=straggler,
        comm_alone=(comm, comm),
        collective="all-gather/reduce-scatter" if projection.mode == "fsdp" else "all-reduce",
    )  # fmt: skip


def time_shared(placement: dict[str, Any]) -> str | None:
    """Why ranks cannot be projected: more compute threads on one host than it has cores, so
    its ranks take turns where the projection assumes each computes at once (four "nodes" of a
    one-host test cluster, eight ranks of one thread on two cores). None when each rank's
    threads fit, or where the run did not record its hosts (older runs)."""
    by_host: dict[str, list[tuple[int, int]]] = {}
    for facts in placement.values():
        if not isinstance(facts, dict):
            continue
        host, cores, threads = facts.get("host"), facts.get("host_cores"), facts.get("threads")
        if isinstance(host, str) and type(cores) is int and type(threads) is int:
            by_host.setdefault(host, []).append((max(1, threads), max(1, cores)))
    for host, ranks in sorted(by_host.items()):
        threads, cores = sum(t for t, _ in ranks), ranks[0][1]
        if threads > cores:
            return (
                f"{len(ranks)} ranks ({threads} threads) time-share the {cores} cores of {host[:60]}: "
                "no projection (it assumes every rank computes at once)"
            )
    return None
