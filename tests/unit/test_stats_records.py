from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scaleguard.evidence.files import FileFormatError, atomic_write_json, read_document
from scaleguard.evidence.records import RankResult
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.stats import StepSummary, median_ci_halfwidth, run_shift, slowest_rank_steps
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
    assert s.mad_s == pytest.approx(statistics.median(abs(x - s.median_s) for x in samples))


def test_slowest_rank_per_step() -> None:
    assert slowest_rank_steps([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == (3.0, 5.0, 2.5)
    with pytest.raises(ValueError, match="different step counts"):
        slowest_rank_steps([[1.0], [1.0, 2.0]])


def test_median_ci_covers_and_narrows_with_more_steps() -> None:
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(300):
        data = rng.lognormal(0, 0.1, 40)
        half = median_ci_halfwidth(data)
        covered += abs(np.median(data) - 1.0) <= half * np.median(data)
    assert covered >= 270  # nominal 95 %: far above a broken interval's rate
    assert median_ci_halfwidth(rng.normal(1, 0.1, 2000)) < median_ci_halfwidth(rng.normal(1, 0.1, 50))
    assert median_ci_halfwidth([1.0] * 5) == float("inf")


def test_run_shift_young_baseline_uses_the_prior_as_known_spread() -> None:
    shift = run_shift([1.2], [1.0], relative=True, prior_spread=0.05, min_spread=0.0, young=True)
    assert shift.spread_assumed and shift.spread == 0.05
    assert shift.change == pytest.approx(0.2) and shift.p_up < 0.01 and shift.p_down > 0.99


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


def test_a_run_folds_its_ranks() -> None:
    ws2 = RunRecord.from_ranks(tiny_spec(world_size=2), [_rank(1, (0.2, 0.4)), _rank(0, (0.3, 0.1))])
    assert ws2.step_s == (0.3, 0.4)
    assert ws2.samples_per_s == pytest.approx(8 / 0.35)
    assert ws2.rank_peak_mem_bytes == (100, 101) and ws2.peak_mem_bytes == 101
    assert ws2.run_id == "" and ws2.device_name == "cpu" and ws2.steady


def test_records_round_trip_and_wrong_types_are_named(tmp_path: Path) -> None:
    result = RunRecord.from_ranks(tiny_spec(), [_rank(0, (0.2, 0.4)), _rank(1, (0.2, 0.4))])
    result = replace(result, run_id="s-1", session="s", notes=("a note",), gpu={"sm_clock_mhz": 1980})
    again = RunRecord.from_dict(json.loads(json.dumps(result.to_dict())), "run", "fix it")
    assert again == result
    with pytest.raises(FileFormatError, match="field 'step_s' item 1 is str"):
        RunRecord.from_dict(result.to_dict() | {"step_s": [0.1, "abc"]}, "run", "fix it")
    with pytest.raises(FileFormatError, match="field 'notes' must be a list of strings"):
        RunRecord.from_dict(result.to_dict() | {"notes": [1]}, "run", "fix it")
    with pytest.raises(FileFormatError, match="unknown field 'quarantined'"):
        RunRecord.from_dict(result.to_dict() | {"quarantined": "x"}, "run", "fix it")
    rank = _rank(0, (0.2, 0.4))
    assert RankResult.from_dict(json.loads(json.dumps(rank.to_dict()))) == rank
    with pytest.raises(FileFormatError, match="field 'rank' must be an integer"):
        RankResult.from_dict(rank.to_dict() | {"rank": "0"})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result.to_dict() | {"schema_version": 99}))
    with pytest.raises(FileFormatError, match=r"schema_version 99.*newer scaleguard"):
        read_document(path, "run record", "fix it")


def test_a_schema_2_run_reads_with_the_new_fields_empty() -> None:
    """A run stored before schema 3 (no device name, runtime, notes ...) reads as it was."""
    result = RunRecord.from_ranks(tiny_spec(), [_rank(0, (0.2, 0.4))])
    old = {k: v for k, v in result.to_dict().items() if k not in _SCHEMA3_RUN_FIELDS} | {
        "run_id": "r",
        "session": "s",
    }
    again = RunRecord.from_dict(old, "run", "fix it")
    assert again.step_s == result.step_s and again.device_name == "" and again.notes == ()
    assert again.steady and again.runtime == {} and again.rank_peak_mem_bytes == ()


_SCHEMA3_RUN_FIELDS = {
    "steady",
    "mem_kind",
    "rank_peak_mem_bytes",
    "device_name",
    "runtime",
    "settings",
    "notes",
    "gpu_whole_run",
}


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


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_json(target, {"a": 1})
    os.chmod(target, 0o644)
    atomic_write_json(target, {"a": 2})
    assert target.stat().st_mode & 0o777 == 0o644
    os.chmod(target, 0o640)
    atomic_write_json(target, {"a": 3})
    assert target.stat().st_mode & 0o777 == 0o640


def test_phase_breakdown_adds_up_to_the_wall_time() -> None:
    from scaleguard.evidence.records import phase_breakdown

    rank = RankResult(
        "x", 0, (0.1,), (2.0, 0.1, 0.1), True, 0.5, 1, "host_max_rss", "cpu", {}, {},
        measure_start_unix=110.0, measure_end_unix=113.0,
        phase_unix={"configure": 103.0, "init_process_group": 103.5, "build model and batches": 104.0,
                    "warmup": 105.0},
    )  # fmt: skip
    phases = phase_breakdown(rank, 100.0, 114.0, rank.warmup_step_s)
    assert phases["process start and imports"] == 3.0 and phases["first step"] == 2.0
    assert (
        phases["warmup"] == 3.0 and phases["measured steps"] == 3.0 and phases["result and teardown"] == 1.0
    )
    assert sum(phases.values()) == pytest.approx(14.0)
