"""The projection's compute-only phases (``ranks.overlap.phase_ms``): the batches taken in
alternating rounds, more rounds where steps are short, and exactly as many on every rank of a
group (a rank that stopped early would leave its peers waiting in a collective)."""

from __future__ import annotations

import itertools
from typing import Any

from scaleguard.ranks import overlap
from scaleguard.ranks.profiling import PhasedStep


def _phased(calls: list[Any], ms: dict[Any, float], clock: list[float], step_s: float) -> PhasedStep:
    def phases(grad_sync: bool, take: int | None = None) -> dict[str, float]:
        assert grad_sync is False  # compute only: the all-reduce skipped
        calls.append(take)
        clock[0] += step_s
        return {"data": 0.0, "forward": ms[take] / 2e3, "backward": ms[take] / 2e3, "optimizer": 0.0}

    return PhasedStep(step=lambda: None, phases=phases, can_skip_sync=True)


def test_batches_alternate_and_short_steps_buy_rounds(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(overlap.time, "perf_counter", lambda: clock[0])
    calls: list[Any] = []
    phased = _phased(calls, {None: 20.0, 8: 11.0}, clock, step_s=0.01)
    out = overlap.phase_ms(phased, (None, 8), alone=True)
    # one step of each batch per round, in turn: a machine slowing meets both alike
    assert calls[:6] == [None, 8, None, 8, None, 8]
    assert all(a != b for a, b in itertools.pairwise(calls))
    # 10 ms steps: the 0.6 s budget is not spent before the cap, so the cap decides
    assert len(calls) == 2 * overlap.PHASE_STEPS_MAX
    assert out[None]["forward"] == 10.0 and out[8]["backward"] == 5.5


def test_long_steps_stop_at_the_minimum_rounds(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(overlap.time, "perf_counter", lambda: clock[0])
    calls: list[Any] = []
    overlap.phase_ms(_phased(calls, {None: 100.0}, clock, step_s=0.5), (None,), alone=True)
    assert len(calls) == overlap.PHASE_STEPS  # 3 x 0.5 s is past the budget: no more


def test_ranks_of_a_group_take_exactly_the_minimum_whatever_their_clock(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(overlap.time, "perf_counter", lambda: clock[0])
    calls: list[Any] = []
    # steps so short that a rank alone would go on: a group's rank must not
    overlap.phase_ms(_phased(calls, {None: 1.0, 2: 0.5}, clock, step_s=0.0001), (None, 2), alone=False)
    assert calls == [None, 2] * overlap.PHASE_STEPS
