"""The rank side of the step anatomy (``scaleguard.evidence.anatomy`` holds its record and what a
change of it says): a case's step run phase by phase with the device synchronised at each
boundary, with and without the gradient all-reduce, and one step under ``torch.profiler`` for
the costliest ops, the GPU's busy time and rank 0's Chrome trace. Runs inside a rank process,
after the measured steps, never inside them.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaleguard.evidence.anatomy import OUTSIDE_OPS, TOP_OPS, Anatomy, OpTime

# annotations and profiler bookkeeping that are not ops of the model
_NOT_OPS = ("ProfilerStep", "cudaDeviceSynchronize", "Memcpy", "[memory]")
# CUDA runtime calls (cudaLaunchKernel, cuLaunchKernel, ...) are how ops launch, not ops
_RUNTIME = ("cuda", "cuLaunch", "cuMem", "cuStream", "cuEvent", "cuCtx")


@dataclass(frozen=True)
class PhasedStep:
    """What the anatomy needs of a case's step, built with it (``worker.build_train_step``).

    ``phases(grad_sync)`` runs one step phase by phase with the device synchronised at each
    boundary and returns seconds per phase; ``grad_sync=False`` skips the gradient all-reduce
    (None when the mode cannot: FSDP, single device). ``step`` is the plain step, for the
    profiled one.
    """

    step: Callable[[], Any]
    phases: Callable[..., dict[str, float]]  # (grad_sync, take=None): take = a smaller batch
    can_skip_sync: bool
    grad_bytes: int = 0
    flops_per_step: float = 0.0  # this process's training FLOPs per step (scaleguard.workloads.flops)
    model: Any = None  # the wrapped model (DDP's buckets, gradient hooks: ranks.overlap)


def measure(
    phased: PhasedStep, steps: int, profiler_activities: Sequence[Any], trace: Path | None
) -> Anatomy:
    """Run the anatomy steps (every rank must call it: the synchronised steps all-reduce)."""
    import torch.profiler

    started = time.perf_counter()
    synced = [phased.phases(True) for _ in range(steps)]
    local = [phased.phases(False) for _ in range(steps)] if phased.can_skip_sync else []
    ms = {name: statistics.median(s[name] for s in synced) * 1e3 for name in synced[0]}
    if local:
        compute = statistics.median(s["backward"] for s in local) * 1e3
        ms["exposed communication"] = max(0.0, ms["backward"] - compute)
        ms["backward"] = compute
    with warnings.catch_warnings():
        # torch >= 2.4 warns once per profile that events are not kept across cycles: one cycle
        # (its text starts "Warning: Profiler clears ...": the pattern matches from the start)
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with torch.profiler.profile(activities=list(profiler_activities)) as prof:
            phased.step()
            _synchronize()
    on_device = any(a == torch.profiler.ProfilerActivity.CUDA for a in profiler_activities)
    averages = prof.key_averages()
    top = top_ops(averages, on_device)
    if trace is not None:
        try:
            trace.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))
        except OSError:  # a full or read-only disk costs the trace, never the run's result
            trace = None
    return Anatomy(
        ms=ms,
        top_ops=top,
        op_clock="device" if on_device else "cpu",
        steps=steps,
        cost_s=time.perf_counter() - started,
        trace=str(trace) if trace is not None else None,
        grad_bytes=phased.grad_bytes,
        device_busy_ms=device_busy_ms(prof.events()) if on_device else None,
        host_ops=top_ops(averages, on_device=False) if on_device else (),
    )


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def top_ops(averages: Sequence[Any], on_device: bool) -> tuple[OpTime, ...]:
    """The costliest ops of one profiled step by self time (µs in the profiler's averages)."""

    def self_us(event: Any) -> float:
        if on_device:
            return _device_us(event)
        return float(event.self_cpu_time_total)

    # user annotations (DistributedDataParallel.forward, Optimizer.step#SGD.step) span other
    # ops' kernels on the GPU timeline: they are regions, not ops
    # on CUDA the kernels are listed too, under the ops that launched them: ops only, so no
    # time is counted twice
    rows = [
        e
        for e in averages
        if not e.key.startswith(_NOT_OPS)
        and not (on_device and e.key.startswith(_RUNTIME))
        and not getattr(e, "is_user_annotation", False)
        and str(getattr(e, "device_type", "CPU")).endswith("CPU")
        and self_us(e) > 0
    ]
    rows.sort(key=self_us, reverse=True)
    top = [OpTime(e.key, float(e.count), self_us(e) / 1e3) for e in rows[:TOP_OPS]]
    if on_device:
        # device time of kernels no op launched (a raw CUDA kernel from an extension, a custom
        # launcher): the device's total less what the ops account for, as one row of its own
        outside = _kernel_ms(averages) - sum(self_us(e) for e in rows) / 1e3
        if outside > 0.01:
            top.append(OpTime(OUTSIDE_OPS, 1.0, outside))
            top = sorted(top, key=lambda o: -o.ms)[:TOP_OPS]
    return tuple(top)


def _is_kernel(event: Any) -> bool:
    # device-side user annotations (``DistributedDataParallel.forward``, ``Optimizer.step#...``
    # on the GPU timeline) span kernels already counted: counting them read 79.7 ms of "busy"
    # for a 55.5 ms ResNet-50 step on the H200 (28.5 ms of annotation; the kernels' own 53.8 ms
    # equal the union of their intervals). torch's own table total leaves them out too
    return not str(getattr(event, "device_type", "CPU")).endswith("CPU") and not getattr(
        event, "is_user_annotation", False
    )


def _device_us(event: Any) -> float:
    # renamed from self_cuda_time_total in torch 2.4, whose old name warns (FutureWarning) on
    # every read: the old name only where the new one is missing (a warning per op and run
    # filled the H100's logs)
    if hasattr(event, "self_device_time_total"):
        return float(event.self_device_time_total)
    return float(getattr(event, "self_cuda_time_total", 0.0))


def _kernel_ms(events: Sequence[Any]) -> float:
    """Every kernel's device time (ms), over all devices."""
    return sum(_device_us(e) for e in events if _is_kernel(e)) / 1e3


def device_busy_ms(events: Sequence[Any]) -> float:
    """How long the busiest device ran kernels in the profiled step (ms), launched by an op or
    not. Per device: a DataParallel process drives several GPUs, and their sum is no device's."""
    per: dict[int, float] = {}
    for e in events:
        if _is_kernel(e):
            index = int(getattr(e, "device_index", 0) or 0)
            per[index] = per.get(index, 0.0) + _device_us(e)
    return max(per.values(), default=0.0) / 1e3
