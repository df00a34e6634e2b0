"""Paired A/B with real gloo ranks started by the side's interpreter, as users run it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scaleguard.evidence.verdict import Thresholds
from scaleguard.ranks.faults import FAULT_ENV
from scaleguard.ranks.protocol import CaseFailedError
from scaleguard.schedule import ab
from tests.conftest import tiny_spec

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]


def sides(b_env: list[tuple[str, str]]) -> tuple[ab.Side, ab.Side]:
    return ab.probe("A", sys.executable), ab.probe("B", sys.executable, b_env)


def test_a_slowdown_only_b_has_is_regressed(tmp_path: Path, process_tag: str) -> None:
    a, b = sides([(FAULT_ENV, "slow,pct=100")])  # B's compute twice as long; A untouched
    session = ab.ABSession(
        a, b, tmp_path, 120, lambda c: Thresholds.for_device("cpu"), ab.ABSchedule(max_pairs=6)
    )
    verdict = session.measure(tiny_spec(mode="single", world_size=1, steps=6))
    assert verdict.status == "REGRESSED" and verdict.step is not None and verdict.step.change > 0.5, (
        verdict.story
    )
    assert verdict.orders.count("AB") == verdict.orders.count("BA")


def test_a_side_that_crashes_is_dropped_then_fails_the_case_with_nothing_left(
    tmp_path: Path, process_tag: str
) -> None:
    a, b = sides([(FAULT_ENV, "raise,rank=1,phase=measure,step=1")])
    session = ab.ABSession(
        a, b, tmp_path, 120, lambda c: Thresholds.for_device("cpu"), ab.ABSchedule(max_pairs=4)
    )
    with pytest.raises(CaseFailedError, match="A/B pairs failed") as info:
        session.measure(tiny_spec(world_size=2, steps=4))
    assert "side B failed: InjectedFault" in str(info.value)
    assert not session.ledgers["A"].records  # A's runs of the dropped pairs are not kept


def test_the_other_interpreter_keeps_its_own_sys_path() -> None:
    """spawn hands a child the parent's sys.path: the other side would import *our* torch."""
    from multiprocessing import spawn

    from scaleguard.ranks.launcher import _started_as
    from scaleguard.ranks.protocol import Interpreter

    assert "sys_path" in spawn.get_preparation_data("rank")
    with _started_as(Interpreter(sys.executable)):
        data = spawn.get_preparation_data("rank")
        assert "sys_path" not in data and "init_main_from_name" not in data
    assert "sys_path" in spawn.get_preparation_data("rank")  # restored
