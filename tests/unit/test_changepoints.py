"""The change-point detector (issue 30): Otava's own published series, the cases where binary
segmentation on means goes wrong, and every kind of nonsense input refused or handled."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleguard.history import changepoints as cp
from scaleguard.history import database as history
from scaleguard.history.changepoints import SeriesError, detect

S1 = [1.02, 0.95, 0.99, 1.00, 1.12, 0.90, 0.50, 0.51, 0.48, 0.48, 0.55]
S2 = [2.02, 2.03, 2.01, 2.04, 1.82, 1.85, 1.79, 1.81, 1.80, 1.76, 1.78]


def at(values: list[float] | np.ndarray, **kw: object) -> list[int]:
    return [s.index for s in detect(values, **kw)]  # type: ignore[arg-type]


# Otava's tests (apache/otava tests/, 0.8.0), at their settings ---------------------------------
def test_otavas_published_series_give_otavas_answers() -> None:
    single = [1.02, 0.95, 0.99, 1.00, 1.12, 1.00, 1.01, 0.98, 1.01, 0.96,
              0.50, 0.51, 0.48, 0.48, 0.55, 0.50, 0.49, 0.51, 0.50, 0.49]  # fmt: skip
    assert at(single, max_pvalue=0.0001, min_size=2) == [10]
    assert at(S1, min_size=2) == [6] and at(S2, min_size=2) == [4]
    assert at(S1, min_size=2, min_magnitude=0.2) == [6] and at(S2, min_size=2, min_magnitude=0.2) == []
    assert at([*S2, 1.97], min_size=2) == [4]
    seq = [0.3, 2.4, 1.5, -0.9, -0.5, 99.7, 98.3, 99.1, 149.0, 149.7, 149.5, 149.1, 148.8, 150.0]
    assert at(seq, max_pvalue=0.01, min_size=2, scale="linear") == [5, 8]
    tb = json.loads(
        (Path(__file__).parents[2] / "benchmarks" / "data" / "otava_tigerbeetle.json").read_text()
    )
    for name in ("test_tb_old_defaults", "test_tb_old_defaults_p05"):
        case = tb["cases"][name]
        assert (
            at(tb["series"], max_pvalue=case["max_pvalue"], min_magnitude=case["min_magnitude"])
            == case["expected"]
        )


# where means and a stopping search go wrong ------------------------------------------------------
def test_one_outlier_night_does_not_capture_the_step() -> None:
    rng = np.random.default_rng(1)
    values = 0.1 * np.where(np.arange(40) < 25, 1.0, 0.89) * np.exp(rng.normal(0, 0.005, 40))
    values[15] *= 0.59  # one -41 % night, ten nights before the -11 % step
    steps = detect(values, min_magnitude=0.02)
    assert [s.index for s in steps] == [25]
    assert steps[0].change == pytest.approx(-0.11, abs=0.01)


def test_a_regress_then_fix_bump_has_both_edges() -> None:
    rng = np.random.default_rng(2)
    level = np.where((np.arange(30) >= 12) & (np.arange(30) < 18), 1.06, 1.0)
    assert at(0.1 * level * np.exp(rng.normal(0, 0.003, 30)), min_magnitude=0.02) == [12, 18]


def test_a_small_step_beside_a_large_one_in_a_short_series_is_found() -> None:
    rng = np.random.default_rng(3)
    level = np.concatenate([np.full(8, 1.0), np.full(8, 1.5), np.full(8, 1.56)])
    assert at(level * np.exp(rng.normal(0, 0.003, 24)), min_magnitude=0.02) == [8, 16]


def test_a_single_outlier_night_is_not_a_change_point_unless_the_level_stays() -> None:
    rng = np.random.default_rng(4)
    base = 0.1 * np.exp(rng.normal(0, 0.005, 40))
    once = base.copy()
    once[20] *= 1.5
    assert at(once, min_magnitude=0.02) == []
    stays = base.copy()
    stays[20:] *= 1.5  # the level stays from night 20 on
    assert at(stays, min_magnitude=0.02) == [20]


# no silent nonsense --------------------------------------------------------------------------------
def test_flat_series_have_no_change_point_even_at_magnitude_zero() -> None:
    assert detect([0.1] * 30, min_magnitude=0.0) == []
    assert detect([0.1] * 15 + [0.1 + 1e-12] * 15, min_magnitude=0.01) == []


@settings(max_examples=300, deadline=None)
@given(
    value=st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False),
    nights=st.integers(min_value=6, max_value=400),
    scale=st.sampled_from(["log", "linear"]),
)
def test_a_constant_series_has_no_change_point_at_any_value_length_or_magnitude(
    value: float, nights: int, scale: str
) -> None:
    # equal logs whose trimmed means differ in the last bit read as a step at p = 0 before
    assert detect([value] * nights, min_magnitude=0.0, scale=scale) == []
    assert detect([5.0] * 30) == []


@pytest.mark.parametrize("at_night", [1500, 3217, 9000])
def test_a_long_series_places_its_step_to_the_night_beside_an_outlier(at_night: int) -> None:
    """Past ``EXACT_SPLIT_MAX`` nights the search is coarse, then exact: the step is still placed
    to the night, and a -41 % night five nights before it does not capture it."""
    rng = np.random.default_rng(at_night)
    series = 0.1 * np.exp(rng.normal(0, 0.01, 12_000))
    series[at_night:] *= 0.89
    series[at_night - 5] *= 0.59
    (step,) = detect(series, min_magnitude=0.05)
    assert step.index == at_night and step.change == pytest.approx(-0.11, abs=0.01)


def test_two_flat_levels_are_one_exact_change() -> None:
    (step,) = detect([0.1] * 10 + [0.2] * 10, min_magnitude=0.0)
    assert step.index == 10 and step.p_value == 0.0 and step.change == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ([0.1] * 5 + [0.0] * 5, "positive"),
        ([0.1] * 5 + [-0.1] * 5, "positive"),
        ([0.1] * 5 + [math.nan] * 5, "not a finite number"),
        ([0.1] * 5 + [math.inf] * 5, "not a finite number"),
        (["fast"] * 10, "numbers"),
        ([[0.1, 0.2]] * 10, "one series"),
    ],
    ids=["zero", "negative", "nan", "inf", "text", "nested"],
)
def test_values_that_are_not_step_times_are_refused(values: list, needle: str) -> None:
    with pytest.raises(SeriesError, match=needle):
        detect(values)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"min_size": 1}, "min_size"),
        ({"min_size": 0}, "min_size"),
        ({"min_size": True}, "min_size"),
        ({"max_pvalue": 0.0}, "max_pvalue"),
        ({"max_pvalue": math.nan}, "max_pvalue"),
        ({"min_magnitude": -0.1}, "min_magnitude"),
        ({"min_magnitude": math.nan}, "min_magnitude"),
        ({"scale": "cubic"}, "scale"),
    ],
)
def test_settings_that_make_nonsense_are_refused(kw: dict, needle: str) -> None:
    with pytest.raises(SeriesError, match=needle):
        detect([0.1] * 20, **kw)


def test_zeros_and_negatives_are_fine_on_the_linear_scale() -> None:
    assert at([0.0] * 8 + [1.0] * 8, scale="linear") == [8]


def test_the_smallest_change_follows_the_device_and_case_thresholds() -> None:
    from scaleguard.evidence.verdict import ThresholdSettings

    assert history.min_magnitude_for("cpu-amd-epyc-1t", "m-ddp-ws1-fp32-strong") == pytest.approx(0.10)
    assert history.min_magnitude_for("cuda-nvidia-h200-x1", "m-ddp-ws1-fp32-strong") == pytest.approx(0.03)
    rules = ThresholdSettings.parse({}, ["m-ddp-* step=0.05"])
    assert history.min_magnitude_for("cpu-amd-epyc-1t", "m-ddp-ws1-fp32-strong", rules) == pytest.approx(0.05)


def test_the_smallest_change_point_follows_the_device_recorded_with_the_runs(tmp_path: Path) -> None:
    from dataclasses import replace

    from tests.unit.test_history import nights

    # a cluster's CPU key: the old prefix test took it for CUDA (3 %) instead of CPU (10 %)
    assert history.min_magnitude_for("slurm-cpu-amd-epyc-1t-1pn", "m-ddp-ws1-fp32-strong") == pytest.approx(
        0.10
    )
    db = tmp_path / "h.sqlite"
    with history.History(db) as h:  # a key that says nothing of the device; the runs' case does
        h.append(
            [replace(n, config={**n.config, "device": "cpu"}) for n in nights([0.1, 0.1])],
            "lab-box-7",
            "suite",
        )
    with history.History(db, readonly=True) as h:
        rows = h.rows()
    assert history.device_of(rows) == "cpu"
    assert history.min_magnitude_for("lab-box-7", rows[0].case_id, None, "cpu") == pytest.approx(0.10)
    assert history.min_magnitude_for("lab-box-7", rows[0].case_id) == pytest.approx(
        0.03
    )  # no device: the key's form


def test_the_search_reads_each_night_a_bounded_number_of_times_on_rippled_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounded or rippled values put the best split a few nights from an edge, segment after
    segment: splitting off three nights at a time searched 12,000 nights ~900 times each (a
    10,000-night series of them took a second). A split near an edge also halves the long side:
    every night is searched O(log n + BALANCED_MIN / min_size) times, and the step is still found."""
    from scaleguard.history import changepoints

    n = 12_000
    rippled = [0.1 * (1.05 if i >= n // 2 else 1.0) * (1 + 0.002 * ((i * 7 + 3) % 5)) for i in range(n)]
    searched = [0]
    best_split = changepoints._best_split

    def counting(seg: np.ndarray, min_size: int) -> tuple[int, float]:
        searched[0] += seg.size
        return best_split(seg, min_size)

    monkeypatch.setattr(changepoints, "_best_split", counting)
    steps = detect(rippled, min_magnitude=0.02)
    assert [s.index for s in steps] == [n // 2]
    assert searched[0] < 150 * n, searched[0]  # the quadratic search read ~1,000 x n


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 2.0), min_size=14, max_size=160),
    st.integers(0, 10_000),
)
def test_a_child_segment_searched_with_its_parents_costs_splits_where_a_fresh_search_does(
    values: list[float], cut: int
) -> None:
    """The top-down search hands each child the cost array it shares with its parent (the left
    child's costs ahead, the right child's behind): the same numbers, so the same split."""
    from scaleguard.history.changepoints import _search

    seg = np.log(np.asarray(values))
    m = seg.size
    _, _, ahead, behind = _search(seg, 3)
    at = 3 + cut % (m - 5)
    left, right = seg[:at], seg[at:]
    if left.size >= 6:
        assert _search(left, 3, ahead=ahead[:at])[:2] == _search(left, 3)[:2]
    if right.size >= 6:
        assert _search(right, 3, behind=behind[at:])[:2] == _search(right, 3)[:2]


# years of nights: the block search and its memo (issue 39, item 9) ------------------------------
class DictMemo:
    """``changepoints.Memo`` in a dict, counting what it was asked."""

    def __init__(self) -> None:
        self.kept: dict[str, list[int]] = {}
        self.hits = 0

    def get(self, digest: str) -> list[int] | None:
        found = self.kept.get(digest)
        self.hits += found is not None
        return found

    def put(self, digest: str, found: list[int]) -> None:
        self.kept[digest] = list(found)


def _long(n: int, steps: dict[int, float], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 0.1 * np.exp(0.01 * rng.standard_normal(n))
    for where, size in steps.items():
        x[where:] *= 1 + size
    return x


@pytest.mark.parametrize("where", [cp.BLOCK - 1, cp.BLOCK, cp.BLOCK + cp.BLOCK_OVERLAP - 2,
                                   cp.BLOCK + cp.BLOCK_OVERLAP + 1, 3 * cp.BLOCK + 5, 3990])  # fmt: skip
def test_a_long_series_finds_a_step_wherever_it_falls_against_the_blocks(where: int) -> None:
    x = _long(4000, {where: 0.10})  # 10 % on 1 % noise: far beyond any doubt
    assert x.size > cp.LONG_SERIES
    (step,) = detect(x, min_magnitude=0.03)
    assert abs(step.index - where) <= 1 and step.change == pytest.approx(0.10, abs=0.01)
    assert detect(_long(4000, {}), min_magnitude=0.03) == []


def test_the_memo_changes_no_answer_and_spares_every_block_but_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = _long(6000, {1500: 0.08, 4200: -0.06}, seed=3)
    searched = []
    real = cp._candidates
    monkeypatch.setattr(cp, "_candidates", lambda seg, m: searched.append(seg.size) or real(seg, m))
    memo = DictMemo()
    cold = detect(x, min_magnitude=0.03, memo=memo)
    assert [s.index for s in cold] == [1500, 4200]
    blocks = len(searched)
    assert blocks == len(memo.kept) >= 6000 // cp.BLOCK
    searched.clear()
    assert detect(x, min_magnitude=0.03, memo=memo) == cold and searched == []  # every block remembered
    assert detect(x, min_magnitude=0.03) == cold  # and the same without a memo
    longer = np.append(x, x[-1])  # the next night: the last block (and only it) is new
    searched.clear()
    assert [s.index for s in detect(longer, min_magnitude=0.03, memo=memo)] == [1500, 4200]
    assert len(searched) == 1


def test_a_memo_entry_that_does_not_fit_its_block_is_searched_again() -> None:
    x = _long(3000, {2000: 0.10})
    memo = DictMemo()
    detect(x, min_magnitude=0.03, memo=memo)
    for digest in memo.kept:
        memo.kept[digest] = [10**9, -5]  # no writer of ours made this
    assert [s.index for s in detect(x, min_magnitude=0.03, memo=memo)] == [2000]


def test_the_memo_file_saves_work_across_views_and_a_broken_one_is_skipped(tmp_path: Path) -> None:
    import os

    from scaleguard.history.memo import ChangePointMemo

    x = _long(3000, {2000: 0.10})
    memo = ChangePointMemo(tmp_path / "m")
    first = detect(x, min_magnitude=0.03, memo=memo)
    memo.close()
    assert memo.note is None and (tmp_path / "m" / "changepoint-memo.sqlite").is_file()
    again = ChangePointMemo(tmp_path / "m")
    assert detect(x, min_magnitude=0.03, memo=again) == first and again._used  # read back
    again.close()
    assert ChangePointMemo(tmp_path / "never").note is None and not (tmp_path / "never").exists()  # lazy
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "changepoint-memo.sqlite").write_bytes(b"not a database at all" * 100)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "fifo2").mkdir()
    os.mkfifo(tmp_path / "fifo2" / "changepoint-memo.sqlite")
    for broken in (tmp_path / "junk", tmp_path / "fifo2", tmp_path / "fifo"):  # junk, a FIFO, no directory
        memo = ChangePointMemo(broken)
        assert detect(x, min_magnitude=0.03, memo=memo) == first  # never a hang, never another answer
        memo.close()
        assert memo.note is not None and "skipped" in memo.note
