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
from scaleguard.workloads.builtins import ModelDef


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
