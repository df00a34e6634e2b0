from __future__ import annotations

import sys
import types

import pytest

from scaleguard.machine import state as machine_state


def fake_pynvml(reasons_mask: int) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    calls = {"init": 0, "shutdown": 0}
    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    mod.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    mod.nvmlInit = lambda: calls.__setitem__("init", calls["init"] + 1)  # type: ignore[attr-defined]
    mod.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetClockInfo = lambda h, kind: 1410  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980  # type: ignore[attr-defined]
    mod.nvmlDeviceGetTemperature = lambda h, kind: 71  # type: ignore[attr-defined]
    mod.nvmlDeviceGetPowerUsage = lambda h: 650_000  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCurrentClocksEventReasons = lambda h: reasons_mask  # type: ignore[attr-defined]
    return mod


def test_snapshot_reads_every_used_gpu_and_names_throttling(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_pynvml(0x40 | 0x1)  # hw thermal slowdown + idle
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    states = machine_state.snapshot(2)
    assert states is not None and [s.index for s in states] == [2, 3]
    assert states[0].power_w == 650.0 and states[0].sm_clock_mhz == 1410
    assert states[0].reasons == ("gpu_idle", "hw_thermal_slowdown")
    assert machine_state.throttle_reasons(states, None) == [
        "gpu2: hw_thermal_slowdown",
        "gpu3: hw_thermal_slowdown",
    ]
    assert fake.calls == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]


def test_idle_is_not_throttling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0x1))
    assert machine_state.throttle_reasons(machine_state.snapshot(1)) == []


def test_no_nvml_or_no_gpu_gives_no_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine_state.snapshot(0) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert machine_state.snapshot(1) is None


def test_case_monitor_catches_a_throttle_between_before_and_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0x4))  # power capped mid-case
    monitor = machine_state.CaseMonitor(1, period_s=0.0)
    monitor.tick()
    monitor.tick()
    assert monitor.summary()["reasons"] == ["sw_power_cap"] and monitor.summary()["samples"] == 2
    assert machine_state.throttle_reasons(None, None, *monitor.samples) == ["gpu0: sw_power_cap"]
    assert machine_state.CaseMonitor(0).summary() == {}


def states(clock: int, *reasons: str, index: int = 0) -> tuple[machine_state.GpuState, ...]:
    return (machine_state.GpuState(index, clock, 1980, 70, 600.0, reasons),)


def test_sw_power_cap_alone_is_recorded_not_quarantined() -> None:
    verdict = machine_state.assess([states(1900, "sw_power_cap")] * 5)
    assert verdict.quarantine is None and verdict.readings["reasons"] == ["sw_power_cap"]
    assert verdict.readings["median_sm_clock_mhz"] == 1900


@pytest.mark.parametrize(
    "reason", ["hw_slowdown", "hw_power_brake_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"]
)
def test_hardware_and_thermal_slowdowns_quarantine(reason: str) -> None:
    verdict = machine_state.assess([states(1900), states(1900, reason)])
    assert verdict.quarantine is not None and reason in verdict.quarantine


def test_a_low_median_clock_quarantines_unless_clocks_are_locked() -> None:
    low = machine_state.assess([states(1200, "sw_power_cap")] * 3 + [states(1900)])
    assert low.quarantine is not None and "median SM clock 1200 MHz" in low.quarantine
    locked = machine_state.assess([states(1200, "applications_clocks_setting")] * 3)
    assert locked.quarantine is None and locked.clocks_locked and locked.readings["clocks_locked"]


def test_monitor_keeps_only_samples_inside_the_measured_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0x8))
    monitor = machine_state.CaseMonitor(1, period_s=0.0)
    monitor.tick()
    inside = monitor.times[-1]
    monitor.tick()
    assert len(monitor.during(inside, inside)) == 1
    assert machine_state.assess(monitor.during(inside, inside)).quarantine is not None
