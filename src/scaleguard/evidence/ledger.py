"""The session's ledger: every run measured in this session, grouped per case; the verdicts
against the baseline; and which cases may enter the baseline file.

It launches nothing (``session.py`` schedules runs, ``runner.py`` makes one), so ``scaleguard
ingest`` feeds it torchrun records through the same judge and the same baseline merge.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from scaleguard.case import PROJECTED_MODES, CaseSpec
from scaleguard.devices import defaults_for
from scaleguard.evidence import baseline
from scaleguard.evidence.baseline import BaselineFile
from scaleguard.evidence.projection import Projection, project, time_shared
from scaleguard.evidence.runs import CaseEvidence, RunRecord, config_of, utc_now
from scaleguard.evidence.verdict import (
    CaseRule,
    Status,
    Thresholds,
    Verdict,
    against_projection,
    decide,
    thresholds_for,
)


@dataclass
class BaselineContext:
    """What the verdicts compare against and how updates are made, decided once per session."""

    path: Path
    file: BaselineFile | None  # None: no baseline recorded for this hardware yet
    hardware_key: str
    hardware: dict[str, Any]
    torch_pick: str | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    per_case: Sequence[str | CaseRule] = ()
    commit: str | None = None
    keep_runs: int = baseline.DEFAULT_KEEP_RUNS
    accept: tuple[str, ...] = ()  # case-id globs the user accepts whatever their verdict
    accept_reason: str | None = None

    def reason_missing(self, case_id: str) -> str:
        if self.file is None:
            return (
                f"no baseline for hardware {self.hardware_key} ({self.path} does not exist; "
                "record one with --perf-update-baselines --perf-repeats 3)"
            )
        if self.file.hardware_key != self.hardware_key:
            return (
                f"{self.path} was recorded on {self.file.hardware_key}, this is "
                f"{self.hardware_key}: other hardware is never compared"
            )
        pick = f" for torch {self.torch_pick}" if self.torch_pick else ""
        return f"no baseline entry for {case_id}{pick} in {self.path}"

    def entry(self, case_id: str) -> CaseEvidence | None:
        if self.file is None or self.file.hardware_key != self.hardware_key:
            return None
        return self.file.entry(case_id, self.torch_pick)

    def thresholds_for(self, case_id: str) -> Thresholds:
        return thresholds_for(case_id, self.thresholds, self.per_case)

    def accepted(self, case_id: str) -> bool:
        return any(fnmatch.fnmatchcase(case_id, pattern) for pattern in self.accept)


# verdicts whose runs enter the baseline without being accepted; IMPROVED restarts the entry
# BELOW-PROJECTION judges the case against its own projection, not the baseline: what it
# measured is what this machine does, and the next night is judged against it
_RECORDABLE = (Status.OK, Status.NEW, Status.IMPROVED, Status.BELOW_PROJECTION)


@dataclass(frozen=True)
class BaselineUpdate:
    """The outcome of writing a session into its baseline: the report prints it, the CLI turns
    ``refused`` into its exit code."""

    path: Path
    written: tuple[str, ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()  # (case id, why), sorted
    restarted: frozenset[str] = frozenset()
    refused: str | None = None  # why nothing was written: "interrupted" or the file's error


class Ledger:
    """Runs of this session per case, their verdicts, and the baseline merge."""

    def __init__(self, session_id: str, baselines: BaselineContext | None = None) -> None:
        self.session_id = session_id
        self.baselines = baselines
        self.specs: dict[str, CaseSpec] = {}
        self.records: dict[str, list[RunRecord]] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.failures: dict[str, str] = {}
        self.completed: set[str] = set()  # cases measured to the end (all scheduled runs)
        self._runs = 0
        # the session's machine probe (scaleguard.machine.probe), stored with every run
        self.machine: dict[str, Any] = {}

    def add(
        self, spec: CaseSpec, run: RunRecord, session: str | None = None, run_id: str | None = None
    ) -> RunRecord:
        """Name one run of ``spec`` (``<session>-<n>``, or ``run_id`` where the run's identity comes
        from its content: an ingested record), stamp it with the commit and the session's machine
        probe, and keep it (efficiency is attached when the evidence is read)."""
        self._runs += 1
        session = session or self.session_id
        run = replace(
            run,
            run_id=run_id or f"{session}-{self._runs}",
            session=session,
            recorded_at=utc_now(),
            commit=self.baselines.commit if self.baselines else None,
            machine=dict(self.machine) if self.machine else run.machine,
        )
        self.specs[spec.case_id] = spec
        self.records.setdefault(spec.case_id, []).append(run)
        return run

    def complete(self, case_id: str) -> None:
        """The case got all its scheduled runs and its verdict: only such cases are recorded."""
        self.completed.add(case_id)

    def fail(self, case_id: str, reason: str) -> None:
        self.failures[case_id] = reason

    def anchor(self, spec: CaseSpec) -> CaseSpec | None:
        """The world-size-1 case of ``spec``'s group measured in this session (its speedup's
        reference), or None (``spec`` is that case, or its group's ws1 was not measured)."""
        if spec.world_size == 1:
            return None
        case_id = self._ws1_case(spec.group_id)
        return None if case_id is None else self.specs[case_id]

    def ws1_samples_per_s(self, group_id: str) -> float | None:
        """The world-size-1 reference of a group: geometric mean of samples/s over the
        evidence runs of its ws1 case in this session. The one place speedup is anchored."""
        case_id = self._ws1_case(group_id)
        if case_id is None:
            return None
        rates = [r.samples_per_s for r in self.records[case_id] if r.quarantine is None]
        rates = rates or [r.samples_per_s for r in self.records[case_id]]
        return float(math.exp(np.mean(np.log(rates))))

    def projection(self, case_id: str) -> Projection | None:
        """What a DDP or FSDP case of world size > 1 should do, from its group's ws1 runs of this session
        (``evidence.projection``); None without them, or for ranks sharing one GPU."""
        spec = self.specs[case_id]
        anchor = self.anchor(spec)
        if anchor is None or spec.mode not in PROJECTED_MODES or spec.settings.shared_gpu:
            return None
        if self.projection_withheld(case_id):
            return None

        def evidence_runs(cid: str) -> list[RunRecord]:
            runs = self.records[cid]
            return [r for r in runs if r.quarantine is None] or list(runs)

        return project(
            evidence_runs(anchor.case_id), evidence_runs(case_id), anchor.per_rank_batch,
            spec.per_rank_batch, spec.world_size, anchor.global_batch, spec.global_batch,
            defaults_for(spec.device).comm_overlaps,
        )  # fmt: skip

    def projection_withheld(self, case_id: str) -> str | None:
        """Why a multi-rank case has no projection although it could: its last run's ranks
        time-shared a host's cores (``evidence.projection.time_shared``)."""
        runs = self.records.get(case_id) or []
        if self.specs[case_id].world_size < 2 or not runs:
            return None
        return time_shared(runs[-1].placement)

    def _ws1_case(self, group_id: str) -> str | None:
        return next(
            (cid for cid, s in self.specs.items() if s.group_id == group_id and s.world_size == 1), None
        )

    def evidence(self, case_id: str) -> CaseEvidence:
        """This session's runs of ``case_id``, with speedup and efficiency per run."""
        spec = self.specs[case_id]
        # ranks sharing a GPU (test mode) measure contention, not scaling: no efficiency
        reference = None if spec.settings.shared_gpu else self.ws1_samples_per_s(spec.group_id)
        runs = self.records[case_id]
        if reference is not None:
            runs = [
                replace(
                    r,
                    speedup=r.samples_per_s / reference,
                    scaling_efficiency=r.samples_per_s / reference / spec.world_size,
                )
                for r in runs
            ]
        last = self.records[case_id][-1]
        return CaseEvidence(
            case_id=case_id,
            group_id=spec.group_id,
            world_size=spec.world_size,
            config=config_of(spec.to_dict()),
            versions=dict(last.runtime),
            runs=tuple(runs),
        )

    def judge(self, case_id: str) -> Verdict | None:
        """Verdict of this session's runs of ``case_id`` (None when baselines are off)."""
        ctx = self.baselines
        if ctx is None:
            return None
        spec = self.specs[case_id]
        ws1_case = self._ws1_case(spec.group_id)
        ws1 = self.verdicts[ws1_case].status if ws1_case in self.verdicts else None
        verdict = decide(
            self.evidence(case_id),
            ctx.entry(case_id),
            ctx.thresholds_for(case_id),
            ws1_status=ws1,
            new_reason=ctx.reason_missing(case_id),
        )
        verdict = against_projection(
            verdict,
            self.evidence(case_id),
            self.projection(case_id),
            defaults_for(spec.device).projection_error_of(spec.mode),
        )
        self.verdicts[case_id] = verdict
        return verdict

    def baseline_additions(self) -> tuple[list[CaseEvidence], frozenset[str], dict[str, str]]:
        """What this session may add to the baseline: (entries, case ids that restart their
        entry, {case id: why left out}). A REGRESSED, INCONCLUSIVE or NOISY case, a quarantined
        run and a failed case are never recorded unless accepted by ``--perf-accept``."""
        ctx = self.baselines
        assert ctx is not None
        additions: list[CaseEvidence] = []
        restart: set[str] = set()
        left_out: dict[str, str] = {
            cid: f"failed: {why.splitlines()[0]}" for cid, why in self.failures.items()
        }
        for case_id in self.records:
            if case_id in self.failures:
                continue
            if case_id not in self.completed:
                left_out[case_id] = "not measured to the end (its test was interrupted or timed out)"
                continue
            evidence = self.evidence(case_id)
            verdict = self.verdicts.get(case_id)
            status = verdict.status if verdict else Status.NEW
            good = evidence.evidence
            accepted = ctx.accepted(case_id)
            if not good:
                left_out[case_id] = "every run was quarantined (" + (evidence.runs[0].quarantine or "") + ")"
                continue
            if status not in _RECORDABLE and not accepted:
                left_out[case_id] = f"{status.value} (record it anyway with --perf-accept '{case_id}')"
                continue
            if accepted and status not in _RECORDABLE:
                good = tuple(replace(r, accepted=ctx.accept_reason) for r in good)
                restart.add(case_id)
            if status is Status.IMPROVED:
                restart.add(case_id)
            additions.append(evidence.with_runs(good))
        return additions, frozenset(restart), left_out

    def update_baselines(self, interrupted: bool = False) -> BaselineUpdate:
        """Merge this session's recordable cases into the baseline file under its lock, and say
        what was written, what was left out and why, or why nothing was (an interrupted session,
        a baseline file that cannot be used)."""
        ctx = self.baselines
        assert ctx is not None
        if interrupted:
            return BaselineUpdate(ctx.path, refused="interrupted")
        additions, restart, left_out = self.baseline_additions()
        try:
            if additions:
                baseline.update(ctx.path, ctx.hardware_key, ctx.hardware, additions, restart, ctx.keep_runs)
        except baseline.BaselineError as exc:
            return BaselineUpdate(ctx.path, refused=str(exc))
        return BaselineUpdate(
            ctx.path, tuple(a.case_id for a in additions), tuple(sorted(left_out.items())), restart
        )
