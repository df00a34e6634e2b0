"""Records of a run from the rank to the file: ``RankResult`` and ``RankFailure`` (each rank's
own file) and ``RunResult`` (the ranks of one run folded, slowest rank per step).

They are read through the one validating reader in ``document`` and re-exported here for the
readers that take a run's file and its fields together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scaleguard.case import CaseSpec
from scaleguard.evidence.document import (
    ID_PATTERN,
    MAX_FILE_BYTES,
    MAX_ITEMS,
    MAX_SAMPLES,
    MAX_STEP_S,
    Fields,
    FileFormatError,
    atomic_write_json,
    atomic_write_text,
    content_id,
    read_document,
)
from scaleguard.evidence.stats import StepSummary, slowest_rank_steps
from scaleguard.evidence.steady import WarmupPolicy
from scaleguard.schema import SCHEMA_VERSION

__all__ = [
    "ID_PATTERN",
    "MAX_FILE_BYTES",
    "MAX_ITEMS",
    "MAX_SAMPLES",
    "MAX_STEP_S",
    "Fields",
    "FileFormatError",
    "RankFailure",
    "RankResult",
    "RunResult",
    "atomic_write_json",
    "atomic_write_text",
    "content_id",
    "phase_breakdown",
    "read_document",
]


@dataclass(frozen=True)
class RankResult:
    """What one rank measured, written by the rank to ``rank<k>.result.json``."""

    case_id: str
    rank: int
    step_s: tuple[float, ...]
    warmup_step_s: tuple[float, ...]
    steady: bool
    final_loss: float
    peak_mem_bytes: int
    mem_kind: str  # "cuda_max_allocated" or "host_max_rss"
    device_name: str
    runtime: dict[str, str | None]  # torch/cuda/cudnn/nccl as the rank saw them
    settings: dict[str, Any]  # speed knobs as applied inside the rank
    measure_start_unix: float = 0.0  # wall clock around the measured steps: GPU readings are
    measure_end_unix: float = 0.0  # filtered to this window
    phase_unix: dict[str, float] = field(default_factory=dict)  # when each rank phase began
    anatomy: dict[str, Any] = field(default_factory=dict)  # anatomy.Anatomy, read by RunRecord
    anatomy_lost: str = ""  # why this rank has no anatomy though one was asked for
    pid: int = 0  # the rank's process: two runs of one case never share one (launcher)
    process_runs_before: int = 0  # runs this process made before this one (0: fresh)
    flops_per_step: float = 0.0  # this process's training FLOPs per step (scaleguard.workloads.flops)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "rank result") -> RankResult:
        f = Fields.of(data, where, "a scaleguard bug: report it with this file").known(_field_names(cls))
        return cls(
            case_id=str(f.ident("case_id")),
            rank=int(f.integer("rank", 0, 1_000_000) or 0),
            step_s=f.samples("step_s", min_len=1),
            warmup_step_s=f.samples("warmup_step_s", min_len=0),
            steady=f.flag("steady"),
            final_loss=float(f.number("final_loss", -math.inf, math.inf) or 0.0),
            peak_mem_bytes=int(f.integer("peak_mem_bytes") or 0),
            mem_kind=f.string("mem_kind"),
            device_name=f.string("device_name"),
            runtime=f.versions("runtime"),
            settings=f.scalars("settings"),
            measure_start_unix=float(f.number("measure_start_unix", optional=True) or 0.0),
            measure_end_unix=float(f.number("measure_end_unix", optional=True) or 0.0),
            phase_unix=f.floats("phase_unix", 0.0, 1e11),
            anatomy=f.raw_dict("anatomy", optional=True),
            anatomy_lost=f.text("anatomy_lost", optional=True) or "",
            pid=int(f.integer("pid", optional=True) or 0),
            process_runs_before=int(f.integer("process_runs_before", optional=True) or 0),
            flops_per_step=float(f.number("flops_per_step", 0.0, 1e21, optional=True) or 0.0),
            schema_version=f.version(),
        )


def _field_names(cls: type) -> frozenset[str]:
    import dataclasses

    return frozenset(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed, written by the rank to ``rank<k>.error.json`` before it exits."""

    case_id: str
    rank: int
    phase: str
    exc_type: str
    message: str
    traceback: str
    unix_time: float
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "rank error") -> RankFailure:
        f = Fields.of(data, where, "a scaleguard bug: report it with this file").known(_field_names(cls))
        return cls(
            case_id=str(f.ident("case_id")),
            rank=int(f.integer("rank", 0, 1_000_000) or 0),
            phase=f.string("phase"),
            exc_type=f.string("exc_type"),
            message=f.string("message"),
            traceback=f.string("traceback"),
            unix_time=float(f.number("unix_time") or 0.0),
            schema_version=f.version(),
        )


@dataclass(frozen=True)
class RunResult:
    """One run of a case (one fresh set of rank processes): the slowest rank per step, and what
    follows from it. ``RunRecord`` (``evidence.py``) is its stored, comparable form."""

    spec: CaseSpec
    step_s: tuple[float, ...]  # slowest rank per measured step
    summary: StepSummary
    samples_per_s: float
    peak_mem_bytes: tuple[int, ...]  # per rank
    mem_kind: str
    warmup_steps: int
    steady: bool
    device_name: str
    runtime: dict[str, str | None]
    settings: dict[str, Any]
    notes: tuple[str, ...] = field(default=())
    machine_state: dict[str, Any] = field(default_factory=dict)  # NVML readings, if any
    quarantine: str | None = None  # why this run is no evidence (throttled GPU, ...)
    wall_s: float = 0.0  # the run's wall time in the parent, start-up included
    phases_s: dict[str, float] = field(default_factory=dict)  # where the wall time went
    run_id: str = ""  # torchrun: ties the record to the job that wrote it
    anatomy: dict[str, Any] = field(default_factory=dict)  # rank 0's step anatomy, if measured
    process_runs_before: int = 0  # runs its processes made before it (0: fresh; launcher pools)
    flops_per_step: float = 0.0  # one process's training FLOPs per step (rank 0's count)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_ranks(cls, spec: CaseSpec, ranks: Sequence[RankResult]) -> RunResult:
        ranks = sorted(ranks, key=lambda r: r.rank)
        step_s = slowest_rank_steps([r.step_s for r in ranks])
        summary = StepSummary.of(step_s)
        notes = []
        if not all(r.steady for r in ranks):
            # every rank holds the same (agreed, slowest-rank) warmup steps: the parent can say
            # which steadiness test the last one failed
            why = WarmupPolicy.of(spec.settings).unsteady_because(ranks[0].warmup_step_s)
            notes.append(
                f"warmup reached its cap of {spec.settings.warmup_max} steps before the step time "
                f"settled ({why})"
            )
        lost = [r.anatomy_lost for r in ranks if r.anatomy_lost]
        if lost:
            notes.append("step anatomy lost (the measured steps stand): " + "; ".join(lost))
        return cls(
            spec=spec,
            step_s=step_s,
            summary=summary,
            samples_per_s=spec.global_batch / summary.median_s,
            peak_mem_bytes=tuple(r.peak_mem_bytes for r in ranks),
            mem_kind=ranks[0].mem_kind,
            warmup_steps=max(len(r.warmup_step_s) for r in ranks),
            steady=all(r.steady for r in ranks),
            device_name=ranks[0].device_name,
            runtime=ranks[0].runtime,
            settings=ranks[0].settings,
            notes=tuple(notes),
            anatomy={} if lost else ranks[0].anatomy,
            process_runs_before=max(r.process_runs_before for r in ranks),
            flops_per_step=ranks[0].flops_per_step,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "run record") -> RunResult:
        f = Fields.of(data, where, "re-run the case to write a fresh record")
        f.known(_field_names(cls))
        spec = CaseSpec.from_fields(f.obj("spec"))
        step_s = f.samples("step_s")
        peak = f.byte_counts("peak_mem_bytes")
        summary = StepSummary.of(step_s)
        return cls(
            spec=spec,
            step_s=step_s,
            summary=summary,
            samples_per_s=spec.global_batch / summary.median_s,
            peak_mem_bytes=peak,
            mem_kind=f.string("mem_kind"),
            warmup_steps=int(f.integer("warmup_steps", 0, 1_000_000) or 0),
            steady=f.flag("steady", True),
            device_name=f.string("device_name"),
            runtime=f.versions("runtime"),
            settings=f.scalars("settings"),
            notes=tuple(str(n) for n in f.items("notes", optional=True)),
            machine_state=f.raw_dict("machine_state", optional=True),
            quarantine=f.text("quarantine", optional=True),
            wall_s=float(f.number("wall_s", optional=True) or 0.0),
            phases_s=f.floats("phases_s", 0.0, 1e9),
            run_id=f.text("run_id", optional=True) or "",
            anatomy=f.raw_dict("anatomy", optional=True),
            process_runs_before=int(f.integer("process_runs_before", optional=True) or 0),
            flops_per_step=float(f.number("flops_per_step", 0.0, 1e21, optional=True) or 0.0),
        )


def phase_breakdown(
    rank0: RankResult, spawned_unix: float, ended_unix: float, warmup_step_s: Sequence[float]
) -> dict[str, float]:
    """Seconds per phase of one run, from the parent's spawn to the ranks' exit (rank 0's
    clock; it waits for its peers at every collective). Missing stamps count as zero."""
    stamps = rank0.phase_unix
    configure = stamps.get("configure", spawned_unix)
    pg = stamps.get("init_process_group", stamps.get("build model and batches", configure))
    build = stamps.get("build model and batches", pg)
    warm = stamps.get("warmup", rank0.measure_start_unix or build)
    first = float(warmup_step_s[0]) if warmup_step_s else 0.0
    anatomy_at = stamps.get("step anatomy", rank0.measure_end_unix)
    phases = {
        "process start and imports": configure - spawned_unix,
        "settings and device init": pg - configure,
        "process group init": build - pg,
        "model and batches": warm - build,
        "first step": first,
        "warmup": rank0.measure_start_unix - warm - first,
        "measured steps": rank0.measure_end_unix - rank0.measure_start_unix,
        "step anatomy": stamps.get("writing result", anatomy_at) - anatomy_at,
        "result and teardown": ended_unix - stamps.get("writing result", rank0.measure_end_unix),
    }
    return {k: round(max(0.0, v), 4) for k, v in phases.items()}
