"""The straggler rule on synthetic per-rank anatomies (the real ranks: tests/plugin)."""

from __future__ import annotations

from typing import Any

from scaleguard.evidence import stragglers
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.stats import StepSummary


def run(rank_ms: dict[str, dict[str, float]], nodes: dict[str, str] | None = None) -> RunRecord:
    steps = (0.03, 0.03, 0.03)
    placement: dict[str, Any] = {r: {"node": n} for r, n in (nodes or {}).items()}
    return RunRecord(
        run_id="s-1", session="s", summary=StepSummary.of(steps), step_s=steps, samples_per_s=1.0,
        peak_mem_bytes=1, rank_ms=rank_ms, placement=placement,
    )  # fmt: skip


def ms(compute: float, wait: float) -> dict[str, float]:
    return {"data": 0.0, "forward": compute / 2, "backward": compute / 2, "optimizer": 0.0,
            "exposed communication": wait}  # fmt: skip


def test_the_rank_the_others_wait_for_is_named_with_its_node() -> None:
    ranks = {"0": ms(20, 11), "1": ms(20, 10.5), "2": ms(30.2, 0.8), "3": ms(20.4, 10)}
    found = stragglers.find([run(ranks, {"0": "n1", "1": "n1", "2": "n2", "3": "n2"})])
    assert found is not None and (found.rank, found.node) == (2, "n2")
    assert found.describe().startswith(
        "straggler: rank 2 (node n2) computes 10.2 ms/step more than the others (30.2 against 20.0)"
    )


def test_no_straggler_when_ranks_agree_or_nobody_waits() -> None:
    assert stragglers.find([run({"0": ms(20, 1), "1": ms(20.5, 1)})]) is None
    # an imbalance as two unmodified ranks on two shared cores showed (10.5 %): not a straggler
    assert stragglers.find([run({"0": ms(38.8, 3.9), "1": ms(35.1, 7.8)})]) is None
    # a rank with more compute that nobody waits for (its wait not the others'): not pacing
    assert stragglers.find([run({"0": ms(20, 1), "1": ms(30, 1)})]) is None
    assert stragglers.find([run({})]) is None


def test_the_median_over_runs_ignores_one_noisy_run() -> None:
    quiet = {"0": ms(20, 1), "1": ms(20, 1)}
    noisy = {"0": ms(20, 9), "1": ms(29, 0)}
    assert stragglers.find([run(quiet), run(noisy), run(quiet)]) is None
