"""GPU clocks, temperature, power and throttle reasons around each case, read through NVML.

NVML (the ``nvidia-ml-py`` package, extra ``[gpu]``) answers without a CUDA context, so the
pytest process can ask. Absent package or no GPU: no readings, and nothing is marked throttled.
A case measured while the GPU slowed itself down is marked, and its slowdown is never judged a
regression on that evidence alone.
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


def throttle_reasons(*snapshots: tuple[GpuState, ...] | None) -> list[str]:
    """Throttling seen in any snapshot, as ``gpu<i>: reason`` strings."""
    seen = []
    for states in snapshots:
        for state in states or ():
            seen += [f"gpu{state.index}: {r}" for r in state.reasons if r in THROTTLING]
    return sorted(set(seen))


class CaseMonitor:
    """Samples the case's GPUs about once a second while its ranks run, so a throttle that
    starts and ends inside the case is seen too (before/after readings alone would miss it)."""

    def __init__(self, device_count: int, period_s: float = 1.0) -> None:
        self.device_count = device_count
        self.period_s = period_s
        self.samples: list[tuple[GpuState, ...]] = []
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
