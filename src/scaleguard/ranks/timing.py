"""The one measuring loop: warm up to a steady state, then time every step.

Every mode (single, DataParallel, DDP, FSDP) hands ``measure`` a zero-argument ``step`` that
runs one training step and returns the (detached) loss; modes differ in how the step was
built, never in how it is timed.

A step's time is the interval between consecutive step *boundaries*. On CUDA a boundary is an
event recorded on the current stream, so the interval also contains any time the GPU sat idle
waiting for the host (a slow input pipeline shows up instead of hiding between steps), and no
host synchronisation happens inside the measured steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from scaleguard.evidence.steady import WarmupPolicy


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite: the numbers of such a run are not a result."""


class StepClock(Protocol):
    def mark(self) -> None:
        """Record a step boundary (must not synchronise the device)."""

    def intervals_s(self) -> list[float]:
        """Seconds between consecutive boundaries since the last ``reset``; may synchronise."""

    def reset(self) -> None: ...


class PerfCounterClock:
    """Host clock: right on CPU, where every op completes before it returns."""

    def __init__(self) -> None:
        self._marks: list[float] = []

    def mark(self) -> None:
        self._marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        return [b - a for a, b in zip(self._marks, self._marks[1:], strict=False)]

    def reset(self) -> None:
        self._marks = []


class CudaEventClock:
    """CUDA events on the current stream: device time, no host sync until read."""

    def __init__(self) -> None:
        self._events: list[torch.cuda.Event] = []

    def mark(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.append(event)

    def intervals_s(self) -> list[float]:
        if not self._events:
            return []
        self._events[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self._events, self._events[1:], strict=False)]

    def reset(self) -> None:
        self._events = []


@dataclass(frozen=True)
class Sampling:
    """How many steps to measure: at least ``min_steps``; then, while the median's 95 % CI
    half-width exceeds ``target_ci`` of it, chunks of more steps up to ``max_steps`` steps and
    ``max_seconds`` of measuring. ``target_ci`` 0: exactly ``min_steps``."""

    min_steps: int
    max_steps: int = 0
    max_seconds: float = 0.0
    target_ci: float = 0.0

    @property
    def chunk(self) -> int:
        return max(5, self.min_steps // 2)


@dataclass(frozen=True)
class MeasuredSteps:
    """What one rank measured: its per-step times after warmup, and how warmup went."""

    step_s: tuple[float, ...]
    warmup_step_s: tuple[float, ...]
    steady: bool  # False: warmup hit max_steps before the median settled
    final_loss: float
    start_unix: float = 0.0  # wall clock around the measured steps (after warmup)
    end_unix: float = 0.0


def measure(
    step: Callable[[], torch.Tensor],
    clock: StepClock,
    policy: WarmupPolicy,
    steps: int | Sampling,
    agree_max: Callable[[float], float] = lambda x: x,
    before_step: Callable[[str, int], None] = lambda phase, i: None,
    before_measure: Callable[[], None] = lambda: None,
) -> MeasuredSteps:
    """Warm up, then time ``steps`` steps of ``step``.

    Args:
        step: runs one training step, returns the detached loss.
        clock: boundary recorder matching the device.
        policy: when warmup may stop.
        steps: measured steps, or a ``Sampling`` rule for adaptive sampling.
        agree_max: reduces a float to its maximum over ranks (identity in one process); every
            rank then takes the same warmup decision, so ranks never desynchronise.
        before_step: called with ("warmup"|"measure", index) before each step; host-side only.
            It runs inside the step's interval: keep it to what must happen there (a fault).
        before_measure: called once after warmup, when every rank has agreed to start the
            measured steps and before the first is timed (status, the memory peak's reset).
    """
    warmup_s: list[float] = []
    steady = False
    loss = torch.zeros(())
    while len(warmup_s) < policy.max_steps:
        clock.reset()
        clock.mark()
        before_step("warmup", len(warmup_s))
        loss = step()
        clock.mark()
        # warmup may synchronise: each step is read so the steady-state decision is informed
        warmup_s.append(agree_max(clock.intervals_s()[0]))
        if not torch.isfinite(loss).item():
            raise NonFiniteLossError(f"loss is {loss.item()} at warmup step {len(warmup_s) - 1}")
        if policy.is_steady(warmup_s):
            steady = True
            break

    sampling = steps if isinstance(steps, Sampling) else Sampling(steps)
    agree_max(0.0)  # a barrier: all ranks enter the measured steps together
    before_measure()
    nonfinite = torch.zeros((), dtype=torch.bool, device=loss.device)
    step_s: list[float] = []
    started = time.perf_counter()
    start_unix = time.time()
    chunk = sampling.min_steps
    while True:
        # boundaries restart per chunk: the read (a device sync) between chunks is not a step
        clock.reset()
        clock.mark()
        for index in range(len(step_s), len(step_s) + chunk):
            before_step("measure", index)
            loss = step()
            # stays on the device: checking it here would add a host sync to every step
            nonfinite |= ~torch.isfinite(loss)
            clock.mark()
        step_s += clock.intervals_s()
        if not _wants_more(sampling, step_s, time.perf_counter() - started, agree_max):
            break
        chunk = min(sampling.chunk, sampling.max_steps - len(step_s))
    if bool(nonfinite.item()):
        raise NonFiniteLossError(
            f"loss became non-finite during the {len(step_s)} measured steps (last loss {loss.item()})"
        )
    end_unix = time.time()
    return MeasuredSteps(
        step_s=tuple(step_s),
        warmup_step_s=tuple(warmup_s),
        steady=steady,
        final_loss=float(loss.item()),
        start_unix=start_unix,
        end_unix=end_unix,
    )


def _wants_more(
    sampling: Sampling, step_s: list[float], elapsed_s: float, agree_max: Callable[[float], float]
) -> bool:
    """Whether the median is not yet pinned and the caps allow more; the same answer on every
    rank (the widest interval of any rank decides)."""
    if sampling.target_ci <= 0 or len(step_s) >= sampling.max_steps or elapsed_s >= sampling.max_seconds:
        return False
    from scaleguard.evidence.stats import median_ci_halfwidth

    return agree_max(median_ci_halfwidth(step_s)) > sampling.target_ci
