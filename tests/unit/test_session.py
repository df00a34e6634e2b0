"""The run schedule with a fake launcher: quiet cases cost one run, unsettled ones buy confirm
runs in blocks, repeats are interleaved across cases, quarantined runs are re-measured."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scaleguard.case import CaseSpec
from scaleguard.evidence.ledger import BaselineContext, Ledger
from scaleguard.evidence.records import RankResult
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.verdict import Status, Thresholds
from scaleguard.ranks.protocol import CaseFailedError
from scaleguard.schedule.session import PerfSession, Schedule
from tests.conftest import tiny_spec


def result(spec: CaseSpec, median: float, quarantine: str | None = None) -> RunRecord:
    steps = tuple(median * (1 + 0.001 * (i % 3)) for i in range(10))
    rank = RankResult(spec.case_id, 0, steps, (), True, 0.1, 1000, "host_max_rss", "cpu", {"torch": "t"}, {})
    return replace(RunRecord.from_ranks(spec, [rank]), quarantine=quarantine)


class FakeLauncher:
    """Returns the next median for a case; records the order of runs and their directories."""

    def __init__(self, medians: dict[str, list[float]], quarantine_first: int = 0) -> None:
        self.medians = medians
        self.calls: list[tuple[str, Path]] = []
        self.quarantine_left = quarantine_first

    def __call__(self, spec: CaseSpec, run_dir: Path, timeout_s: float) -> RunRecord:
        self.calls.append((spec.case_id, run_dir))
        queue = self.medians[spec.case_id]
        median = queue.pop(0) if len(queue) > 1 else queue[0]
        if median < 0:
            raise CaseFailedError(spec.case_id, 1, "boom")
        if self.quarantine_left:
            self.quarantine_left -= 1
            return result(spec, median, quarantine="GPU slowed itself down (gpu0: hw_slowdown)")
        return result(spec, median)


DEFAULT = Schedule(repeats=1, confirm=4, quarantine_pause_s=7)


def session(tmp_path: Path, fake: FakeLauncher, baseline_medians: dict[str, float] | None = None,
            schedule: Schedule = DEFAULT, thresholds: Thresholds | None = None,
            ) -> tuple[PerfSession, list[float]]:  # fmt: skip
    ctx = None
    if baseline_medians is not None:
        thresholds = thresholds or Thresholds.for_device("cpu")
        ctx = BaselineContext(tmp_path / "b.json", None, "k", {}, thresholds=thresholds)
        seed = Ledger("old", None)
        for cid, median in baseline_medians.items():
            spec = SPECS[cid]
            for index in range(6):
                seed.add(spec, result(spec, median * (1 + 0.01 * (index % 3 - 1))), session=f"old{index % 3}")
        from scaleguard.evidence.baseline import BaselineFile

        ctx.file = BaselineFile(ctx.path, "k", {}).merged([seed.evidence(cid) for cid in baseline_medians])
    sleeps: list[float] = []
    return PerfSession(Ledger("now", ctx), tmp_path, 60, schedule, run=fake, sleep=sleeps.append), sleeps


A, B = tiny_spec(world_size=1), tiny_spec(world_size=1, mode="single")
C, D = (
    tiny_spec(world_size=1, model="resnet18_cifar"),
    tiny_spec(world_size=1, mode="single", model="resnet18_cifar"),
)
SPECS = {s.case_id: s for s in (A, B, C, D)}


def test_a_quiet_case_costs_one_run_and_is_ok(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.1]})
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1})
    assert perf.measure(A).status is Status.OK
    assert len(fake.calls) == 1


def test_a_slow_case_gets_confirm_runs_in_blocks_then_fails(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.2]})
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1})
    verdict = perf.measure(A)
    assert verdict is not None and verdict.status is Status.REGRESSED
    assert len(fake.calls) in (3, 5)  # 1 + blocks of 2 until decided
    assert len({d for _, d in fake.calls}) == len(fake.calls)  # never the same run: fresh dirs


def test_a_one_run_fluke_is_not_a_regression(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.2, 0.1, 0.1, 0.1, 0.1]})  # first run slow, then normal
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1})
    verdict = perf.measure(A)
    assert verdict is not None and verdict.status is not Status.REGRESSED, verdict.story
    assert len(fake.calls) > 1


def test_confirm_zero_judges_the_scheduled_runs_only(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.2]})
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1}, Schedule(confirm=0))
    perf.measure(A)
    assert len(fake.calls) == 1


def test_repeats_are_interleaved_across_cases(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.1], B.case_id: [0.1]})
    perf, _ = session(tmp_path, fake, None, Schedule(repeats=3))
    perf.prefetch([A, B])
    perf.measure(A)
    perf.measure(B)
    assert [cid for cid, _ in fake.calls] == [A.case_id, B.case_id] * 2 + [A.case_id, B.case_id]
    assert len(perf.ledger.evidence(A.case_id).runs) == 3


def test_a_quarantined_run_is_kept_and_measured_again_after_a_pause(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.5, 0.1]}, quarantine_first=1)
    perf, sleeps = session(tmp_path, fake, {A.case_id: 0.1})
    verdict = perf.measure(A)
    assert verdict is not None and verdict.status is Status.OK, verdict.story
    assert sleeps == [7] and len(perf.ledger.evidence(A.case_id).runs) == 2
    additions, _, _ = perf.ledger.baseline_additions()
    assert all(r.quarantine is None for a in additions for r in a.runs)  # never recorded


def test_always_quarantined_is_noisy_not_regressed(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.5]}, quarantine_first=99)
    perf, sleeps = session(tmp_path, fake, {A.case_id: 0.1})
    verdict = perf.measure(A)
    assert verdict is not None and verdict.status is Status.NOISY and "hw_slowdown" in verdict.story
    assert len(sleeps) == 2


def test_a_machine_busy_for_two_cases_stops_costing_pauses_until_a_clean_run(tmp_path: Path) -> None:
    specs = [A, B, C, D]
    fake = FakeLauncher({s.case_id: [0.1] for s in specs}, quarantine_first=3 + 3 + 1)
    perf, sleeps = session(tmp_path, fake, {s.case_id: 0.1 for s in specs})
    lines: list[str] = []
    perf._on_run = lines.append
    statuses = [perf.measure(spec) for spec in specs]
    # cases 1 and 2: three tries each with two pauses; case 3: one try, no pause; case 4: the
    # machine is clean again, and its case is judged
    assert [s.status if s else None for s in statuses] == [Status.NOISY] * 3 + [Status.OK]
    assert len(sleeps) == 4 and len(fake.calls) == 3 + 3 + 1 + 1
    assert any("not waiting again: no clean run in the last 3 cases" in line for line in lines), lines
    assert perf._spoiled_cases == 0


def test_a_failed_prefetch_run_fails_its_case_only(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [-1.0], B.case_id: [0.1]})
    perf, _ = session(tmp_path, fake, None, Schedule(repeats=2))
    perf.prefetch([A, B])
    with pytest.raises(CaseFailedError):
        perf.measure(A)
    assert perf.measure(B) is None  # baselines off: no verdict, but measured
    assert A.case_id in perf.ledger.failures and len(perf.ledger.evidence(B.case_id).runs) == 2


def test_regressed_and_inconclusive_cases_are_not_recorded_unless_accepted(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.2], B.case_id: [0.1]})
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1, B.case_id: 0.1})
    perf.measure(A)
    perf.measure(B)
    additions, restart, left_out = perf.ledger.baseline_additions()
    assert [a.case_id for a in additions] == [B.case_id]
    assert left_out[A.case_id].startswith("REGRESSED (record it anyway with --perf-accept")
    ctx = perf.ledger.baselines
    assert ctx is not None
    ctx.accept, ctx.accept_reason = ("*ddp*",), "new allocator, slower by design"
    additions, restart, left_out = perf.ledger.baseline_additions()
    assert {a.case_id for a in additions} == {A.case_id, B.case_id} and restart == {A.case_id}
    accepted = next(a for a in additions if a.case_id == A.case_id)
    assert all(r.accepted == "new allocator, slower by design" for r in accepted.runs)


def test_a_case_not_measured_to_the_end_is_never_recorded(tmp_path: Path) -> None:
    fake = FakeLauncher({A.case_id: [0.1], B.case_id: [0.1]})
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1, B.case_id: 0.1}, Schedule(repeats=2))
    perf.prefetch([A, B])  # then A's test is interrupted before its last run: B alone finishes
    perf.measure(B)
    additions, _, left_out = perf.ledger.baseline_additions()
    assert [a.case_id for a in additions] == [B.case_id]
    assert left_out[A.case_id].startswith("not measured to the end")


def test_a_scaling_suspicion_confirms_the_ws1_reference_too(tmp_path: Path) -> None:
    # ws1's one scheduled run is 8 % fast (a fluke under its 10 % step threshold: OK, no
    # confirm); ws2 is unchanged, so its efficiency reads 0.06 points worse: beyond a 5-point
    # threshold and far beyond the baseline's efficiency spread. Confirm runs of ws2 alone would keep dividing by the fast ws1 run: the ws1 case
    # is run again beside them, and the fluke is outvoted
    ws1, ws2 = A, tiny_spec(world_size=2)
    SPECS[ws2.case_id] = ws2
    measured_spread = replace(
        Thresholds.for_device("cpu"), efficiency=0.05, min_spread=0.002, eff_min_spread=0.002
    )
    verdicts = {}
    for confirm in (0, 4):
        fake = FakeLauncher({ws1.case_id: [0.092, 0.1], ws2.case_id: [0.06]})
        perf, _ = session(tmp_path / str(confirm), fake, {ws1.case_id: 0.1, ws2.case_id: 0.06},
                          Schedule(confirm=confirm), measured_spread)  # fmt: skip
        assert perf.measure(ws1).status is Status.OK
        verdicts[confirm] = perf.measure(ws2)
    alone, confirmed = verdicts[0], verdicts[4]
    assert alone is not None and alone.status is Status.REGRESSED and alone.scaling_regression, alone.story
    assert confirmed is not None and confirmed.status is Status.OK, confirmed.story
    runs = [cid.split("-")[2] for cid, _ in fake.calls]
    assert runs[:4] == ["ws1", "ws2", "ws1", "ws2"]  # reference and case alternate


def test_a_failing_reference_run_costs_the_reference_not_the_case_being_confirmed(tmp_path: Path) -> None:
    # the ws1 case's reference run crashes: that failure is its own record (never recorded
    # into the baseline); the ws2 case goes on with its own confirm runs and is judged
    ws1, ws2 = A, tiny_spec(world_size=2)
    SPECS[ws2.case_id] = ws2
    measured_spread = replace(
        Thresholds.for_device("cpu"), efficiency=0.05, min_spread=0.002, eff_min_spread=0.002
    )
    fake = FakeLauncher({ws1.case_id: [0.092, -1.0], ws2.case_id: [0.06]})
    lines: list[str] = []
    perf, _ = session(
        tmp_path, fake, {ws1.case_id: 0.1, ws2.case_id: 0.06}, Schedule(confirm=4), measured_spread
    )
    perf._on_run = lines.append
    assert perf.measure(ws1).status is Status.OK
    verdict = perf.measure(ws2)
    assert verdict is not None
    runs = [cid.split("-")[2] for cid, _ in fake.calls]
    assert runs.count("ws1") == 2 and runs.count("ws2") >= 3  # one reference try, then ws2 alone
    assert any("a reference run failed" in line for line in lines), lines
    assert ws1.case_id in perf.ledger.failures


@pytest.mark.parametrize("recording", [False, True])
def test_the_anatomy_is_taken_on_confirm_runs_and_on_every_recorded_run(
    tmp_path: Path, recording: bool
) -> None:
    profiled: list[int] = []

    class Spy(FakeLauncher):
        def __call__(self, spec: CaseSpec, run_dir: Path, timeout_s: float) -> RunRecord:
            profiled.append(spec.settings.profile_steps)
            return super().__call__(spec, run_dir, timeout_s)

    fake = Spy({A.case_id: [0.3], B.case_id: [0.1]})  # A 3x slower than its baseline: confirm runs
    perf, _ = session(tmp_path, fake, {A.case_id: 0.1, B.case_id: 0.1},
                      schedule=replace(DEFAULT, anatomy_on_every_run=recording))  # fmt: skip
    assert perf.measure(B).status is Status.OK
    assert perf.measure(A).status is Status.REGRESSED
    steps = A.settings.profile_steps
    assert steps > 0
    if recording:
        assert profiled == [steps] * len(profiled)
    else:  # B's only run and A's first run go without; A's confirm runs explain the change
        assert profiled[:2] == [0, 0] and profiled[2:] == [steps] * (len(profiled) - 2) and len(profiled) > 2
