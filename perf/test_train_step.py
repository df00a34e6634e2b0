"""The suite: one parametrized test per case in the matrix (see ``scaleguard.matrix``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scaleguard.case import CaseSpec

pytestmark = pytest.mark.perf


def test_train_step(perf_case: CaseSpec, perf_run: Callable[[CaseSpec], Any]) -> None:
    """Measure steady-state training steps of ``perf_case`` on all its ranks."""
    result = perf_run(perf_case)
    assert len(result.step_s) == perf_case.settings.steps
