"""The suite: one parametrized test per case in the matrix (see ``scaleguard.schedule.matrix``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scaleguard.case import CaseSpec

pytestmark = pytest.mark.perf


def test_train_step(perf_case: CaseSpec, perf_run: Callable[[CaseSpec], Any]) -> None:
    """Measure steady-state training steps of ``perf_case`` in fresh processes, run by run."""
    evidence = perf_run(perf_case)
    assert evidence.runs and all(r.summary.n >= perf_case.settings.steps for r in evidence.runs)
