"""Runs cases for one pytest session: launch, fold ranks, judge against the baseline, keep
results for speedups, the report and a baseline update."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from scaleguard import launcher, machine_state
from scaleguard.baseline import BaselineError, BaselineFile, CaseRecord
from scaleguard.case import CaseSpec
from scaleguard.compare import Status, Thresholds, Verdict, judge, median_ci_halfwidth, thresholds_for
from scaleguard.records import CaseResult


@dataclass
class BaselineContext:
    """What the verdicts compare against, decided once per session."""

    path: Path
    file: BaselineFile | None  # None: no baseline recorded for this hardware yet
    hardware_key: str
    hardware: dict[str, object]
    torch_pick: str | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    per_case: list[str] = field(default_factory=list)
    commit: str | None = None

    def reason_missing(self, case_id: str) -> str:
        if self.file is None:
            return (
                f"no baseline for hardware {self.hardware_key} ({self.path} does not exist; "
                "record one with --perf-update-baselines)"
            )
        if self.file.hardware_key != self.hardware_key:
            return (
                f"{self.path} was recorded on {self.file.hardware_key}, this is "
                f"{self.hardware_key}: other hardware is never compared"
            )
        pick = f" for torch {self.torch_pick}" if self.torch_pick else ""
        return f"no baseline entry for {case_id}{pick} in {self.path}"

    def entry(self, case_id: str) -> CaseRecord | None:
        if self.file is None or self.file.hardware_key != self.hardware_key:
            return None
        return self.file.entry(case_id, self.torch_pick)


class PerfRunner:
    """Launches each case in its own run directory and folds ranks into a ``CaseResult``."""

    def __init__(self, base_dir: Path, timeout_s: float, baselines: BaselineContext | None = None) -> None:
        self.base_dir = base_dir
        self.timeout_s = timeout_s
        self.baselines = baselines
        self.results: dict[str, CaseResult] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.failures: dict[str, str] = {}

    def reference_for(self, spec: CaseSpec) -> CaseResult | None:
        """The measured world-size-1 case of the same model/mode/precision/scaling/inputs."""
        for result in self.results.values():
            if result.spec.group_id == spec.group_id and result.spec.world_size == 1:
                return result
        return None

    def run(self, spec: CaseSpec) -> CaseResult:
        gpus = spec.world_size if spec.device == "cuda" else 0
        before = machine_state.snapshot(gpus)
        monitor = machine_state.CaseMonitor(gpus)
        try:
            ranks = launcher.run_case(spec, self.base_dir / spec.case_id, self.timeout_s, monitor.tick)
        except launcher.CaseFailedError as exc:
            self.failures[spec.case_id] = exc.reason
            raise
        after = machine_state.snapshot(gpus)
        result = CaseResult.from_ranks(spec, ranks).with_reference(self.reference_for(spec))
        if before is not None or after is not None or monitor.samples:
            reasons = machine_state.throttle_reasons(before, after, *monitor.samples)
            result = replace(
                result,
                machine_state={
                    "before": [s.to_dict() for s in before or ()],
                    "during": monitor.summary(),
                    "after": [s.to_dict() for s in after or ()],
                },
                throttled=bool(reasons),
                notes=result.notes
                + ((f"GPU throttled during the case: {', '.join(reasons)}",) if reasons else ()),
            )
        self.results[spec.case_id] = result
        return result

    def judge(self, result: CaseResult) -> Verdict | None:
        """Verdict of ``result`` against its baseline (None when baselines are off)."""
        ctx = self.baselines
        if ctx is None:
            return None
        spec = result.spec
        ws1 = next(
            (
                v
                for cid, v in self.verdicts.items()
                if self.results[cid].spec.group_id == spec.group_id and self.results[cid].spec.world_size == 1
            ),
            None,
        )
        verdict = judge(
            CaseRecord.from_result(result, ctx.commit),
            ctx.entry(spec.case_id),
            thresholds_for(spec.case_id, ctx.thresholds, ctx.per_case),
            ws1_status=ws1.status if ws1 else None,
            new_reason=ctx.reason_missing(spec.case_id),
        )
        self.verdicts[spec.case_id] = verdict
        return verdict

    def update_baselines(self) -> tuple[Path, list[str], list[str]] | None:
        """Merge this session's good cases into the baseline file, atomically.

        Returns the path, the case ids written and the ones left out (NOISY, or whose median's
        95 % CI is wider than the step threshold), or None when baselines are off. Failed and
        non-finite cases never have a result to write.
        """
        ctx = self.baselines
        if ctx is None:
            return None
        keep, skipped = [], []
        for case_id, result in self.results.items():
            verdict = self.verdicts.get(case_id)
            step_threshold = thresholds_for(case_id, ctx.thresholds, ctx.per_case).step
            too_wide = (
                median_ci_halfwidth(result.step_s) > step_threshold or result.summary.rel_iqr > step_threshold
            )
            if too_wide or result.throttled or (verdict is not None and verdict.status is Status.NOISY):
                skipped.append(case_id)
            else:
                keep.append(CaseRecord.from_result(result, ctx.commit))
        if not keep:
            return ctx.path, [], skipped
        current = ctx.file
        if current is not None and current.hardware_key != ctx.hardware_key:
            raise BaselineError(
                f"{ctx.path} holds hardware {current.hardware_key}, this is "
                f"{ctx.hardware_key}: not overwritten; move it aside first"
            )
        if current is None:
            current = BaselineFile(ctx.path, ctx.hardware_key, dict(ctx.hardware))
        current.merged(keep).save()
        return ctx.path, [r.case_id for r in keep], skipped
