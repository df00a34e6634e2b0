"""Deliberate faults for testing the harness the way real runs fail.

Set ``SCALEGUARD_INJECT_FAULT`` before a run, e.g. ``raise,rank=1,phase=measure,step=2``.
Kinds: ``raise`` (a Python error), ``sigkill`` (as the OOM killer would), ``hang`` (SIGSTOP:
the rank stops answering), ``exit0`` (exits cleanly without a result), ``nan`` (the loss turns
non-finite), ``oom`` (a real out-of-memory on CUDA, a simulated one on CPU), ``commdelay``
(DDP all-reduce delayed by ``ms`` per bucket on world sizes > 1: a communication regression),
and ``slow`` (a compute regression: each step made ``pct`` percent longer on CPU by busy work,
``pct`` percent longer on CUDA by a device-side spin sized from the step's own device time, or
``ms`` longer on CUDA by a device-side spin queued after the step; with ``at=backward``,
``ms`` of busy work or GPU spin inside the backward pass, on either device; with ``on=host``,
busy work of the launching thread on CUDA too: a host-side slowdown, which a device-bound
step hides behind its queue and a launch-bound one shows).
The parent reads the variable when it hands a run to its ranks; nothing is injected unless it
is set. The worker knows three seams only: ``fire`` (at a phase and step), ``instrument_model``
and ``wrap_step``.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from scaleguard.case import FAULT_ENV, fault_fields


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` fault."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    rank: int | None = None  # None: every rank
    phase: str = "measure"  # "setup", "warmup", "measure" or "anatomy" (its start; step 0)
    step: int = 0
    ms: float = 0.0
    pct: float = 0.0
    at: str = "step"  # slow: "step" (after every step) or "backward" (inside the backward pass)
    on: str = "device"  # slow on CUDA: "device" (a GPU spin) or "host" (the launching thread busy)

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``SCALEGUARD_INJECT_FAULT``'s value (its grammar is ``case.fault_fields``, torch-free:
        the suite checks a value at configure without importing torch)."""
        return cls(**fault_fields(text))

    def applies(self, rank: int, phase: str, step: int) -> bool:
        return (self.rank is None or self.rank == rank) and self.phase == phase and self.step == step

    def instrument_model(self, model: nn.Module) -> None:
        """``commdelay``: delay every DDP bucket's all-reduce (world sizes > 1). ``slow`` with
        ``at=backward``: ``ms`` more inside the backward pass (a hook at its start)."""
        if self.kind == "slow" and self.at == "backward":
            inner = getattr(getattr(model, "_orig_mod", model), "module", model)
            delay = self._delay(next(inner.parameters()).device)
            # token inputs need no gradient: torch warns that the hook fires on the outputs'
            # gradients, which is the point here (the start of the backward pass)
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            inner.register_full_backward_pre_hook(lambda module, grad_output: delay())
            return
        if self.kind != "commdelay" or not dist.is_initialized() or dist.get_world_size() < 2:
            return
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            model.register_comm_hook(self.ms / 1e3, _delayed_allreduce_hook)

    def collective_delay_s(self) -> float:
        """``commdelay``: what each of the rank's all-reduces is delayed by, so the projection's
        probe of the collective (``ranks.overlap``) sees the slower collective DDP's hook does."""
        return self.ms / 1e3 if self.kind == "commdelay" else 0.0

    def wrap_step(
        self, step: Callable[[], torch.Tensor], rank: int, device: torch.device
    ) -> Callable[[], torch.Tensor]:
        """``nan``: the loss turns NaN from step ``self.step`` on; ``slow``: each step longer."""
        if self.rank not in (None, rank):
            return step
        if self.kind == "nan":
            calls = itertools.count()

            def poisoned() -> torch.Tensor:
                loss = step()
                return loss * float("nan") if next(calls) >= self.step else loss

            return poisoned
        if self.kind == "slow" and self.at == "step":
            return self._slowed(step, device)
        return step

    def _delay(self, device: torch.device) -> Callable[[], None]:
        """``ms`` of busy work: a GPU spin queued on the stream, or a busy host loop."""
        if device.type == "cuda" and self.on == "device":
            cycles = int(self.ms * _spin_cycles_per_ms(device))
            return lambda: torch.cuda._sleep(cycles)

        def busy() -> None:
            until = time.perf_counter() + self.ms / 1e3
            while time.perf_counter() < until:
                pass

        return busy

    def _slowed(self, step: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], torch.Tensor]:
        if device.type == "cuda" and self.on == "host":
            busy = self._delay(device)

            def slowed_host() -> torch.Tensor:
                busy()  # before the step's launches: the device waits only if its queue runs dry
                return step()

            return slowed_host
        if device.type == "cuda" and self.pct > 0:
            return _proportional_spin(step, self.pct, device)
        if device.type == "cuda":
            # spin the GPU after the step's kernels: device time, no host sync. The spin is
            # sized from a one-off timing of it (cycles per ms at this clock)
            cycles = int(self.ms * _spin_cycles_per_ms(device))

            def slowed_cuda() -> torch.Tensor:
                loss = step()
                torch.cuda._sleep(cycles)
                return loss

            return slowed_cuda

        def slowed_cpu() -> torch.Tensor:
            start = time.perf_counter()
            loss = step()
            # busy work, not sleep: a slower kernel keeps its core busy
            until = time.perf_counter() + (time.perf_counter() - start) * self.pct / 100
            while time.perf_counter() < until:
                pass
            return loss

        return slowed_cpu

    def fire(self, device: torch.device) -> None:
        """Cause the fault now. ``nan``, ``slow`` and ``commdelay`` act through the other seams."""
        if self.kind == "raise":
            raise InjectedFault(f"injected fault ({FAULT_ENV}={self})")
        if self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kind == "exit0":
            sys.stdout.flush()
            os._exit(0)  # no result file, no cleanup: what a careless wrapper script might do
        if self.kind == "oom":
            if device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(device)
                torch.empty(free * 2, dtype=torch.uint8, device=device)  # a real CUDA OOM
            raise torch.OutOfMemoryError(f"injected: CPU out of memory (simulated, {FAULT_ENV}={self})")


def requested(side_env: Mapping[str, str] | None = None) -> str:
    """The fault asked for now: the parent hands it to the ranks with each run (pooled ranks
    started before it was set). ``side_env``: the environment set for these ranks only (one
    side of a paired A/B), which wins over the parent's."""
    text = (side_env or {}).get(FAULT_ENV, os.environ.get(FAULT_ENV, ""))
    return text.strip()


def _proportional_spin(
    step: Callable[[], torch.Tensor], pct: float, device: torch.device
) -> Callable[[], torch.Tensor]:
    """Each step ``pct`` percent longer on the device: a GPU spin after the step, sized from the
    step's own stream time between two events (read once they have completed, so no sync is
    added). A fixed ``ms`` would be a different share of every case; a 1.5 % slowdown must be
    1.5 % of each case's step to test what a threshold resolves."""
    per_ms = _spin_cycles_per_ms(device)
    done: list[float] = []  # stream time of completed steps, ms
    pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def slowed() -> torch.Tensor:
        while pending and pending[0][1].query():
            start, end = pending.pop(0)
            done.append(start.elapsed_time(end))
            del done[:-16]  # the recent steps: the first ones carry autotuning
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        pending.append((start, end))
        if done:
            step_ms = sorted(done)[len(done) // 2]
            torch.cuda._sleep(int(step_ms * pct / 100 * per_ms))
        return loss

    return slowed


def _spin_cycles_per_ms(device: torch.device) -> float:
    probe = 10_000_000
    torch.cuda._sleep(probe)  # warm
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return probe / start.elapsed_time(end)


def _delayed_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook that sleeps ``state`` seconds before each bucket's all-reduce (fault
    ``commdelay``). DDP checks the names (``state, bucket``) and that ``bucket`` is annotated
    with the GradBucket class itself, which string annotations (``from __future__ import
    annotations``) are not: so it stays unannotated."""
    time.sleep(state)
    tensor = bucket.buffer().div_(dist.get_world_size())
    fut = dist.all_reduce(tensor, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])
