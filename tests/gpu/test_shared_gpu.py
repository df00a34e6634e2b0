"""The multi-rank CUDA path on the one GPU we have: ranks share it over gloo (--perf-share-gpu).

Through the real pool, CUDA-event timing gathered across ranks, NVML and the fault paths: DDP
and FSDP at world sizes 2 and 4; a rank SIGKILLed and one hung are named and reaped, the GPU
memory they held is freed, and the next case runs. Skipped where no GPU is visible (CI).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from scaleguard.case import CaseSpec, RunSettings
from scaleguard.ranks.faults import FAULT_ENV
from scaleguard.ranks.launcher import Pools
from scaleguard.ranks.protocol import CaseFailedError
from scaleguard.schedule import runner
from scaleguard.schedule.matrix import MatrixOptions, plan

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(600),
]


try:
    import pynvml  # noqa: F401

    NVML = True
except ImportError:
    NVML = False


def shared_spec(mode: str, world_size: int) -> CaseSpec:
    return CaseSpec(
        model="resnet18_cifar",
        mode=mode,  # type: ignore[arg-type]
        world_size=world_size,
        precision="bf16",
        scaling="weak",
        inputs="synthetic",
        device="cuda",
        profile="smoke",
        global_batch=32 * world_size,
        settings=RunSettings(
            steps=6, warmup_min=3, warmup_max=8, warmup_tolerance=0.5, threads_per_rank=2,
            channels_last=mode != "fsdp", shared_gpu=True, profile_steps=2,
        ),
    )  # fmt: skip


def free_gpu_bytes() -> int:
    free, _ = torch.cuda.mem_get_info(0)
    return int(free)


def test_the_matrix_plans_shared_world_sizes_without_a_scaling_figure() -> None:
    from scaleguard.machine.env import GpuInventory

    one = GpuInventory(1, ("NVIDIA H200",))
    planned = plan(MatrixOptions(world_sizes=(1, 2, 4), modes=("ddp", "fsdp"), shared_gpu=True), one, 16)
    ws4 = [p for p in planned if p.spec.world_size == 4]
    assert ws4 and all(p.skip_reason is None and p.spec.settings.shared_gpu for p in ws4)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ddp_and_fsdp_run_through_one_pool_on_a_shared_gpu(
    tmp_path: Path, process_tag: str, world_size: int
) -> None:
    pools = Pools(tmp_path / "pools")
    try:
        for mode in ("ddp", "fsdp"):
            spec = shared_spec(mode, world_size)
            result = runner.run_once(spec, tmp_path / f"{mode}.run", 300, pools=pools)
            assert len(result.rank_peak_mem_bytes) == world_size and min(result.rank_peak_mem_bytes) > 0
            assert result.mem_kind == "cuda_max_allocated" and len(result.step_s) >= 6
            assert spec.settings.shared_gpu and result.device_name.startswith("NVIDIA")
            if NVML:  # NVML watched the one device the ranks share
                assert result.gpu, result
    finally:
        pools.close()


@pytest.mark.parametrize(("fault", "needle"), [("sigkill", "SIGKILL"), ("hang", "")])
def test_a_killed_or_hung_rank_is_named_reaped_its_memory_freed_and_the_next_case_runs(
    tmp_path: Path, process_tag: str, monkeypatch: pytest.MonkeyPatch, fault: str, needle: str
) -> None:
    pools = Pools(tmp_path / "pools")
    spec = shared_spec("ddp", 2)
    try:
        runner.run_once(spec, tmp_path / "warm.run", 300, pools=pools)
        free_before = free_gpu_bytes()
        monkeypatch.setenv(FAULT_ENV, f"{fault},rank=1,phase=measure,step=2")
        started = time.monotonic()
        with pytest.raises(CaseFailedError) as info:
            runner.run_once(spec, tmp_path / "fault.run", 60 if fault == "hang" else 300, pools=pools)
        # a killed rank is named; a stopped one leaves its peer waiting in the collective, so
        # the deadline names both as still running, with each one's last activity
        message = str(info.value)
        assert (info.value.rank == 1 and needle in message) or (
            fault == "hang" and "still running and were killed" in message
        ), message
        assert time.monotonic() - started < 200
        monkeypatch.delenv(FAULT_ENV)
        deadline = time.monotonic() + 30
        while free_gpu_bytes() < free_before - 256 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.5)  # the driver frees a dead process's memory shortly after it is reaped
        assert free_gpu_bytes() >= free_before - 256 * 2**20
        result = runner.run_once(spec, tmp_path / "after.run", 300, pools=pools)
        assert len(result.rank_peak_mem_bytes) == 2 and result.peak_mem_bytes == max(
            result.rank_peak_mem_bytes
        )
    finally:
        pools.close()
