"""Can this machine run the suite? Records torch's distributed capabilities, and fails with a
clear message where the suite cannot run."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from scaleguard.machine.env import distributed_capabilities, gpu_inventory, host_fingerprint
from scaleguard.schedule.matrix import resolve_device


def test_environment(record_property: pytest.RecordProperty, request: pytest.FixtureRequest) -> None:
    caps = distributed_capabilities()
    host = host_fingerprint()
    device = resolve_device(request.config.getoption("perf_device") or "auto", gpu_inventory())
    facts = {
        "torch": torch.__version__,
        "distributed": caps.distributed,
        "gloo": caps.gloo,
        "nccl": caps.nccl,
        "nccl_version": caps.nccl_version,
        "cuda_devices": caps.cuda_devices,
        "gpu_name": host.gpu_name,
        "cpu_model": host.cpu_model,
        "start_methods": ",".join(multiprocessing.get_all_start_methods()),
        "suite_start_method": caps.start_method,
        "suite_device": device,
    }
    for key, value in facts.items():
        record_property(key, value)
    print("scaleguard environment: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
    problems = caps.problems(device)
    assert not problems, "this machine cannot run the suite: " + "; ".join(problems)


def test_pytest_process_has_no_cuda_context() -> None:
    """The parent only plans and spawns: a CUDA context here would hold memory on GPU 0."""
    assert not torch.cuda.is_initialized()
