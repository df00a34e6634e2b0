from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from scaleguard.records import CaseResult, RankResult, atomic_write_json
from scaleguard.stats import StepSummary, slowest_rank_steps
from tests.conftest import tiny_spec


def test_summary_matches_python_statistics() -> None:
    samples = [0.10, 0.12, 0.11, 0.50, 0.105, 0.115]
    s = StepSummary.of(samples)
    assert s.n == 6
    assert s.median_s == pytest.approx(statistics.median(samples))
    assert s.mean_s == pytest.approx(statistics.mean(samples))
    assert s.stddev_s == pytest.approx(statistics.stdev(samples))
    assert s.min_s == 0.10 and s.max_s == 0.50
    assert s.q1_s < s.median_s < s.q3_s


def test_noise_flag_follows_iqr_over_median() -> None:
    assert not StepSummary.of([1.0, 1.01, 0.99, 1.0]).is_noisy
    assert StepSummary.of([1.0, 1.5, 0.6, 1.0, 2.0]).is_noisy


def test_slowest_rank_per_step() -> None:
    assert slowest_rank_steps([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == (3.0, 5.0, 2.5)
    with pytest.raises(ValueError, match="different step counts"):
        slowest_rank_steps([[1.0], [1.0, 2.0]])


def _rank(rank: int, steps: tuple[float, ...]) -> RankResult:
    return RankResult(
        case_id="x",
        rank=rank,
        step_s=steps,
        warmup_step_s=(1.0,),
        steady=True,
        final_loss=0.5,
        peak_mem_bytes=100 + rank,
        mem_kind="host_max_rss",
        device_name="cpu",
        runtime={"torch": "2.x"},
        settings={"threads_per_rank": 1},
    )


def test_case_result_folds_ranks_and_derives_speedup() -> None:
    ws2 = CaseResult.from_ranks(tiny_spec(world_size=2), [_rank(1, (0.2, 0.4)), _rank(0, (0.3, 0.1))])
    assert ws2.step_s == (0.3, 0.4)
    assert ws2.samples_per_s == pytest.approx(8 / 0.35)
    assert ws2.peak_mem_bytes == (100, 101)
    ws1 = CaseResult.from_ranks(tiny_spec(world_size=1), [_rank(0, (0.5, 0.5))])
    scaled = ws2.with_reference(ws1)
    assert scaled.speedup == pytest.approx((8 / 0.35) / (8 / 0.5))
    assert scaled.scaling_efficiency == pytest.approx(scaled.speedup / 2)
    other_group = CaseResult.from_ranks(tiny_spec(world_size=1, mode="single"), [_rank(0, (0.5, 0.5))])
    assert ws2.with_reference(other_group).speedup is None


def test_records_round_trip_through_json() -> None:
    result = CaseResult.from_ranks(tiny_spec(), [_rank(0, (0.2, 0.4)), _rank(1, (0.2, 0.4))])
    again = CaseResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    data = result.to_dict() | {"schema_version": 99}
    with pytest.raises(ValueError, match="schema_version 99"):
        CaseResult.from_dict(data)


def test_atomic_write_leaves_old_file_when_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    atomic_write_json(target, {"a": 1})
    before = target.read_bytes()

    def boom(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_json(target, {"a": 2})
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left
