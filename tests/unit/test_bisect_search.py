"""The bisection's search over scripted probes: which builds it measures, in which order, and
what it concludes (the probes themselves, real A/B sessions, are tested in tests/plugin)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from scaleguard.schedule import bisect


class FakeInterpreters:
    """Every build is its own interpreter; nothing is installed or started."""

    def __init__(self, count: int) -> None:
        self.count = count

    def side(self, index: int) -> Any:
        assert 0 <= index < self.count
        return SimpleNamespace(
            interpreter=SimpleNamespace(python=f"/builds/{index}/python"),
            versions={"torch": f"2.15.0.dev{index}", "git": None},
        )


def search(
    statuses: dict[int, str], count: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[int], str]:
    """Runs the search over ``count`` builds whose probes read ``statuses`` (index -> status;
    a probe reads a case IMPROVED as SAME): (exit code, the builds probed in order, what was said)."""
    probed: list[int] = []
    said: list[str] = []

    def probe(good: str, python: str, args: list[str], index: int, *rest: Any) -> bisect.Probe:
        assert good == "/builds/0/python" and python == f"/builds/{index}/python"
        probed.append(index)
        return bisect.Probe(index, statuses[index], (f"story of {index}",))

    monkeypatch.setattr(bisect, "probe_build", probe)
    builds = [bisect.Build(f"build{i}") for i in range(count)]
    code = bisect._search(builds, FakeInterpreters(count), [], Path("/nonexistent"), said.append)  # type: ignore[arg-type]
    return code, probed, "\n".join(said)


@pytest.mark.parametrize("first_bad", range(1, 17))
def test_the_first_bad_of_17_builds_is_found_in_at_most_log2_probes_after_the_bad_end(
    first_bad: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    statuses = {i: "REGRESSED" if i >= first_bad else "SAME" for i in range(17)}
    code, probed, said = search(statuses, 17, monkeypatch)
    assert code == 0, said
    assert probed[0] == 16  # the bad end first: a regression that does not reproduce costs one probe
    assert len(probed) == 1 + 4  # log2(16) halvings after it
    assert len(set(probed)) == len(probed) and 0 not in probed  # the good end is never probed
    assert f"first bad: build{first_bad} (torch 2.15.0.dev{first_bad}" in said
    assert f"last good: build{first_bad - 1} (" in said


def test_four_builds_are_probed_bad_end_then_halves(monkeypatch: pytest.MonkeyPatch) -> None:
    code, probed, said = search({1: "SAME", 2: "REGRESSED", 3: "REGRESSED"}, 4, monkeypatch)
    assert (code, probed) == (0, [3, 1, 2]), said
    assert "probe build 1 (build1) against build 0: SAME" in said and "  story of 1" in said


@pytest.mark.parametrize("status", ["SAME", "INCONCLUSIVE", "FAILED"])
def test_a_bad_end_that_does_not_regress_is_not_found_after_one_probe(
    status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, probed, said = search({4: status}, 5, monkeypatch)
    assert (code, probed) == (1, [4]), said
    assert f"not found: the bad end (build4) reads {status} against the good end" in said


@pytest.mark.parametrize("status", ["INCONCLUSIVE", "FAILED"])
def test_an_undecided_probe_stops_the_search_with_the_range_open_never_a_guess(
    status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, probed, said = search({8: "REGRESSED", 4: "SAME", 6: status}, 9, monkeypatch)
    assert (code, probed) == (1, [8, 4, 6]), said
    assert f"undecidable: build 6 (build6) reads {status}; the first bad build is among builds 5..8" in said
    assert "first bad:" not in said


def test_wrong_pytest_arguments_stop_at_the_first_probe_with_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    code, probed, said = search({3: "USAGE"}, 4, monkeypatch)
    assert (code, probed) == (2, [3]) and "pytest arguments (after --) are wrong" in said
    code, probed, _ = search({3: "REGRESSED", 1: "USAGE"}, 4, monkeypatch)
    assert (code, probed) == (2, [3, 1])
