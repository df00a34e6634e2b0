"""Bridge to pytest-benchmark: hand it the per-step samples that the ranks measured.

pytest-benchmark has no public API for timings measured in other processes (its issue #52).
We use ``BenchmarkFixture._make_stats`` and ``Stats.update``, the two calls its own timing loop
makes, so ``--benchmark-save`` JSON holds rounds = measured steps and min/median/mean/stddev of
exactly those samples. Both exist unchanged in pytest-benchmark 4.0 through 5.x; the supported
range is pinned in pyproject.toml and ``tests/plugin`` checks the saved JSON against the raw
samples, so a change there fails our tests rather than silently corrupting results.
"""

from __future__ import annotations

from typing import Any

from scaleguard.baseline import config_of
from scaleguard.env import HostFingerprint
from scaleguard.records import CaseResult

MODE_LABEL = "scaleguard: steps timed inside worker processes"


def extra_info(result: CaseResult) -> dict[str, Any]:
    spec = result.spec
    return {
        "scaleguard_schema": result.schema_version,
        "case_id": spec.case_id,
        "group_id": spec.group_id,
        "config": config_of(spec.to_dict()),
        "step_s": list(result.step_s),  # raw samples: `scaleguard compare` tests on these
        "model": spec.model,
        "mode": spec.mode,
        "world_size": spec.world_size,
        "precision": spec.precision,
        "scaling": spec.scaling,
        "inputs": spec.inputs,
        "profile": spec.profile,
        "device": spec.device,
        "global_batch": spec.global_batch,
        "per_rank_batch": spec.per_rank_batch,
        "samples_per_s": result.samples_per_s,
        "speedup": result.speedup,
        "scaling_efficiency": result.scaling_efficiency,
        "peak_mem_bytes": list(result.peak_mem_bytes),
        "mem_kind": result.mem_kind,
        "warmup_steps": result.warmup_steps,
        "steady": result.steady,
        "median_step_s": result.summary.median_s,
        "iqr_step_s": result.summary.iqr_s,
        "device_name": result.device_name,
        "runtime": result.runtime,
        "settings": result.settings,
        "notes": list(result.notes),
        "throttled": result.throttled,
        "machine_state": result.machine_state,
    }


def record(benchmark: Any, result: CaseResult) -> None:
    """Store ``result``'s slowest-rank step times as the benchmark's rounds."""
    if getattr(benchmark, "disabled", False):
        return
    if getattr(benchmark, "_mode", None):
        raise RuntimeError(f"the benchmark fixture was already used in {benchmark._mode} mode")
    benchmark._mode = MODE_LABEL
    stats = benchmark._make_stats(1)  # one iteration per round: a round is one training step
    for step_s in result.step_s:
        stats.update(step_s)
    benchmark.extra_info.update(extra_info(result))


def update_machine_info(
    machine_info: dict[str, Any], host: HostFingerprint, device: str, profile: str, threads_per_rank: int
) -> None:
    """Add what decides comparability: torch/CUDA/cuDNN/NCCL, GPUs, CPU, threads per rank."""
    machine_info["scaleguard"] = {
        **host.to_dict(),
        "device": device,
        "profile": profile,
        "threads_per_rank": threads_per_rank,
    }
    machine_info.update(
        {
            "torch_version": host.torch,
            "cuda_version": host.cuda,
            "cudnn_version": host.cudnn,
            "nccl_version": host.nccl,
            "gpu_name": host.gpu_name,
            "gpu_count": host.gpu_count,
            "cpu_model": host.cpu_model,
            "threads_per_rank": threads_per_rank,
        }
    )
