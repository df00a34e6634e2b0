"""Faults that need a real CUDA device; skipped where none is visible (CI has none)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from scaleguard.case import CaseSpec, RunSettings
from scaleguard.ranks.faults import FAULT_ENV
from scaleguard.ranks.launcher import run_case
from scaleguard.ranks.protocol import CaseFailedError

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(300),
]


def cuda_spec() -> CaseSpec:
    return CaseSpec(
        model="resnet18_cifar",
        mode="ddp",
        world_size=1,
        precision="bf16",
        scaling="strong",
        inputs="synthetic",
        device="cuda",
        profile="smoke",
        global_batch=64,
        settings=RunSettings(
            steps=5, warmup_min=3, warmup_max=6, warmup_tolerance=0.5, threads_per_rank=4, channels_last=True
        ),
    )


def test_real_cuda_oom_fails_the_case_with_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process_tag: str
) -> None:
    monkeypatch.setenv(FAULT_ENV, "oom,rank=0,phase=measure,step=1")
    with pytest.raises(CaseFailedError, match="OutOfMemoryError") as info:
        run_case(cuda_spec(), tmp_path, timeout_s=240)
    assert "CUDA out of memory" in str(info.value)


def test_spawned_ranks_work_with_cuda_initialised_in_the_parent(tmp_path: Path, process_tag: str) -> None:
    torch.zeros(1, device="cuda")  # what a careless conftest might do: spawn, not fork, copes
    (rank,) = run_case(dataclasses.replace(cuda_spec()), tmp_path, timeout_s=240)
    assert len(rank.step_s) == 5 and rank.mem_kind == "cuda_max_allocated" and rank.peak_mem_bytes > 0
