"""Every per-device default is read from the one table in ``scaleguard.devices``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaleguard.devices import DEVICES, defaults_for
from scaleguard.evidence.verdict import Thresholds
from scaleguard.machine.env import GpuInventory
from scaleguard.schedule.ab import ABSchedule
from scaleguard.schedule.matrix import MatrixOptions, plan
from scaleguard.schedule.session import Schedule


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_suite_reads_its_device_defaults_from_the_table(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a table with every number changed: each reader must follow it (none keeps its own copy)
    changed = replace(
        DEVICES[device], step=0.07, efficiency=0.06, memory=0.2, prior_spread=0.05, min_spread=0.01,
        ab_step=0.04, ab_efficiency=0.02, ab_max_pairs=7, quarantine_pause_s=3.0, steps=17,
        warmup_min=3, warmup_tolerance=0.2, target_median_ci=0.5, loader_workers=2,
    )  # fmt: skip
    monkeypatch.setitem(DEVICES, device, changed)
    thr, ab = Thresholds.for_device(device), Thresholds.for_ab(device)
    assert (thr.step, thr.efficiency, thr.memory, thr.prior_spread, thr.min_spread) == (
        0.07,
        0.06,
        0.2,
        0.05,
        0.01,
    )
    assert (ab.step, ab.efficiency) == (0.04, 0.02)
    assert ABSchedule.for_device(device).max_pairs == 7
    assert Schedule.for_device(device).quarantine_pause_s == 3.0
    gpus = GpuInventory(1, ("NVIDIA H200",)) if device == "cuda" else GpuInventory(0, ())
    options = MatrixOptions(device=device, models=("transformer_tiny",), modes=("single",), world_sizes=(1,))
    settings = plan(options, gpus, 16)[0].spec.settings
    assert (settings.steps, settings.warmup_min, settings.warmup_tolerance) == (17, 3, 0.2)
    assert (settings.target_median_ci, settings.loader_workers) == (0.5, 2)


def test_an_unknown_device_gets_the_gpu_row() -> None:
    assert defaults_for("xpu") is DEVICES["cuda"] and defaults_for("cpu") is DEVICES["cpu"]
