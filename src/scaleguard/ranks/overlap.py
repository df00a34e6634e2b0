"""What a DDP run's scaling projection needs, measured in the rank after its measured steps.

Every DDP run of world size > 1, and world size 1 of a group whose larger world sizes run here
(``RunSettings.projection_batches``: also at their per-rank batches), measures its per-rank
compute phase by phase with the gradient all-reduce skipped (``no_sync``), and when each
parameter's gradient became ready within the backward (post-accumulate-grad hooks: host time
on CPU, CUDA events on a GPU, so the GPU's own timeline counts, not the host running ahead). A
run of world size > 1 also reads DDP's buckets as it rebuilt them (their bytes and parameters,
in the order it reduces them) and times an all-reduce of each bucket's size alone, with nothing
computing beside it: the collective's cost at exactly the messages this model sends
(``evidence.projection`` combines these with the world-size-1 run of the same session).

The cost is a few steps: ``PHASE_STEPS`` compute-only steps (per batch), one hooked step and, at
world size > 1, ``PROBE_REPS`` all-reduces of the whole gradient, after the measured steps.
"""

from __future__ import annotations

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
PROBE_REPS = 3


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


def allreduce_seconds(
    bucket_bytes: tuple[int, ...], device: torch.device, delay_s: float = 0.0
) -> tuple[float, ...]:
    """Each bucket's all-reduce alone (fp32 buffer of its size; median of ``PROBE_REPS``), the
    slowest rank's: every rank must call it. ``delay_s``: the injected ``commdelay`` fault's
    wait before each all-reduce, as DDP's hook waits (tests of the cause only)."""
    times = []
    for size in bucket_bytes:
        buffer = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        dist.all_reduce(buffer)  # the first of a size sets up its algorithm: not timed
        reps = []
        for _ in range(PROBE_REPS):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            if delay_s:
                time.sleep(delay_s)
            dist.all_reduce(buffer)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            reps.append(time.perf_counter() - started)
        times.append(statistics.median(reps))
        del buffer
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return tuple(round(float(t), 7) for t in slowest.tolist())


def _phase_ms(phased: PhasedStep, take: int | None = None) -> dict[str, float]:
    runs = [phased.phases(False, take) for _ in range(PHASE_STEPS)]
    return {name: round(statistics.median(r[name] for r in runs) * 1e3, 4) for name in runs[0]}


def measure(phased: PhasedStep, device: torch.device, spec: CaseSpec, delay_s: float = 0.0) -> dict[str, Any]:
    """The projection's inputs of this rank (``evidence.projection.ScalingInputs``, as written)."""
    model = phased.model
    out: dict[str, Any] = {
        "phase_ms": _phase_ms(phased),
        "ready": list(ready_fractions(phased.step, model, device)),
    }
    smaller = [b for b in spec.settings.batches_to_project() if b < spec.per_rank_batch]
    if spec.world_size == 1 and smaller:
        out["phase_ms_at"] = {str(b): _phase_ms(phased, b) for b in smaller}
    if spec.world_size > 1:
        found = buckets(model)
        if found:
            out["buckets"] = [[size, list(params)] for size, params in found]
            out["bucket_s"] = list(allreduce_seconds(tuple(size for size, _ in found), device, delay_s))
    return out


def _inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)
