"""One run of one case: hand it to a set of ranks that never ran it, watch the GPUs while they run, fold the
ranks into its ``RunRecord`` and say whether the machine let it be evidence."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from scaleguard.case import CaseSpec
from scaleguard.evidence.records import phase_breakdown
from scaleguard.evidence.runs import DISTURBED, RunRecord
from scaleguard.machine import foreign_load
from scaleguard.machine import state as machine_state
from scaleguard.ranks import launcher, protocol


def run_once(
    spec: CaseSpec,
    run_dir: Path,
    timeout_s: float,
    foreign_limit_cores: float | None = None,
    interpreter: protocol.Interpreter | None = None,
    pools: launcher.Pools | None = None,
) -> RunRecord:
    """Measure ``spec`` once: in ``pools`` (processes that have not run this case), or in
    fresh processes.

    Args:
        foreign_limit_cores: quarantine the run when processes not of this session used more
            CPU than this during the measured steps (or any used its GPUs); None: not checked.
        interpreter: the Python (and extra environment) of the ranks; None: this one.
        pools: the session's rank pool; None: fresh processes for this run alone.

    Raises:
        protocol.CaseFailedError: a rank raised, died, hung or left no result.
    """
    gpus = spec.world_size if spec.device == "cuda" else 0
    if spec.settings.shared_gpu:  # ranks share the GPUs: watch the devices that exist
        from scaleguard.machine.env import gpu_inventory

        gpus = min(gpus, gpu_inventory().count)
    monitor = machine_state.CaseMonitor(gpus)
    load = foreign_load.LoadMonitor()

    def tick() -> None:
        monitor.tick()
        if foreign_limit_cores is not None:
            load.tick()

    started, started_unix = time.monotonic(), time.time()
    ranks = launcher.run_case(spec, run_dir, timeout_s, tick, interpreter, pools)
    wall_s = time.monotonic() - started
    rank0 = min(ranks, key=lambda r: r.rank)
    phases = phase_breakdown(rank0, started_unix, started_unix + wall_s, rank0.warmup_step_s)
    result = replace(RunRecord.from_ranks(spec, ranks), wall_s=wall_s, phases_s=phases)
    window = (min(r.measure_start_unix for r in ranks), max(r.measure_end_unix for r in ranks))
    if foreign_limit_cores is not None:
        result = _judge_load(result, load.report(window, monitor.gpu_pids), foreign_limit_cores)
    if not monitor.samples:
        return result
    during = monitor.during(*window)
    # a run shorter than the sampling period may have no reading inside its window: use the
    # nearest ones rather than none
    assessment = machine_state.assess(during or monitor.samples)
    notes = result.notes
    if assessment.quarantine:
        notes += (f"quarantined: {assessment.quarantine}",)
    elif "sw_power_cap" in assessment.readings.get("reasons", ()):
        notes += ("GPU at its SW power cap during the steps (recorded; clocks stayed up)",)
    reasons = [r for r in (result.quarantine, assessment.quarantine) if r]
    return replace(
        result,
        gpu=dict(assessment.readings),
        gpu_whole_run=monitor.summary(),
        quarantine="; ".join(reasons) or None,
        notes=notes,
    )


def _judge_load(result: RunRecord, report: foreign_load.LoadReport | None, limit: float) -> RunRecord:
    if report is None:
        return result
    why = report.disturbed(limit)
    return replace(
        result,
        host={**result.host, **report.to_dict()},
        quarantine=f"{DISTURBED}{why}" if why else result.quarantine,
        notes=result.notes + ((f"{DISTURBED}{why}",) if why else ()),
    )
