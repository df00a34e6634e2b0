"""One run of one case: launch a fresh set of ranks, watch the GPUs while they run, fold the
ranks into a ``RunResult`` and say whether the machine let it be evidence."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from scaleguard import launcher, machine_state
from scaleguard.case import CaseSpec
from scaleguard.records import RunResult


def run_once(spec: CaseSpec, run_dir: Path, timeout_s: float) -> RunResult:
    """Measure ``spec`` once in fresh processes.

    Raises:
        launcher.CaseFailedError: a rank raised, died, hung or left no result.
    """
    gpus = spec.world_size if spec.device == "cuda" else 0
    monitor = machine_state.CaseMonitor(gpus)
    started = time.monotonic()
    ranks = launcher.run_case(spec, run_dir, timeout_s, monitor.tick)
    wall_s = time.monotonic() - started
    result = replace(RunResult.from_ranks(spec, ranks), wall_s=wall_s)
    if not monitor.samples:
        return result
    window = (min(r.measure_start_unix for r in ranks), max(r.measure_end_unix for r in ranks))
    during = monitor.during(*window)
    # a run shorter than the sampling period may have no reading inside its window: use the
    # nearest ones rather than none
    assessment = machine_state.assess(during or monitor.samples)
    notes = result.notes
    if assessment.quarantine:
        notes += (f"quarantined: {assessment.quarantine}",)
    elif "sw_power_cap" in assessment.readings.get("reasons", ()):
        notes += ("GPU at its SW power cap during the steps (recorded; clocks stayed up)",)
    return replace(
        result,
        machine_state={"during_steps": assessment.readings, "whole_run": monitor.summary()},
        quarantine=assessment.quarantine,
        notes=notes,
    )
