from __future__ import annotations

import pytest
import torch

from scaleguard.evidence.steady import WarmupPolicy
from scaleguard.ranks.timing import MeasuredSteps, NonFiniteLossError, measure


class ScriptedClock:
    """A clock whose intervals are scripted: one entry per step, consumed in order."""

    def __init__(self, durations: list[float]) -> None:
        self.durations = list(durations)
        self.now = 0.0
        self.marks: list[float] = []

    def mark(self) -> None:
        self.marks.append(self.now)

    def advance(self) -> None:
        self.now += self.durations.pop(0)

    def intervals_s(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]

    def reset(self) -> None:
        self.marks = []


def run(
    durations: list[float], policy: WarmupPolicy, steps: int, losses: list[float] | None = None
) -> MeasuredSteps:
    clock = ScriptedClock(durations)
    values = iter(losses or [1.0] * len(durations))

    def step() -> torch.Tensor:
        clock.advance()
        return torch.tensor(next(values))

    return measure(step, clock, policy, steps)


def test_warmup_stops_once_running_median_settles() -> None:
    # 6 slow compile-like steps, then 1.0 s: steady once the window before the last one has a
    # majority of fast steps too (medians, not means: one slow step does not hold warmup back)
    warm = [5.0] * 6 + [1.0] * 8
    result = run(warm + [2.0] * 3, WarmupPolicy(min_steps=3, max_steps=50, window=5), steps=3)
    assert len(result.warmup_step_s) == 14
    assert result.steady
    assert result.step_s == pytest.approx((2.0, 2.0, 2.0))


def test_warmup_is_capped_and_says_so() -> None:
    still_falling = [10.0 * 0.9**i for i in range(20)]  # every window 10 % faster than the last
    result = run(
        still_falling + [1.0] * 2, WarmupPolicy(min_steps=2, max_steps=20, tolerance=0.01, window=3), 2
    )
    assert len(result.warmup_step_s) == 20
    assert not result.steady


def test_measured_steps_are_each_interval_not_warmup() -> None:
    result = run([1.0] * 10 + [0.1, 0.2, 0.3], WarmupPolicy(min_steps=10, max_steps=10, window=5), steps=3)
    assert result.step_s == pytest.approx((0.1, 0.2, 0.3))


def test_nan_loss_in_measured_steps_fails() -> None:
    losses = [1.0] * 4 + [1.0, float("nan"), 1.0]
    with pytest.raises(NonFiniteLossError, match="measured steps"):
        run([1.0] * 7, WarmupPolicy(min_steps=4, max_steps=4), steps=3, losses=losses)


def test_inf_loss_in_warmup_fails_at_once() -> None:
    with pytest.raises(NonFiniteLossError, match="warmup step 1"):
        run(
            [1.0] * 7, WarmupPolicy(min_steps=4, max_steps=4), steps=3, losses=[1.0, float("inf")] + [1.0] * 5
        )


def test_warmup_decision_uses_the_slowest_rank() -> None:
    seen: list[float] = []

    def agree_max(x: float) -> float:
        seen.append(x)
        return max(x, 7.0)  # another rank is always slower

    clock = ScriptedClock([1.0] * 20)

    def step() -> torch.Tensor:
        clock.advance()
        return torch.tensor(1.0)

    result = measure(step, clock, WarmupPolicy(min_steps=2, max_steps=10, window=2), 2, agree_max=agree_max)
    assert set(result.warmup_step_s) == {7.0}
    assert seen[-1] == 0.0  # the barrier before the measured steps


def test_adaptive_sampling_pins_a_bimodal_median_with_more_steps() -> None:
    from scaleguard.ranks.timing import Sampling

    policy = WarmupPolicy(min_steps=2, max_steps=2)
    bimodal = [1.0, 1.0] + [1.0 if i % 2 else 1.4 for i in range(400)]  # host-launch-bound steps
    wide = run(bimodal, policy, Sampling(20, max_steps=200, max_seconds=1e9, target_ci=0.02))  # type: ignore[arg-type]
    assert 20 < len(wide.step_s) <= 200 and len(wide.step_s) % 10 == 0
    tight = [1.0] * 402
    pinned = run(tight, policy, Sampling(20, max_steps=200, max_seconds=1e9, target_ci=0.02))  # type: ignore[arg-type]
    assert len(pinned.step_s) == 20  # a pinned median costs nothing extra
    capped = run(bimodal, policy, Sampling(20, max_steps=35, max_seconds=1e9, target_ci=0.001))  # type: ignore[arg-type]
    assert len(capped.step_s) == 35
