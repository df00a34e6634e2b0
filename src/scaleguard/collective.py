"""The communication reference: an all-reduce case, and bus bandwidth as nccl-tests computes it.

A DDP case's scaling efficiency mixes compute, overlap and communication. The ``allreduce_*``
cases time the collective alone, one message size each, through the same loop, the same
baselines and the same verdicts as a training step, so a slower NCCL/gloo shows up on its own
and each training group's efficiency can be read against what the link delivers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from scaleguard.case import CaseSpec
from scaleguard.models import ModelDef


def bus_bandwidth(message_bytes: int, step_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for one all-reduce of ``message_bytes`` taking ``step_s``.

    nccl-tests' definition: algbw = size / time; busbw = algbw x 2(n-1)/n, the traffic each
    link carries in a ring all-reduce, so the figure is comparable across world sizes and with
    the hardware's link bandwidth.
    """
    if step_s <= 0 or world_size < 1:
        raise ValueError(f"bus bandwidth needs a positive time and world size, got {step_s}, {world_size}")
    algbw = message_bytes / step_s
    return algbw, algbw * 2 * (world_size - 1) / world_size


def no_overlap_bound(
    grad_bytes: int, busbw: float, world_size: int, per_rank_batch: int, ws1_samples_per_s: float
) -> tuple[float, float]:
    """(seconds per step to all-reduce the gradients at ``busbw``, scaling efficiency if that
    time were not hidden under compute at all).

    A ring all-reduce moves 2(n-1)/n of the buffer over each link, so it takes
    ``grad_bytes x 2(n-1)/n / busbw``; the ideal step is the rank's batch at the world-size-1
    rate. Measured efficiency above the bound means overlap works; below it, something besides
    the all-reduce (imbalance, contention for cores) costs time.
    """
    comm = grad_bytes * 2 * (world_size - 1) / world_size / busbw
    ideal = per_rank_batch / ws1_samples_per_s
    return comm, ideal / (ideal + comm)


def build_allreduce_step(spec: CaseSpec, mdef: ModelDef, device: torch.device) -> Callable[[], torch.Tensor]:
    """One all-reduce of ``mdef.message_bytes`` per step, in the case's precision.

    The buffer holds zeros: a sum of zeros stays zero forever, so no rescaling kernel is timed
    with the collective and the returned "loss" stays finite. Neither gloo nor NCCL looks at
    the values.
    """
    if not dist.is_initialized():
        raise RuntimeError(f"{spec.case_id}: an all-reduce case needs a process group (mode ddp)")
    dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
    numel = mdef.message_bytes // torch.empty((), dtype=dtype).element_size()
    buffer = torch.zeros(numel, dtype=dtype, device=device)

    def step() -> torch.Tensor:
        dist.all_reduce(buffer)
        return buffer[0].detach()

    return step
