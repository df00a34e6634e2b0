"""Paired A/B on synthetic pairs and with a fake launcher: the decision, balanced order,
dropped pairs, and interpreters that cannot be a side."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from scaleguard.evidence.verdict import Thresholds
from scaleguard.ranks.protocol import CaseFailedError, Interpreter
from scaleguard.schedule import ab
from scaleguard.schedule.ab import ABSchedule, ABSession, decide_pairs, paired_shift, probe
from tests.conftest import tiny_spec
from tests.unit.test_session import result

CPU = Thresholds.for_device("cpu")


def pairs(n: int, ratio: float, spread: float, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    a = list(0.1 * np.exp(rng.normal(0, 0.1, n)))  # the machine drifts a lot between pairs ...
    b = [x * ratio * float(np.exp(rng.normal(0, spread))) for x in a]  # ... but A and B drift together
    return a, b


def test_identical_sides_are_same_and_a_slower_b_is_regressed() -> None:
    assert decide_pairs("c", *pairs(6, 1.0, 0.01), CPU)[0] == "SAME"
    status, step, *_ = decide_pairs("c", *pairs(6, 1.2, 0.01, seed=1), CPU)
    assert status == "REGRESSED" and 0.17 < step.change < 0.23
    assert decide_pairs("c", *pairs(6, 0.8, 0.01, seed=2), CPU)[0] == "IMPROVED"


def test_pairing_cancels_drift_that_unpaired_runs_cannot() -> None:
    a, b = pairs(6, 1.15, 0.01, seed=3)
    assert decide_pairs("c", a, b, CPU)[0] == "REGRESSED"
    shift = paired_shift(a, b, relative=True)
    assert shift.spread < 0.02 < float(np.std(np.log(a), ddof=1))  # pair spread far below run spread


def test_wild_pairs_are_inconclusive_and_efficiency_counts() -> None:
    a, b = [0.1, 0.1, 0.1], [0.1, 0.16, 0.07]
    assert decide_pairs("c", a, b, CPU)[0] == "INCONCLUSIVE"
    status, _, eff, _, reasons = decide_pairs(
        "c", *pairs(6, 1.0, 0.01), CPU, eff=([0.9] * 6, [0.6, 0.61, 0.59, 0.6, 0.6, 0.62])
    )
    assert status == "REGRESSED" and reasons == ["efficiency"] and eff is not None and eff.change < -0.25


class FakeRuns:
    def __init__(self, b_ratio: float = 1.0, fail_b: int = 0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.b_ratio, self.fail_b = b_ratio, fail_b

    def __call__(self, spec, run_dir: Path, timeout_s: float, interpreter: Interpreter) -> object:  # type: ignore[no-untyped-def]
        label = "B" if interpreter.python == "py-b" else "A"
        self.calls.append((label, spec.case_id))
        if label == "B" and self.fail_b:
            self.fail_b -= 1
            raise CaseFailedError(spec.case_id, 0, "killed by SIGKILL")
        base = 0.1 * (1 + 0.05 * ((len(self.calls) - 1) // 2 % 4))  # drift shared by a pair's two runs
        return result(spec, base * (self.b_ratio if label == "B" else 1.0))


def session(tmp_path: Path, fake: FakeRuns, max_pairs: int = 10) -> ABSession:
    return ABSession(
        ab.Side("A", Interpreter("py-a"), {"torch": "2.14.1"}),
        ab.Side("B", Interpreter("py-b"), {"torch": "2.13.0"}),
        tmp_path, 60, lambda cid: CPU, ABSchedule(max_pairs=max_pairs, seed=1), run=fake,
    )  # fmt: skip


def test_orders_are_balanced_and_a_same_case_stops_early(tmp_path: Path) -> None:
    fake = FakeRuns()
    verdict = session(tmp_path, fake).measure(tiny_spec(world_size=1))
    assert verdict.status == "SAME" and verdict.orders.count("AB") == verdict.orders.count("BA")
    assert len(fake.calls) == 2 * len(verdict.orders) < 20
    assert "torch 2.14.1 (A) -> 2.13.0 (B)" in verdict.story


def test_a_crashed_side_drops_the_pair_on_both_sides(tmp_path: Path) -> None:
    perf = session(tmp_path, FakeRuns(b_ratio=1.5, fail_b=1))
    verdict = perf.measure(tiny_spec(world_size=1))
    assert (
        verdict.status == "REGRESSED" and len(verdict.dropped) == 1 and "side B failed" in verdict.dropped[0]
    )
    a, b = perf.ledgers["A"].records, perf.ledgers["B"].records
    assert len(a[tiny_spec(world_size=1).case_id]) == len(b[tiny_spec(world_size=1).case_id])  # symmetric
    with pytest.raises(CaseFailedError, match="A/B pairs failed"):
        session(tmp_path, FakeRuns(fail_b=99)).measure(tiny_spec(world_size=1))


def test_interpreters_that_cannot_be_a_side_are_named(tmp_path: Path) -> None:
    with pytest.raises(ab.ABInputError, match="does not exist"):
        probe("B", str(tmp_path / "nope" / "python"))
    with pytest.raises(ab.ABInputError, match="has no torch"):
        probe("B", "/usr/bin/python3.11")
    hidden = tmp_path / "hide" / "scaleguard"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('not installed here')\n")
    wrapper = tmp_path / "python-without-scaleguard"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={hidden.parent} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    with pytest.raises(ab.ABInputError, match="has no scaleguard"):
        probe("B", str(wrapper))
    assert probe("A", sys.executable).versions["torch"].startswith("2.")


def test_paired_thresholds_are_tighter_on_cpu_only() -> None:
    from scaleguard.evidence.verdict import Thresholds

    assert Thresholds.for_ab("cpu").step == 0.05 and Thresholds.for_device("cpu").step == 0.10
    assert Thresholds.for_ab("cuda") == Thresholds.for_device("cuda")


class MemoryGrows(FakeRuns):
    """B uses 50 % more memory every time; its step time is noisy pair to pair (±8 %)."""

    def __call__(self, spec, run_dir: Path, timeout_s: float, interpreter: Interpreter) -> object:  # type: ignore[no-untyped-def]
        from dataclasses import replace

        res = super().__call__(spec, run_dir, timeout_s, interpreter)
        label = self.calls[-1][0]
        noise = 1.0 + (0.08 if len(self.calls) % 4 in (1, 2) else -0.08) if label == "B" else 1.0
        res = result(spec, res.summary.median_s * noise)  # type: ignore[attr-defined]
        return replace(res, peak_mem_bytes=int(res.peak_mem_bytes * (1.5 if label == "B" else 1.0)))


def test_a_memory_verdict_does_not_end_the_pairs_before_step_time_is_decided(tmp_path: Path) -> None:
    fake = MemoryGrows()
    verdict = session(tmp_path, fake, max_pairs=6).measure(tiny_spec(world_size=1))
    assert verdict.status == "REGRESSED" and verdict.metrics["memory"] == "REGRESSED"
    # memory was decided after 2 pairs; the pairs went on for step time (to the cap, or decided)
    assert len(verdict.orders) > 2
    assert verdict.metrics["step"] in ("SAME", "INCONCLUSIVE")
    assert "verdicts: step " in verdict.story and "memory REGRESSED" in verdict.story
    if verdict.metrics["step"] == "INCONCLUSIVE":
        assert len(verdict.orders) == 6 and "step undecided after 6 pairs" in verdict.story


def test_each_metric_has_its_own_verdict() -> None:
    from scaleguard.schedule.ab import metric_verdicts

    step = paired_shift(*pairs(8, 1.0, 0.01), relative=True)
    effs = paired_shift([0.9] * 8, [0.6, 0.61, 0.59, 0.6, 0.6, 0.62, 0.61, 0.6], relative=False)
    mems = paired_shift([1e9] * 8, [1e9 * (1 + 0.001 * i) for i in range(8)], relative=True, min_spread=1e-3)
    assert metric_verdicts(step, effs, mems, CPU) == {
        "step": "SAME",
        "efficiency": "REGRESSED",
        "memory": "SAME",
    }


class CudaBuildOnCpu(FakeRuns):
    """B's ranks hold 278 MiB more from the start (its libraries); the step's own memory is equal."""

    def __call__(self, spec, run_dir: Path, timeout_s: float, interpreter: Interpreter) -> object:  # type: ignore[no-untyped-def]
        from dataclasses import replace

        res = super().__call__(spec, run_dir, timeout_s, interpreter)
        peak = (648 if self.calls[-1][0] == "B" else 370) * 2**20
        return replace(res, peak_mem_bytes=peak)  # type: ignore[arg-type]


@pytest.mark.parametrize(("b_import_mib", "said"), [(506, True), (228, False)])
def test_a_cpu_memory_change_says_how_much_importing_torch_alone_makes(
    tmp_path: Path, b_import_mib: int, said: bool
) -> None:
    perf = ABSession(
        ab.Side("A", Interpreter("py-a"), {"torch": "2.13.0+cpu", "import_rss_bytes": 228 * 2**20}),
        ab.Side("B", Interpreter("py-b"), {"torch": "2.14.1+cu130", "import_rss_bytes": b_import_mib * 2**20}),
        tmp_path, 60, lambda cid: CPU, ABSchedule(max_pairs=4, seed=1), run=CudaBuildOnCpu(),
    )  # fmt: skip
    verdict = perf.measure(tiny_spec(world_size=1))
    assert verdict.metrics["memory"] == "REGRESSED"
    footprint = "importing torch alone: 228 -> 506 MiB, +278 of the +278 MiB: the installs' libraries"
    assert (footprint in verdict.story) is said, verdict.story


def test_the_probe_measures_what_importing_torch_holds() -> None:
    assert probe("A", sys.executable).versions["import_rss_bytes"] > 50 * 2**20


def test_a_busy_machine_that_disturbs_every_pair_is_noisy_not_regressed(tmp_path: Path) -> None:
    """One outcome and one exit code everywhere: the suite calls a case whose every run was
    disturbed NOISY (exit 0); so does the A/B, where it said "no A/B pair completed" (exit 1)."""
    from dataclasses import replace

    class Disturbed(FakeRuns):
        def __call__(self, spec, run_dir: Path, timeout_s: float, interpreter: Interpreter) -> object:  # type: ignore[no-untyped-def]
            run = super().__call__(spec, run_dir, timeout_s, interpreter)
            return replace(run, quarantine="disturbed: 1.4 cores of other processes")  # type: ignore[type-var]

    from scaleguard.report import terminal as report

    perf = session(tmp_path, Disturbed())
    verdict = perf.measure(tiny_spec(world_size=1))
    assert verdict.status == "NOISY" and not verdict.failed and verdict.step is None
    assert "not judged" in verdict.story and "disturbed" in verdict.story and verdict.dropped
    (row,) = report.ab_rows(perf)
    assert row[-1] == "NOISY" and "NOISY" in report.ab_markdown(perf)
