"""A case's evidence: its runs. ``RunRecord`` is one run in stored, comparable form (baselines,
saved pytest-benchmark runs, the session's ledger); ``CaseEvidence`` is one case's runs under
one configuration and torch version.
"""

from __future__ import annotations

import datetime
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from scaleguard.evidence.anatomy import Anatomy
from scaleguard.evidence.records import Fields, RunResult, content_id
from scaleguard.evidence.stats import StepSummary, median_ci_halfwidth


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def config_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The parts of a case that change what is measured (not how long it is measured)."""
    settings = spec["settings"]
    return {
        "model": spec["model"],
        "mode": spec["mode"],
        "world_size": spec["world_size"],
        "precision": spec["precision"],
        "scaling": spec["scaling"],
        "inputs": spec["inputs"],
        "device": spec["device"],
        "profile": spec["profile"],
        "global_batch": spec["global_batch"],
        "threads_per_rank": settings["threads_per_rank"],
        "channels_last": settings["channels_last"],
        "cudnn_benchmark": settings["cudnn_benchmark"],
        "allow_tf32": settings["allow_tf32"],
        # only when on or set: every baseline recorded before these existed keeps matching
        **({"shared_gpu": True} if settings.get("shared_gpu") else {}),
        **({"nodes": settings["nodes"]} if settings.get("nodes", 1) > 1 else {}),
        **({"workload": spec["workload"]} if spec.get("workload") else {}),
    }


@dataclass(frozen=True)
class RunRecord:
    """One run of one case, as stored and compared.

    ``scaling_efficiency`` is this run's samples/s over world size times the samples/s of the
    world-size-1 runs of the same group in the same session (their geometric mean).
    """

    run_id: str  # "<session>-<n>": unique per run
    session: str  # the pytest session (or torchrun job) that measured it
    summary: StepSummary  # of this run's slowest-rank steps
    step_s: tuple[float, ...]  # the raw steps, for diagnostics and pytest-benchmark
    samples_per_s: float
    peak_mem_bytes: int  # the largest rank's
    warmup_steps: int = 0
    scaling_efficiency: float | None = None
    speedup: float | None = None
    recorded_at: str = ""
    commit: str | None = None
    quarantine: str | None = None  # why the run is no evidence: throttled, disturbed ...
    accepted: str | None = None  # --perf-accept reason, when a non-OK run was recorded on purpose
    gpu: dict[str, Any] = field(default_factory=dict)  # clocks/power/temperature during the steps
    host: dict[str, Any] = field(default_factory=dict)  # foreign CPU/GPU load during the steps
    wall_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)  # where the run's wall time went
    anatomy: Anatomy | None = None  # where a step's time went (scaleguard.evidence.anatomy)
    process_runs_before: int = 0  # runs its processes made before it (0: fresh processes)
    flops_per_step: float = 0.0  # one process's training FLOPs per step (scaleguard.workloads.flops)
    machine: dict[str, Any] = field(default_factory=dict)  # the session's machine probe

    @property
    def median_s(self) -> float:
        return self.summary.median_s

    @property
    def median_ci(self) -> float:
        """How precisely this run pinned its median (relative 95 % half-width)."""
        return median_ci_halfwidth(self.step_s)

    @classmethod
    def from_result(cls, result: RunResult, run_id: str, session: str, commit: str | None) -> RunRecord:
        return cls(
            run_id=run_id,
            session=session,
            summary=result.summary,
            step_s=result.step_s,
            samples_per_s=result.samples_per_s,
            peak_mem_bytes=max(result.peak_mem_bytes),
            warmup_steps=result.warmup_steps,
            recorded_at=utc_now(),
            commit=commit,
            quarantine=result.quarantine,
            gpu=dict(result.machine_state.get("during_steps") or {}),
            host={
                **(result.machine_state.get("foreign_load") or {}),
                # on a cluster: the step, its nodes and NCCL's transport between them
                **({"slurm": result.machine_state["slurm"]} if "slurm" in result.machine_state else {}),
            },
            wall_s=result.wall_s,
            phases_s=dict(result.phases_s),
            anatomy=(
                Anatomy.from_dict(result.anatomy, f"{result.spec.case_id} anatomy", "a scaleguard bug")
                if result.anatomy
                else None
            ),
            process_runs_before=result.process_runs_before,
            flops_per_step=result.flops_per_step,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary.to_dict()
        # the trace is a file of the machine that ran it: not stored with the run
        data["anatomy"] = replace(self.anatomy, trace=None).to_dict() if self.anatomy else None
        data["step_s"] = [round(s, 9) for s in self.step_s]  # ns: below any clock we read
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str, fix: str) -> RunRecord:
        f = Fields.of(data, where, fix).known(_RUN_FIELDS)
        step_s = f.samples("step_s")
        eff = f.number("scaling_efficiency", 0.0, 1e3, optional=True)
        speedup = f.number("speedup", 0.0, 1e6, optional=True)
        return cls(
            run_id=f.string("run_id"),
            session=f.string("session"),
            summary=StepSummary.of(step_s),  # recomputed: the samples are the truth
            step_s=step_s,
            samples_per_s=float(f.number("samples_per_s", 1e-12) or 0.0),
            peak_mem_bytes=int(f.integer("peak_mem_bytes") or 0),
            warmup_steps=int(f.integer("warmup_steps", optional=True) or 0),
            scaling_efficiency=eff,
            speedup=speedup,
            recorded_at=f.text("recorded_at", optional=True) or "",
            commit=f.text("commit", optional=True),
            quarantine=f.text("quarantine", optional=True),
            accepted=f.text("accepted", optional=True),
            gpu=f.raw_dict("gpu", optional=True),
            host=f.raw_dict("host", optional=True),
            wall_s=float(f.number("wall_s", optional=True) or 0.0),
            phases_s=f.floats("phases_s", 0.0, 1e9),
            anatomy=(
                Anatomy.from_dict(data["anatomy"], f"{where}.anatomy", fix)
                if isinstance(data, dict) and data.get("anatomy") is not None
                else None
            ),
            process_runs_before=int(f.integer("process_runs_before", optional=True) or 0),
            flops_per_step=float(f.number("flops_per_step", 0.0, 1e21, optional=True) or 0.0),
            machine=f.floats("machine", 0.0, 1e15),
        )


@dataclass(frozen=True)
class CaseEvidence:
    """The runs of one case under one configuration and torch version: a baseline entry, a
    saved run's case, or what this session measured."""

    case_id: str
    group_id: str
    world_size: int
    config: dict[str, Any]  # what must match for two cases to be compared
    versions: dict[str, Any]  # torch/cuda/cudnn/nccl
    runs: tuple[RunRecord, ...] = ()

    @property
    def torch(self) -> str:
        return str(self.versions.get("torch") or "unknown")

    @property
    def evidence(self) -> tuple[RunRecord, ...]:
        """Runs that count: quarantined runs (throttled, disturbed) are kept for the record only."""
        return tuple(r for r in self.runs if r.quarantine is None)

    @property
    def sessions(self) -> int:
        return len({r.session for r in self.evidence})

    def medians(self) -> list[float]:
        return [r.median_s for r in self.evidence]

    def efficiencies(self) -> list[float]:
        return [r.scaling_efficiency for r in self.evidence if r.scaling_efficiency is not None]

    def memories(self) -> list[float]:
        return [float(r.peak_mem_bytes) for r in self.evidence if r.peak_mem_bytes > 0]

    def gpu_busy_share(self) -> float | None:
        """How much of a measured step the GPU spends running kernels (median over the runs
        whose anatomy measured it; None when none did): near 1, the host runs ahead of the
        GPU and its speed does not move the step; well below 1, the GPU waits on the host."""
        shares = [
            min(1.0, r.anatomy.device_busy_ms / (r.median_s * 1e3))
            for r in self.evidence
            if r.anatomy is not None and r.anatomy.device_busy_ms is not None and r.median_s > 0
        ]
        return statistics.median(shares) if shares else None

    def median_s(self) -> float:
        """Geometric mean of the run medians: the case's step time."""
        meds = self.medians() or [r.median_s for r in self.runs]
        return float(math.exp(np.mean(np.log(meds))))

    def run_spread(self) -> float | None:
        """Run-to-run standard deviation of log run medians (about the relative spread)."""
        meds = self.medians()
        if len(meds) < 2:
            return None
        return float(np.std(np.log(meds), ddof=1))

    def samples_per_s(self) -> float:
        global_batch = self.config.get("global_batch")
        if isinstance(global_batch, int) and global_batch > 0:
            return global_batch / self.median_s()
        rates = [r.samples_per_s for r in self.evidence or self.runs]
        return float(np.mean(rates))

    def flops_per_step(self) -> float:
        flops = [r.flops_per_step for r in self.evidence or self.runs if r.flops_per_step > 0]
        return float(np.median(flops)) if flops else 0.0

    def tflops_per_gpu(self) -> float:
        """Achieved training TFLOPS per GPU (per process on CPU) at the case's step time."""
        from scaleguard.workloads.flops import achieved

        mode = str(self.config.get("mode"))
        nprocs = self.world_size if mode in ("ddp", "fsdp", "compile") else 1
        return achieved(self.flops_per_step(), self.median_s(), nprocs, self.world_size)

    def efficiency(self) -> float | None:
        effs = self.efficiencies()
        return float(np.mean(effs)) if effs else None

    def with_runs(self, runs: Sequence[RunRecord]) -> CaseEvidence:
        return replace(self, runs=tuple(runs))

    def to_dict(self) -> dict[str, Any]:
        spread = self.run_spread()
        return {
            "case_id": self.case_id,
            "group_id": self.group_id,
            "world_size": self.world_size,
            "config": self.config,
            "versions": self.versions,
            # derived, for readers of the file; recomputed from the runs on load
            "median_step_s": self.median_s(),
            "run_spread": spread,
            "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str, fix: str) -> CaseEvidence:
        f = Fields.of(data, where, fix).known(_EVIDENCE_FIELDS)
        runs = f.items("runs")
        if not runs:
            raise f.fail("runs", "is empty: an entry needs at least one run")
        return cls(
            case_id=str(f.ident("case_id")),
            group_id=str(f.ident("group_id")),
            world_size=int(f.integer("world_size", 1, 1_000_000) or 1),
            config=f.scalars("config"),
            versions=f.scalars("versions"),
            runs=tuple(RunRecord.from_dict(r, f"{where}.runs[{i}]", fix) for i, r in enumerate(runs)),
        )

    @classmethod
    def from_schema1(cls, data: Any, where: str, fix: str) -> CaseEvidence:
        """A schema-1 baseline entry (one run's steps, no run structure) as one run."""
        f = Fields.of(data, where, fix)
        step_s = f.samples("step_s")
        run = RunRecord(
            # the case and the samples in the id: entries without recorded_at must not collide
            run_id="schema1-"
            + content_id(f.data.get("case_id"), f.text("recorded_at", optional=True), step_s),
            session=f"schema1-{f.text('recorded_at', optional=True) or 'unknown'}",
            summary=StepSummary.of(step_s),
            step_s=step_s,
            samples_per_s=float(f.number("samples_per_s", 1e-12) or 0.0),
            peak_mem_bytes=int(f.integer("peak_mem_bytes") or 0),
            scaling_efficiency=f.number("scaling_efficiency", 0.0, 1e3, optional=True),
            speedup=f.number("speedup", 0.0, 1e6, optional=True),
            recorded_at=f.text("recorded_at", optional=True) or "",
            commit=f.text("commit", optional=True),
            quarantine="throttled (schema 1)" if f.flag("throttled") else None,
        )
        return cls(
            case_id=str(f.ident("case_id")),
            group_id=str(f.ident("group_id")),
            world_size=int(f.integer("world_size", 1, 1_000_000) or 1),
            config=f.scalars("config"),
            versions=f.scalars("versions"),
            runs=(run,),
        )


_RUN_FIELDS = frozenset(f.name for f in fields(RunRecord))
# median_step_s and run_spread are derived, written for readers of the file, recomputed on load
_EVIDENCE_FIELDS = frozenset(f.name for f in fields(CaseEvidence)) | {"median_step_s", "run_spread"}
