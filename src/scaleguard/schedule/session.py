"""The schedule of runs in one session: repeats interleaved across cases, confirm runs in
blocks for a case that looks changed, and a paused re-measure for a quarantined run.

Two runs of one case never share a process (``launcher.Pools`` hands a case only to ranks that
have not run it; other cases may have run there before, which each run records). A quiet
night costs one run per case; only a case that looks regressed, improved or undecided pays for
confirm runs (as Chromium Pinpoint adds attempts until it can say DIFFERENT or SAME), and a
case still undecided at the cap is INCONCLUSIVE, never REGRESSED.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from scaleguard.case import FAULT_ENV, CaseSpec
from scaleguard.devices import defaults_for
from scaleguard.evidence.ledger import Ledger
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.verdict import Status, Verdict
from scaleguard.ranks.protocol import CaseFailedError
from scaleguard.schedule import runner

RunFn = Callable[[CaseSpec, Path, float], RunRecord]

# statuses that buy confirm runs
_UNSETTLED = (Status.REGRESSED, Status.IMPROVED, Status.INCONCLUSIVE, Status.BELOW_PROJECTION)


@dataclass(frozen=True)
class Schedule:
    """How many runs a case gets.

    Defaults per device come from ``for_device``; README "Measured" has the numbers.
    """

    repeats: int = 1  # runs of every case, interleaved across cases (recording: 3)
    confirm: int = 4  # extra runs at most for a case that looks changed
    confirm_block: int = 2  # confirm runs added between decisions
    quarantine_retries: int = 2  # re-measures of a run the machine spoiled
    quarantine_pause_s: float = 30.0  # let a hot GPU recover / a busy machine quiet down first
    # after this many cases in a row got no clean run, later cases stop pausing and retrying
    # until a clean run is seen: a machine busy all night would otherwise cost every case
    # (1 + retries) runs and the pauses (18 min instead of 2 for the CPU suite beside a hog)
    busy_cases_before_giving_up: int = 2
    # the step anatomy (a profiled step and phased steps) explains a change: a night's first
    # run of a case that turns out OK never needs it, so it is taken on confirm runs, and on
    # every run of a recording session (a baseline's anatomy is what a later story diffs)
    anatomy_on_every_run: bool = False

    @classmethod
    def for_device(
        cls,
        device: str,
        repeats: int | None = None,
        confirm: int | None = None,
        anatomy_on_every_run: bool = False,
    ) -> Schedule:
        base = cls()
        return cls(
            anatomy_on_every_run=anatomy_on_every_run,
            repeats=repeats if repeats is not None else base.repeats,
            confirm=confirm if confirm is not None else base.confirm,
            confirm_block=base.confirm_block,
            quarantine_retries=base.quarantine_retries,
            quarantine_pause_s=defaults_for(device).quarantine_pause_s,
        )


class PerfSession:
    """Runs cases for one pytest session (or one ``scaleguard`` command) into a ledger."""

    def __init__(
        self,
        ledger: Ledger,
        base_dir: Path,
        timeout_s: float,
        schedule: Schedule,
        run: RunFn = runner.run_once,
        sleep: Callable[[float], None] = time.sleep,
        on_run: Callable[[str], None] = lambda line: None,
        wait_quiet: Callable[[float], None] | None = None,
        fault: str = "",
    ) -> None:
        self.ledger = ledger
        # the fault every run carries (--perf-inject-faults): said in each run record and verdict
        self.fault_note = f"fault injected: {FAULT_ENV}={fault} (--perf-inject-faults)" if fault else ""
        self.base_dir = base_dir
        self.timeout_s = timeout_s
        self.schedule = schedule
        self._run_fn = run
        self._sleep = sleep
        # a disturbed run waits for the machine to quiet down (bounded), a throttled one sleeps
        self._wait_quiet = wait_quiet or sleep
        self._on_run = on_run
        self._errors: dict[str, CaseFailedError] = {}
        self._prefetched = False
        self._count = 0
        self._spoiled_cases = 0  # consecutive cases whose runs were all quarantined

    def prefetch(self, specs: Iterable[CaseSpec]) -> None:
        """With ``repeats`` R > 1, runs 1..R-1 of every case, round-robin across cases, before
        the first case reports: repeats of one case are then spread over the session instead
        of back to back. Each case's test then makes its last run and is judged."""
        if self._prefetched:
            return
        self._prefetched = True
        specs = list(specs)
        for round_index in range(self.schedule.repeats - 1):
            for spec in specs:
                if spec.case_id in self._errors:
                    continue
                self._on_run(f"{spec.case_id}: run {round_index + 1} of {self.schedule.repeats}")
                try:
                    self._one_run(spec)
                except CaseFailedError:
                    continue  # kept in _errors: the case's own test reports it

    def measure(self, spec: CaseSpec) -> Verdict | None:
        """The case's last scheduled run, its verdict, and confirm runs while it is unsettled.

        Raises:
            CaseFailedError: one of its runs failed (the case is not judged).
        """
        if spec.case_id in self._errors:
            raise self._errors[spec.case_id]
        first = spec
        if not self.schedule.anatomy_on_every_run and spec.settings.profile_steps:
            first = replace(spec, settings=replace(spec.settings, profile_steps=0))
        self._one_run(first)
        verdict = self.ledger.judge(spec.case_id)
        extra = 0
        while verdict is not None and self._unsettled(verdict, extra) and extra < self.schedule.confirm:
            block = min(self.schedule.confirm_block, self.schedule.confirm - extra)
            # efficiency is this case's rate over its ws1 case's rate in this session: confirm
            # runs of this case alone cannot undo one fast (or slow) ws1 run, so the ws1 case
            # is confirmed too, its runs alternating with these
            anchor = self.ledger.anchor(spec) if verdict.efficiency is not None else None
            with_anchor = f" and {block} of {anchor.case_id}, its efficiency's reference" if anchor else ""
            self._on_run(f"{spec.case_id}: {verdict.status.value} so far; {block} confirm runs{with_anchor}")
            for _ in range(block):
                if anchor is not None and not self._anchor_run(anchor):
                    anchor = None
                self._one_run(spec)
                extra += 1
            verdict = self.ledger.judge(spec.case_id)
        self.ledger.complete(spec.case_id)
        if verdict is not None and self.fault_note:
            verdict = replace(verdict, story=f"{verdict.story} [{self.fault_note}]")
            self.ledger.verdicts[spec.case_id] = verdict
        return verdict

    def _anchor_run(self, anchor: CaseSpec) -> bool:
        """One more run of a ws1 reference case; False when it failed (its own record says so,
        and the case being confirmed goes on without it)."""
        try:
            self._one_run(anchor)
        except CaseFailedError as exc:
            self._on_run(f"{anchor.case_id}: a reference run failed ({exc.reason.splitlines()[0]})")
            return False
        return True

    def _unsettled(self, verdict: Verdict, extra: int) -> bool:
        """INCONCLUSIVE always wants more runs; REGRESSED and IMPROVED until one confirm block
        has repeated them in fresh processes (a change is never called on the first runs)."""
        if verdict.status not in _UNSETTLED:
            return False
        return verdict.status is Status.INCONCLUSIVE or extra < self.schedule.confirm_block

    def _one_run(self, spec: CaseSpec) -> None:
        """One run; a quarantined run is kept, and the case measured again after a pause
        (not while the machine has spoiled every run of the last cases)."""
        retries = self.schedule.quarantine_retries
        if self._spoiled_cases >= self.schedule.busy_cases_before_giving_up:
            retries = 0
        for attempt in range(1 + retries):
            self._count += 1
            run_dir = self.base_dir / f"{spec.case_id}.run{self._count}"
            try:
                result = self._run_fn(spec, run_dir, self.timeout_s)
            except CaseFailedError as exc:
                self._errors[spec.case_id] = exc
                self.ledger.fail(spec.case_id, exc.reason)
                raise
            if self.fault_note:
                result = replace(result, notes=(*result.notes, self.fault_note))
            self.ledger.add(spec, result)
            if result.quarantine is None:
                self._spoiled_cases = 0
                return
            if attempt < retries:
                self._on_run(f"{spec.case_id}: run quarantined ({result.quarantine}); pausing, then again")
                if result.disturbed:
                    self._wait_quiet(self.schedule.quarantine_pause_s)
                else:
                    self._sleep(self.schedule.quarantine_pause_s)
        self._spoiled_cases += 1
        if retries == 0 and self.schedule.quarantine_retries > 0:
            self._on_run(
                f"{spec.case_id}: run quarantined ({result.quarantine}); not waiting again: no clean "
                f"run in the last {self._spoiled_cases} cases (a clean run ends this)"
            )
