"""What a DDP or FSDP run's scaling projection needs, measured in the rank after its measured steps.

Every DDP run of world size > 1, and world size 1 of a group whose larger world sizes run here
(``RunSettings.projection_batches``: also at their per-rank batches), measures its per-rank
compute phase by phase with the gradient all-reduce skipped (``no_sync``), and when each
parameter's gradient became ready within the backward (post-accumulate-grad hooks: host time
on CPU, CUDA events on a GPU, so the GPU's own timeline counts, not the host running ahead). A
run of world size > 1 also reads DDP's buckets as it rebuilt them (their bytes and parameters,
in the order it reduces them) and times an all-reduce of each bucket's size alone, with nothing
computing beside it: the collective's cost at exactly the messages this model sends
(``evidence.projection`` combines these with the world-size-1 run of the same session).
An FSDP2 run has no gradient all-reduce to skip: its phases at world size 1 are its compute (the
collectives of one rank are copies); at world size > 1 it reads its units (``fsdp_units``) and
times each unit's all-gather and reduce-scatter alone.

The cost is a few steps: ``PHASE_STEPS`` compute-only steps (per batch, more where they are
short), one hooked step and, at world size > 1, ``PROBE_REPS`` all-reduces of the whole gradient,
after the measured steps.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaleguard.case import CaseSpec
from scaleguard.ranks.profiling import PhasedStep

PHASE_STEPS = 3
# compute-only steps go on past PHASE_STEPS, up to PHASE_STEPS_MAX rounds, until the rounds took
# PHASE_BUDGET_S: a 3-step median of a 25 ms CPU step moved the projection's compute by 5-12 ms
# between identical sessions on the 2-core VM (its "offset", ws1's step less its phases, read
# -5.8 to +12.4 ms), while a 100 ms GPU step is settled in 3 and pays nothing more
PHASE_STEPS_MAX = 15
PHASE_BUDGET_S = 0.6
PROBE_REPS = 3
FSDP_PROBE_BATCH = 2  # samples per rank: BatchNorm in training needs 2


def _clock(device: torch.device) -> Callable[[], Any]:
    """A point on the device's timeline: a CUDA event, or the host clock on CPU."""
    if device.type == "cuda":

        def mark() -> Any:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        return mark
    return time.perf_counter


def _elapsed_ms(device: torch.device, a: Any, b: Any) -> float:
    if device.type == "cuda":
        return float(a.elapsed_time(b))
    return (b - a) * 1e3


def ready_fractions(step: Callable[..., Any], model: nn.Module, device: torch.device) -> tuple[float, ...]:
    """One compute-only step with a hook on every parameter: when its gradient was accumulated,
    as a fraction of the backward (0 = backward start, 1 = its end), in ``parameters()`` order."""
    params = [p for p in _inner(model).parameters() if p.requires_grad]
    mark = _clock(device)
    stamps: dict[int, Any] = {}
    handles = [
        p.register_post_accumulate_grad_hook(lambda _p, i=i: stamps.__setitem__(i, mark()))
        for i, p in enumerate(params)
    ]
    laps: list[Any] = []
    try:
        step(lambda: laps.append(mark()), False)
        laps.append(mark())
    finally:
        for handle in handles:
            handle.remove()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # laps: data done, forward done (backward starts), backward done, optimizer done
    start, end = laps[1], laps[2]
    total = max(_elapsed_ms(device, start, end), 1e-9)
    return tuple(
        round(min(1.0, max(0.0, _elapsed_ms(device, start, stamps[i]) / total)), 4) if i in stamps else 1.0
        for i in range(len(params))
    )


def buckets(model: nn.Module) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """DDP's buckets as rebuilt after its first steps: (bytes, parameter indices), in the order
    it all-reduces them; () for anything that is not DDP or has not rebuilt them."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return ()
    data = model._get_ddp_logging_data()
    sizes, indices = data.get("rebuilt_bucket_sizes"), data.get("rebuilt_per_bucket_param_indices")
    if not isinstance(sizes, str) or not isinstance(indices, str) or not sizes:
        return ()
    byte_counts = [int(s) for s in sizes.split(",")]
    params = [tuple(int(i) for i in group.split()) for group in indices.split(",")]
    if len(byte_counts) != len(params):
        return ()
    return tuple(zip(byte_counts, params, strict=True))


def _alone(op: Callable[[], Any], device: torch.device, delay_s: float = 0.0) -> float:
    """One collective timed alone: the first call sets up its algorithm (not timed), then the
    median of ``PROBE_REPS``, each after a barrier, the device drained around it."""
    op()
    reps = []
    for _ in range(PROBE_REPS):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        if delay_s:
            time.sleep(delay_s)
        op()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        reps.append(time.perf_counter() - started)
    return statistics.median(reps)


def _slowest_rank(times: list[float], device: torch.device) -> list[float]:
    """Every rank's times, the slowest rank's of each (every rank must call it)."""
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [round(float(t), 7) for t in slowest.tolist()]


def allreduce_seconds(
    bucket_bytes: tuple[int, ...], device: torch.device, delay_s: float = 0.0
) -> tuple[float, ...]:
    """Each bucket's all-reduce alone (fp32 buffer of its size; median of ``PROBE_REPS``), the
    slowest rank's: every rank must call it. ``delay_s``: the injected ``commdelay`` fault's
    wait before each all-reduce, as DDP's hook waits (tests of the cause only)."""
    times = []
    for size in bucket_bytes:
        buffer = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        times.append(_alone(functools.partial(dist.all_reduce, buffer), device, delay_s))
        del buffer
    return tuple(_slowest_rank(times, device))


def fsdp_units(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """FSDP2's units in forward order (the root first, then each ``fully_shard``ed block as
    ``modules()`` meets it): (bytes of the parameters the unit gathers, how many times a step
    gathers them: 1 for the root, which stays unsharded from forward to backward, 2 for the
    others, resharded after forward and gathered again for backward); () for anything that is
    not FSDP2. A unit's parameters are its own less those of the units inside it."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        return ()
    inner: dict[int, set[int]] = {}
    for unit in units:
        inner[id(unit)] = {
            id(p) for sub in unit.modules() if sub is not unit and isinstance(sub, FSDPModule)
            for p in sub.parameters()
        }  # fmt: skip
    out = []
    for index, unit in enumerate(units):
        own = [p for p in unit.parameters() if id(p) not in inner[id(unit)]]
        size = sum(p.numel() * p.element_size() for p in own)
        if size:
            out.append((size, 1 if index == 0 else 2))
    return tuple(out)


def gather_scatter_seconds(
    unit_bytes: tuple[int, ...], device: torch.device
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each unit's all-gather and reduce-scatter alone at this world size (fp32 buffers of its
    size, padded to a multiple of the world as FSDP pads; median of ``PROBE_REPS``), the
    slowest rank's: every rank must call it."""
    world = dist.get_world_size()
    gathers: list[float] = []
    scatters: list[float] = []
    for size in unit_bytes:
        shard = max(1, -(-size // 4 // world))
        piece = torch.zeros(shard, dtype=torch.float32, device=device)
        whole = torch.zeros(shard * world, dtype=torch.float32, device=device)
        gathers.append(_alone(functools.partial(dist.all_gather_into_tensor, whole, piece), device))
        scatters.append(_alone(functools.partial(dist.reduce_scatter_tensor, piece, whole), device))
        del piece, whole
    both = _slowest_rank([*gathers, *scatters], device)
    return tuple(both[: len(gathers)]), tuple(both[len(gathers) :])


def phase_ms(
    phased: PhasedStep, batches: tuple[int | None, ...], alone: bool
) -> dict[int | None, dict[str, float]]:
    """Each batch's compute-only phases (None: the run's own batch), medians over rounds that take
    one step of every batch in turn: a projection compares these batches with each other, so a
    machine slowing between them (another process, a clock change) reaches all of them alike.
    ``alone`` (world size 1): rounds go on while they are short (``PHASE_BUDGET_S``). Ranks of a
    group run ``PHASE_STEPS`` exactly: a DDP forward broadcasts buffers and an FSDP step gathers,
    so every rank must take as many steps as the others, whatever its own clock says."""
    rounds: dict[int | None, list[dict[str, float]]] = {b: [] for b in batches}
    started = time.perf_counter()
    for done in range(1, (PHASE_STEPS_MAX if alone else PHASE_STEPS) + 1):
        for b in batches:
            rounds[b].append(phased.phases(False, b))
        if done >= PHASE_STEPS and time.perf_counter() - started >= PHASE_BUDGET_S:
            break
    return {
        b: {name: round(statistics.median(r[name] for r in runs) * 1e3, 4) for name in runs[0]}
        for b, runs in rounds.items()
    }


def measure(phased: PhasedStep, device: torch.device, spec: CaseSpec, delay_s: float = 0.0) -> dict[str, Any]:
    """The projection's inputs of this rank (``evidence.projection.ScalingInputs``, as written)."""
    model = phased.model
    smaller: list[int] = []
    if spec.world_size == 1:
        smaller = [b for b in spec.settings.batches_to_project() if b < spec.per_rank_batch]
    if spec.mode == "fsdp":
        # a step of almost no compute, at world size 1 and at N: what N ranks' FSDP adds to it
        # is its collectives as FSDP pays them (copy-in, gather, copy-out, the reduce-scatter's
        # chunking and waits), which on CPU gloo came to 4-7 x the same collectives alone
        smaller.append(min(FSDP_PROBE_BATCH, spec.per_rank_batch))
    measured = phase_ms(phased, (None, *dict.fromkeys(smaller)), alone=spec.world_size == 1)
    out: dict[str, Any] = {"phase_ms": measured.pop(None)}
    if spec.mode == "ddp":  # FSDP's sharded parameters take no gradient hooks; its model needs none
        out["ready"] = list(ready_fractions(phased.step, model, device))
    if measured:
        out["phase_ms_at"] = {str(b): ms for b, ms in measured.items() if b is not None}
    if spec.world_size > 1 and spec.mode == "fsdp":
        units = fsdp_units(model)
        if units:
            gathers, scatters = gather_scatter_seconds(tuple(size for size, _ in units), device)
            out["units"] = [list(unit) for unit in units]
            out["gather_s"], out["scatter_s"] = list(gathers), list(scatters)
    elif spec.world_size > 1:
        found = buckets(model)
        if found:
            out["buckets"] = [[size, list(params)] for size, params in found]
            out["bucket_s"] = list(allreduce_seconds(tuple(size for size, _ in found), device, delay_s))
    return out


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)
