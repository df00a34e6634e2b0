"""The steady-state test that ends warmup (scaleguard.evidence.steady), on scripted step times whose
effects are far from the thresholds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaleguard.evidence.records import RankResult
from scaleguard.evidence.runs import RunRecord
from scaleguard.evidence.steady import WarmupPolicy, theil_sen_slope
from tests.conftest import tiny_spec

POLICY = WarmupPolicy(min_steps=3, max_steps=60, tolerance=0.03, window=6)


def first_steady(steps: list[float], policy: WarmupPolicy = POLICY) -> int | None:
    return next((n for n in range(1, len(steps) + 1) if policy.is_steady(steps[:n])), None)


def test_a_slow_drift_holds_warmup_back_where_two_window_medians_agree() -> None:
    # 0.4 % faster per step for 30 steps, then flat: two adjacent 6-step medians differ by
    # only 2.4 % (within 3 %), but the trend over 12 steps is 4.4 % and without noise
    drift = [1.0 - 0.004 * i for i in range(30)] + [0.88] * 20
    last, before = sorted(drift[6:12])[3], sorted(drift[:6])[3]
    assert abs(last / before - 1) < 0.03  # what a medians-only rule would have accepted
    assert (POLICY.unsteady_because(drift[:12]) or "").startswith("still drifting: -0.4")
    n = first_steady(drift)
    assert n is not None and n > 30


def test_noise_wider_than_the_tolerance_is_not_warmup() -> None:
    # medians 1.025 and 0.975 (4.9 % apart) inside each other's quartile range, no trend
    before = [1.0, 0.9, 1.15, 0.95, 1.1, 1.05]
    last = [0.95, 1.1, 0.85, 1.05, 0.9, 1.0]
    assert POLICY.unsteady_because(before + last) is None


def test_a_level_shift_beyond_the_spread_is_not_steady() -> None:
    quiet = [1.0, 1.004, 0.996, 1.002, 0.998, 1.0]
    why = POLICY.unsteady_because(quiet + [x * 0.9 for x in quiet])
    assert why is not None and why.startswith("the medians of the last two 6-step windows differ by -10.0%")


def test_slow_steps_that_start_recurring_hold_warmup_back() -> None:
    flat = [1.0] * 6
    why = POLICY.unsteady_because([*flat, 1.0, 1.5, 1.0, 1.0, 1.5, 1.0])
    assert why is not None and why.startswith("recurring slow steps")
    # the same pattern in both windows is the steady state (it will be in the measured steps)
    periodic = [1.0, 1.5, 1.0] * 4
    assert POLICY.unsteady_because(periodic) is None


def test_one_outlier_fakes_neither_a_trend_nor_a_shift() -> None:
    assert POLICY.is_steady([1.0] * 11 + [3.0])
    assert POLICY.is_steady([3.0] + [1.0] * 11)


def test_compile_like_warmup_ends_once_two_windows_are_fast() -> None:
    steps = [5.0] * 6 + [1.0] * 20
    # the earlier window's median is fast once 4 of its 6 steps are (an even window averages
    # its middle two): 6 slow, then 10 fast steps
    assert first_steady(steps) == 16


def test_a_run_whose_warmup_hit_its_cap_says_which_test_failed() -> None:
    spec = tiny_spec()
    spec = replace(spec, settings=replace(spec.settings, warmup_min=2, warmup_max=20, warmup_tolerance=0.01))
    # 0.15 % per step: adjacent 6-step medians agree within 1 %, the 12-step trend does not
    falling = tuple(1.0 * 0.9985**i for i in range(20))
    ranks = [
        RankResult(
            case_id=spec.case_id,
            rank=0,
            step_s=(0.5, 0.5),
            warmup_step_s=falling,
            steady=False,
            final_loss=0.5,
            peak_mem_bytes=1,
            mem_kind="host_max_rss",
            device_name="cpu",
            runtime={"torch": "2.x"},
            settings={},
        )
    ]
    run = RunRecord.from_ranks(spec, ranks)
    assert not run.steady
    assert any(
        "warmup reached its cap of 20 steps" in note and "still drifting: -0.15% per step" in note
        for note in run.notes
    ), run.notes


@pytest.mark.parametrize("steps", [[], [1.0] * 11])
def test_too_few_steps_are_never_steady(steps: list[float]) -> None:
    assert not POLICY.is_steady(steps)


def test_the_slope_is_scipys_theil_sen_estimate() -> None:
    import numpy as np
    from scipy import stats

    rng = np.random.default_rng(3)
    for _ in range(20):
        y = rng.lognormal(0, 0.1, 12) * np.linspace(1.2, 1.0, 12)
        assert theil_sen_slope(y) == pytest.approx(stats.theilslopes(y)[0], rel=1e-12)
