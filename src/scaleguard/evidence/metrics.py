"""The figures people compare, computed from evidence: throughput (samples/s, tokens/s per GPU),
achieved TFLOPS and MFU, an all-reduce's algorithm and bus bandwidth, and the scaling
efficiency a DDP case's gradients allow without overlap.

Computed here, in the evidence layer, so the report only renders them and the saved
pytest-benchmark JSON holds the same numbers the tables show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scaleguard.case import CaseSpec
from scaleguard.evidence.runs import CaseEvidence

if TYPE_CHECKING:
    from scaleguard.evidence.ledger import Ledger

DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket: the all-reduce reference nearest to it


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


def throughput(spec: CaseSpec, evidence: CaseEvidence, device_name: str,
               peak_override: float | None = None) -> dict[str, Any]:  # fmt: skip
    """What people compare: samples/s, tokens/s per GPU, achieved TFLOPS per GPU and MFU
    (None where the peak of the device is unknown: never guessed)."""
    # the workloads import torch: only here, never when the CLI or the plugin loads
    from scaleguard.workloads.contract import WorkloadError
    from scaleguard.workloads.flops import peak_tflops
    from scaleguard.workloads.registry import resolve

    try:
        workload = resolve(spec.model, spec.workload)
        tokens, sample, source = workload.tokens_per_sample, workload.sample, workload.flops_source()
    except (WorkloadError, ValueError):  # a record of a workload not importable here
        tokens, sample, source = 0, "samples", "FlopCounterMode"
    tflops = evidence.tflops_per_gpu()
    peak = (
        peak_tflops(device_name, spec.precision, peak_override)
        if spec.device == "cuda" or peak_override
        else None
    )
    return {
        "sample": sample,
        "samples_per_s": evidence.samples_per_s(),
        "tokens_per_sample": tokens,
        "tokens_per_s_per_gpu": evidence.samples_per_s() * tokens / spec.world_size if tokens else None,
        "flops_per_step": evidence.flops_per_step() or None,
        "flops_source": source,
        "tflops_per_gpu": tflops or None,
        "peak_tflops": peak,
        "mfu": tflops / peak if peak and tflops else None,
    }


def collective_bandwidth(spec: CaseSpec, evidence: CaseEvidence) -> tuple[int, float, float] | None:
    """(message bytes, algbw, busbw) of an all-reduce case's median step; None for other cases."""
    from scaleguard.workloads.builtins import BUILTINS

    mdef = BUILTINS.get(spec.model)
    if mdef is None or not mdef.is_collective or not evidence.runs:
        return None
    algbw, busbw = bus_bandwidth(mdef.message_bytes, evidence.median_s(), spec.world_size)
    return mdef.message_bytes, algbw, busbw


@dataclass(frozen=True)
class BandwidthBound:
    """What a DDP case's gradients cost at the bus bandwidth this session measured."""

    efficiency: float  # measured, mean over runs
    grad_bytes: int
    reference_model: str  # the all-reduce case whose busbw is used
    busbw: float  # bytes/s
    comm_s: float  # seconds per step to all-reduce the gradients
    bound: float  # the efficiency if none of comm_s overlapped compute


def bandwidth_bound(ledger: Ledger, spec: CaseSpec, evidence: CaseEvidence) -> BandwidthBound | None:
    """For a DDP case at world size > 1, against this session's all-reduce case of the same
    world size and device whose message is nearest DDP's bucket; None when there is none."""
    from scaleguard.workloads.builtins import BUILTINS

    grads = [r.anatomy.grad_bytes for r in evidence.runs if r.anatomy and r.anatomy.grad_bytes]
    reference = ledger.ws1_samples_per_s(spec.group_id)
    effs = evidence.efficiencies()
    if spec.world_size < 2 or spec.mode != "ddp" or not grads or reference is None or not effs:
        return None
    references = [
        (abs(BUILTINS[s.model].message_bytes - DDP_BUCKET_BYTES), s)
        for cid, s in ledger.specs.items()
        if s.model in BUILTINS
        and BUILTINS[s.model].is_collective
        and s.world_size == spec.world_size
        and s.device == spec.device
        and ledger.records.get(cid)
    ]
    if not references:
        return None
    _, ref = min(references, key=lambda pair: pair[0])
    ref_ev = ledger.evidence(ref.case_id)
    _, busbw = bus_bandwidth(BUILTINS[ref.model].message_bytes, ref_ev.median_s(), ref.world_size)
    comm, bound = no_overlap_bound(grads[-1], busbw, spec.world_size, spec.per_rank_batch, reference)
    return BandwidthBound(sum(effs) / len(effs), grads[-1], ref.model, busbw, comm, bound)
