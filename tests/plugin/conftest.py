"""Fixtures for driving the plugin as a user would: a pytester dir holding the suite's test file."""

from __future__ import annotations

from pathlib import Path

import pytest

PERF_TEST = (Path(__file__).parents[2] / "perf" / "test_train_step.py").read_text()


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_train_step=PERF_TEST)
    pytester.mkdir("baselines")  # a checkout has it: a missing one is a usage error
    return pytester
