"""Runs cases for one pytest session and keeps their results (for speedups and the report)."""

from __future__ import annotations

from pathlib import Path

from scaleguard import launcher
from scaleguard.case import CaseSpec
from scaleguard.records import CaseResult


class PerfRunner:
    """Launches each case in its own run directory and folds ranks into a ``CaseResult``."""

    def __init__(self, base_dir: Path, timeout_s: float) -> None:
        self.base_dir = base_dir
        self.timeout_s = timeout_s
        self.results: dict[str, CaseResult] = {}
        self.failures: dict[str, str] = {}

    def reference_for(self, spec: CaseSpec) -> CaseResult | None:
        """The measured world-size-1 case of the same model/mode/precision/scaling/inputs."""
        for result in self.results.values():
            if result.spec.group_id == spec.group_id and result.spec.world_size == 1:
                return result
        return None

    def run(self, spec: CaseSpec) -> CaseResult:
        try:
            ranks = launcher.run_case(spec, self.base_dir / spec.case_id, self.timeout_s)
        except launcher.CaseFailedError as exc:
            self.failures[spec.case_id] = exc.reason
            raise
        result = CaseResult.from_ranks(spec, ranks).with_reference(self.reference_for(spec))
        self.results[spec.case_id] = result
        return result
