"""GPU clocks, temperature, power and throttle reasons during each run, read through NVML.

NVML (the ``nvidia-ml-py`` package, extra ``[gpu]``) answers without a CUDA context, so the
pytest process can ask. Absent package or no GPU: no readings, and nothing is quarantined.

A run is *quarantined* (kept for the record, never evidence of a regression, measured again)
when, during its measured steps, the GPU reported a hardware slowdown, a hardware power brake or
a thermal slowdown, or its median SM clock was below ``LOW_CLOCK_FRACTION`` of the maximum.
The SW power cap alone is recorded but does not quarantine: a busy GPU at its power limit sets
it routinely (1-2 of 4 bs-256 fp32 cases per session on the H200) while running at full speed.
NVBench likewise calls a GPU throttled by its clock (below 75 % of default), not by a bit.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

# NVML clocks-event (throttle) reason bits; names as in nvml.h
_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# reasons that mean "slower than it could be" for a busy GPU (idle and settings are not)
THROTTLING = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
# the subset that quarantines a run; sw_power_cap alone is recorded only
QUARANTINING = THROTTLING - {"sw_power_cap"}
LOW_CLOCK_FRACTION = 0.80


@dataclass(frozen=True)
class GpuState:
    index: int
    sm_clock_mhz: int
    max_sm_clock_mhz: int
    temperature_c: int
    power_w: float
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_reasons(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in _REASONS.items() if mask & bit)


def _nvml_indices(count: int) -> list[int]:
    """NVML indices of the first ``count`` CUDA-visible devices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    picks = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return picks[:count] if picks else list(range(count))


def snapshot(device_count: int) -> tuple[GpuState, ...] | None:
    """Readings of the devices a case uses; None when NVML or GPUs are absent."""
    if device_count <= 0:
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        states = []
        for index in _nvml_indices(device_count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            get_reasons = (
                getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            states.append(
                GpuState(
                    index=index,
                    sm_clock_mhz=int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                    max_sm_clock_mhz=int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                    temperature_c=int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                    power_w=pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                    reasons=decode_reasons(int(get_reasons(handle))),
                )
            )
        return tuple(states)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def running_pids(device_count: int) -> set[int]:
    """Processes NVML sees computing on the first ``device_count`` visible GPUs."""
    if device_count <= 0:
        return set()
    try:
        import pynvml
    except ImportError:
        return set()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return set()
    try:
        pids: set[int] = set()
        for index in _nvml_indices(device_count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                pids.add(int(proc.pid))
        return pids
    except (pynvml.NVMLError, AttributeError):
        return set()
    finally:
        pynvml.nvmlShutdown()


def throttle_reasons(*snapshots: tuple[GpuState, ...] | None) -> list[str]:
    """Throttling seen in any snapshot, as ``gpu<i>: reason`` strings."""
    seen = []
    for states in snapshots:
        for state in states or ():
            seen += [f"gpu{state.index}: {r}" for r in state.reasons if r in THROTTLING]
    return sorted(set(seen))


class CaseMonitor:
    """Samples the run's GPUs about once a second while its ranks run, so a throttle that
    starts and ends inside the run is seen too (before/after readings alone would miss it)."""

    def __init__(self, device_count: int, period_s: float = 1.0) -> None:
        self.device_count = device_count
        self.period_s = period_s
        self.samples: list[tuple[GpuState, ...]] = []
        self.times: list[float] = []  # unix time of each sample, to select the measured steps
        self.gpu_pids: set[int] = set()  # every process seen computing on the run's GPUs
        self._last = float("-inf")

    def tick(self) -> None:
        import time

        now = time.monotonic()
        if self.device_count <= 0 or now - self._last < self.period_s:
            return
        self._last = now
        states = snapshot(self.device_count)
        if states is not None:
            self.samples.append(states)
            self.times.append(time.time())
            self.gpu_pids |= running_pids(self.device_count)

    def during(self, start_unix: float, end_unix: float) -> list[tuple[GpuState, ...]]:
        """Samples taken while the ranks ran their measured steps."""
        return [s for s, t in zip(self.samples, self.times, strict=True) if start_unix <= t <= end_unix]

    def summary(self) -> dict[str, Any]:
        """Lowest SM clock, highest temperature and power, and every reason seen."""
        flat = [state for states in self.samples for state in states]
        if not flat:
            return {}
        return {
            "samples": len(self.samples),
            "min_sm_clock_mhz": min(s.sm_clock_mhz for s in flat),
            "max_temperature_c": max(s.temperature_c for s in flat),
            "max_power_w": max(s.power_w for s in flat),
            "reasons": sorted({r for s in flat for r in s.reasons}),
        }


@dataclass(frozen=True)
class Assessment:
    """The GPUs during one run's measured steps, and whether that run is evidence."""

    readings: dict[str, Any]  # median/min SM clock, max clock, power, temperature, reasons
    quarantine: str | None  # why the run is no evidence, or None
    clocks_locked: bool  # application clocks set: a different configuration from boost clocks


def assess(samples: list[tuple[GpuState, ...]]) -> Assessment:
    """Apply the quarantine rule to the readings taken during the measured steps."""
    flat = [state for states in samples for state in states]
    if not flat:
        return Assessment({}, None, False)
    import statistics

    reasons = sorted({r for s in flat for r in s.reasons})
    per_gpu_median = {
        index: statistics.median(s.sm_clock_mhz for s in flat if s.index == index)
        for index in sorted({s.index for s in flat})
    }
    max_clock = max(s.max_sm_clock_mhz for s in flat)
    locked = "applications_clocks_setting" in reasons
    readings = {
        "samples": len(samples),
        "median_sm_clock_mhz": min(per_gpu_median.values()),
        "min_sm_clock_mhz": min(s.sm_clock_mhz for s in flat),
        "max_sm_clock_mhz": max_clock,
        "max_temperature_c": max(s.temperature_c for s in flat),
        "max_power_w": max(s.power_w for s in flat),
        "reasons": reasons,
        "clocks_locked": locked,
    }
    found = [f"gpu{s.index}: {r}" for s in flat for r in s.reasons if r in QUARANTINING]
    why = []
    if found:
        why.append("GPU slowed itself down (" + ", ".join(sorted(set(found))) + ")")
    slowest_index, slowest = min(per_gpu_median.items(), key=lambda kv: kv[1])
    if not locked and max_clock > 0 and slowest < LOW_CLOCK_FRACTION * max_clock:
        why.append(
            f"gpu{slowest_index} median SM clock {slowest:.0f} MHz during the steps is below "
            f"{LOW_CLOCK_FRACTION:.0%} of its {max_clock} MHz maximum"
        )
    return Assessment(readings, "; ".join(why) or None, locked)
