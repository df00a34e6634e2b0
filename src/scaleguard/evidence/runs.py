"""A case's evidence: its runs. ``RunRecord`` is the one shape of a run, from the ranks' folded
results to the baseline, the saved pytest-benchmark run and the history; ``CaseEvidence`` is one
case's runs under one configuration and torch version.
"""

from __future__ import annotations

import datetime
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from scaleguard.case import CaseSpec
from scaleguard.evidence.anatomy import Anatomy
from scaleguard.evidence.files import (
    ID_PATTERN,
    MAX_ID_CHARS,
    Fields,
    FileFormatError,
    read_byte_counts,
    read_flag,
    read_floats,
    read_ident,
    read_int,
    read_number,
    read_object,
    read_samples,
    read_scalars,
    read_text,
    read_texts,
    read_versions,
    record_from_fields,
    record_to_dict,
    stored,
)
from scaleguard.evidence.projection import ScalingInputs
from scaleguard.evidence.records import RankResult
from scaleguard.evidence.stats import StepSummary, median_ci_halfwidth, slowest_rank_steps
from scaleguard.evidence.steady import WarmupPolicy

# the quarantine of a run that processes not of this session disturbed (schedule.runner)
DISTURBED = "disturbed: "


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


def _rank_ms(ranks: Sequence[RankResult]) -> dict[str, Any]:
    """Every rank's anatomy categories (all or none: a rank without one leaves the others
    without their reference)."""
    if not all(r.anatomy.get("ms") for r in ranks):
        return {}
    return {str(r.rank): {k: round(float(v), 4) for k, v in r.anatomy["ms"].items()} for r in ranks}


def _scaling(spec: CaseSpec, ranks: Sequence[RankResult]) -> ScalingInputs | None:
    """Rank 0's projection inputs, with every rank's compute-only step (a straggler's shows)."""
    if not ranks[0].scaling:
        return None
    inputs = ScalingInputs.from_dict(ranks[0].scaling, f"{spec.case_id} scaling", "a scaleguard bug")
    mine = [ScalingInputs.from_dict(r.scaling, f"{spec.case_id} rank {r.rank} scaling", "a scaleguard bug")
            for r in ranks if r.scaling]  # fmt: skip
    if len(mine) != len(ranks) or len(ranks) < 2:
        return inputs
    return replace(inputs, rank_compute_ms=tuple(round(sum(s.phase_ms.values()), 4) for s in mine))


def _anatomy_stored(anatomy: Anatomy | None) -> dict[str, Any] | None:
    # the trace is a file of the machine that ran it: not stored with the run
    return replace(anatomy, trace=None).to_dict() if anatomy else None


def _read_anatomy(f: Fields, key: str) -> Anatomy:
    return Anatomy.from_dict(f.data[key], f"{f.where}.{key}", f.fix)


def _read_scaling(f: Fields, key: str) -> ScalingInputs:
    return ScalingInputs.from_dict(f.data[key], f"{f.where}.{key}", f.fix)


def _scaling_stored(inputs: ScalingInputs | None) -> dict[str, Any] | None:
    return inputs.to_dict() if inputs else None


@dataclass(frozen=True)
class RunRecord:
    """One run of one case (one set of rank processes), in the one shape it has from the ranks
    to the baseline, the saved pytest-benchmark run and the history: the slowest rank per
    measured step, what follows from it, and what the machine did meanwhile.

    ``RunRecord.from_ranks`` folds the ranks' results; the ledger then names the run
    (``run_id``, ``session``, ``commit``) and attaches the session's machine probe.
    ``scaling_efficiency`` is this run's samples/s over world size times the samples/s of the
    world-size-1 runs of the same group in the same session (their geometric mean).
    """

    run_id: str = stored(read_text)  # "<session>-<n>": unique per run ("" until the ledger names it)
    session: str = stored(read_text)  # the pytest session (or torchrun job) that measured it
    summary: StepSummary = stored(None)  # of the steps below: derived, recomputed on load
    step_s: tuple[float, ...] = stored(read_samples(), write=lambda s: [round(x, 9) for x in s])  # ns
    samples_per_s: float = stored(read_number(1e-12))
    peak_mem_bytes: int = stored(read_int())  # the largest rank's
    warmup_steps: int = stored(read_int(0, 1_000_000), default=0)
    scaling_efficiency: float | None = stored(read_number(0.0, 1e3), default=None)
    speedup: float | None = stored(read_number(0.0, 1e6), default=None)
    recorded_at: str = stored(read_text, default="")
    commit: str | None = stored(read_text, default=None)
    quarantine: str | None = stored(read_text, default=None)  # why the run is no evidence (throttled, ...)
    accepted: str | None = stored(read_text, default=None)  # --perf-accept reason for a non-OK run
    gpu: dict[str, Any] = stored(read_object, default_factory=dict)  # clocks/power/temperature in the steps
    host: dict[str, Any] = stored(read_object, default_factory=dict)  # foreign load; a cluster step's facts
    wall_s: float = stored(read_number(), default=0.0)  # the run's wall time in the parent, start-up included
    phases_s: dict[str, float] = stored(read_floats(0.0, 1e9), default_factory=dict)  # where it went
    anatomy: Anatomy | None = stored(_read_anatomy, write=_anatomy_stored, default=None)  # rank 0's
    process_runs_before: int = stored(read_int(), default=0)  # runs its processes made before it
    flops_per_step: float = stored(read_number(0.0, 1e21), default=0.0)  # one process's, per step
    machine: dict[str, float] = stored(read_floats(0.0, 1e15), default_factory=dict)  # the session's probe
    # as the ranks saw it (schema 3; runs of older files read these as unknown)
    steady: bool = stored(read_flag, default=True)  # every rank's warmup settled
    mem_kind: str = stored(read_text, default="")  # "cuda_max_allocated" or "host_max_rss"
    rank_peak_mem_bytes: tuple[int, ...] = stored(read_byte_counts, default=())  # per rank
    device_name: str = stored(read_text, default="")
    runtime: dict[str, str | None] = stored(read_versions, default_factory=dict)  # torch/cuda/cudnn/nccl
    settings: dict[str, Any] = stored(read_scalars, default_factory=dict)  # speed knobs as applied
    notes: tuple[str, ...] = stored(read_texts, default=())  # what a reader of the run should know
    gpu_whole_run: dict[str, Any] = stored(read_object, default_factory=dict)  # GPUs over the whole run
    # per rank ("0", "1" ...): its node, bound CPUs, visible devices and the Slurm step's grant
    placement: dict[str, Any] = stored(read_object, default_factory=dict)
    # per rank ("0", "1" ...): its step anatomy's ms per category (forward, backward, optimizer,
    # data, exposed communication): a slow rank shows as its own compute, not as rank 0's wait.
    # 5 numbers a rank: about 150 bytes of JSON per rank and run (77 kB at 512 ranks)
    rank_ms: dict[str, Any] = stored(read_object, default_factory=dict)
    # a DDP run's projection inputs (rank 0's; evidence.projection): schema 5
    scaling: ScalingInputs | None = stored(_read_scaling, write=_scaling_stored, default=None)

    @property
    def median_s(self) -> float:
        return self.summary.median_s

    @property
    def median_ci(self) -> float:
        """How precisely this run pinned its median (relative 95 % half-width)."""
        return median_ci_halfwidth(self.step_s)

    @property
    def disturbed(self) -> bool:
        """Quarantined because processes not of this session loaded the machine."""
        return self.quarantine is not None and self.quarantine.startswith(DISTURBED)

    @classmethod
    def from_ranks(cls, spec: CaseSpec, ranks: Sequence[RankResult]) -> RunRecord:
        """Fold one run's rank results: a step takes as long as its slowest rank."""
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
        anatomy = ranks[0].anatomy
        return cls(
            run_id="",
            session="",
            summary=summary,
            step_s=step_s,
            samples_per_s=spec.global_batch / summary.median_s,
            peak_mem_bytes=max(r.peak_mem_bytes for r in ranks),
            rank_peak_mem_bytes=tuple(r.peak_mem_bytes for r in ranks),
            mem_kind=ranks[0].mem_kind,
            warmup_steps=max(len(r.warmup_step_s) for r in ranks),
            steady=all(r.steady for r in ranks),
            device_name=ranks[0].device_name,
            runtime=dict(ranks[0].runtime),
            settings=dict(ranks[0].settings),
            notes=tuple(notes),
            anatomy=(
                Anatomy.from_dict(anatomy, f"{spec.case_id} anatomy", "a scaleguard bug")
                if anatomy and not lost
                else None
            ),
            process_runs_before=max(r.process_runs_before for r in ranks),
            flops_per_step=ranks[0].flops_per_step,
            placement={str(r.rank): dict(r.placement) for r in ranks if r.placement},
            rank_ms=_rank_ms(ranks) if len(ranks) > 1 and not lost else {},
            scaling=_scaling(spec, ranks) if not lost else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return record_to_dict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str, fix: str) -> RunRecord:
        f = Fields.of(data, where, fix)
        step_s = f.samples("step_s")
        # the samples are the truth: the summary is recomputed from them
        return record_from_fields(cls, f, step_s=step_s, summary=StepSummary.of(step_s))


def _read_runs(f: Fields, key: str) -> tuple[RunRecord, ...]:
    return tuple(RunRecord.from_dict(r, f"{f.where}.{key}[{i}]", f.fix) for i, r in enumerate(f.items(key)))


# written beside an entry's runs for readers of the file, recomputed from the runs on load
_DERIVED = frozenset({"median_step_s", "run_spread"})


@dataclass(frozen=True)
class CaseEvidence:
    """The runs of one case under one configuration and torch version: a baseline entry, a
    saved run's case, or what this session measured."""

    case_id: str = stored(read_ident)
    group_id: str = stored(read_ident)
    world_size: int = stored(read_int(1, 1_000_000))
    config: dict[str, Any] = stored(read_scalars)  # what must match for two cases to be compared
    versions: dict[str, Any] = stored(read_scalars)  # torch/cuda/cudnn/nccl
    runs: tuple[RunRecord, ...] = stored(_read_runs, default=())

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
        return {
            **record_to_dict(self),
            # derived, for readers of the file; recomputed from the runs on load
            "median_step_s": self.median_s(),
            "run_spread": self.run_spread(),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str, fix: str) -> CaseEvidence:
        f = Fields.of(data, where, fix)
        if not f.items("runs"):
            raise f.fail("runs", "is empty: an entry needs at least one run")
        return record_from_fields(cls, f, extra_known=_DERIVED)

    @classmethod
    def from_schema1(cls, data: Any, where: str, fix: str) -> CaseEvidence:
        """A schema-1 baseline entry (one run's steps, no run structure), upgraded, as one run."""
        from scaleguard.evidence.upgrades import baseline_entry_from_1

        return cls.from_dict(baseline_entry_from_1(data, where, fix), where, fix)


# --- the torchrun record: one run and the case it measured, in one file ---------------------------
_RUN_FILE_FIELDS = frozenset({"schema_version", "spec", "run"})


def run_file(spec: CaseSpec, run: RunRecord) -> dict[str, Any]:
    """The record a torchrun (or Slurm) job's rank 0 writes for ``scaleguard ingest``: the case
    and its run; the run's ``session`` is the job's run id, which its marker must name."""
    from scaleguard.schema import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, "spec": spec.to_dict(), "run": run.to_dict()}


def read_run_file(data: Any, where: str, fix: str) -> tuple[CaseSpec, RunRecord]:
    """A torchrun record's case and run; a schema-2 record (the run's fields beside its spec)
    reads as the same run."""
    f = Fields.of(data, where, fix)
    if "run" not in f.data and "step_s" in f.data:
        from scaleguard.evidence.upgrades import run_file_from_2

        f = Fields(run_file_from_2(f), where, fix)
    f.known(_RUN_FILE_FIELDS)
    spec = CaseSpec.from_fields(f.obj("spec"))
    run = RunRecord.from_dict(f.obj("run").data, f"{where}.run", fix)  # "field 'run' is missing"
    _check_as_a_baseline_reads(run, where, fix)
    return spec, run


def _check_as_a_baseline_reads(run: RunRecord, where: str, fix: str) -> None:
    """What the baseline and the history will refuse, refused at read: a torch version that is
    no id (it keys the baseline's entry), threads that are no count. Accepted here, such a run
    was judged, then refused at the baseline write as "a scaleguard bug" after it had already
    landed in the history."""
    torch = run.runtime.get("torch")
    if torch is not None and not ID_PATTERN.fullmatch(torch):
        raise FileFormatError(
            f"{where}: the run's torch version {torch[:60]!r} is no version (1-{MAX_ID_CHARS} printable "
            f"characters without spaces); {fix}"
        )
    threads = run.settings.get("threads_per_rank")
    if threads is not None and (type(threads) is not int or not 1 <= threads <= 4096):
        raise FileFormatError(
            f"{where}: the run's settings.threads_per_rank is {str(threads)[:20]!r}, not a count of "
            f"threads (1-4096); {fix}"
        )
