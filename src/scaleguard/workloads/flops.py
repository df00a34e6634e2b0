"""Training FLOPs per step, achieved TFLOPS per GPU and MFU.

FLOPs are counted once per workload, batch and precision with
``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward of the unwrapped
model (matmuls, convolutions and attention: what the tensor cores do; norms and activations
are not counted, as in every MFU figure people compare). A workload's own formula
(``Workload.flops_per_sample``) wins and is named. MFU is the achieved rate over the device's
dense peak for the precision, from a table by device name (``--perf-peak-tflops`` overrides);
on a CPU or an unknown device the peak is unknown and MFU is never guessed.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

# dense (no sparsity) peak TFLOPS by device name, per precision: vendors' datasheets. fp32
# cases run with TF32 allowed (the suite's setting), so their peak is the TF32 tensor-core rate
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp32": 494.7},
    "H100 SXM": {"bf16": 989.0, "fp32": 494.7},
    "H100 80GB HBM3": {"bf16": 989.0, "fp32": 494.7},
    "H100 PCIe": {"bf16": 756.0, "fp32": 378.0},
    "H100 NVL": {"bf16": 835.0, "fp32": 417.5},
    "A100": {"bf16": 312.0, "fp32": 156.0},
    "L40S": {"bf16": 362.1, "fp32": 181.0},
    "L4": {"bf16": 121.0, "fp32": 60.0},
    "A10G": {"bf16": 70.0, "fp32": 35.0},
    "B200": {"bf16": 2250.0, "fp32": 1100.0},
}

_COUNTED: dict[tuple[str, int, str, str], float] = {}  # per process: counted once


def peak_tflops(device_name: str, precision: str, override: float | None = None) -> float | None:
    """The device's dense peak for ``precision``; None when unknown (a CPU, an unlisted GPU)."""
    if override:
        return override
    name = device_name.upper()
    # longest key first: "H100 PCIe" before "H100"
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.upper() in name:
            return PEAK_TFLOPS[key].get(precision)
    return None


def counted(key: tuple[str, int, str, str]) -> float | None:
    """The count this process already made for ``key``, if any."""
    return _COUNTED.get(key)


def count_step_flops(
    key: tuple[str, int, str, str],
    model: nn.Module,
    loss_of: Any,
    batch: tuple[torch.Tensor, ...],
    autocast: contextlib.AbstractContextManager[Any] | None = None,
    device_type: str = "meta",
) -> float:
    """FLOPs of one forward and backward of ``model`` on ``batch``, counted once per ``key``
    (workload, per-rank batch, precision, device type) in this process. On ``meta`` (the
    harness's default) nothing runs: the counter sees every op's shapes, and a count does not
    depend on the dtype, so autocast is not needed there."""
    if key not in _COUNTED:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        # off CUDA, SDPA has no fused kernel with a FLOP formula: count attention as the math
        # it is (the same 4·B·H·T²·d forward, twice that backward, as the flash formula; on
        # CUDA the math path would materialise T x T scores)
        math_attention: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if device_type != "cuda":
            math_attention = sdpa_kernel(SDPBackend.MATH)
        with counter, math_attention:
            with autocast if autocast is not None else contextlib.nullcontext():
                loss = loss_of(model, batch)
            loss.backward()
        model.zero_grad(set_to_none=True)
        _COUNTED[key] = float(counter.get_total_flops())
    return _COUNTED[key]


def achieved(flops_per_step: float, step_s: float, nprocs: int, world_size: int) -> float:
    """TFLOPS per GPU: one process's FLOPs per step over the GPUs it drives (DataParallel: several)."""
    if flops_per_step <= 0 or step_s <= 0:
        return 0.0
    return flops_per_step * nprocs / world_size / step_s / 1e12
