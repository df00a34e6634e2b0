"""A DDP (and FSDP) case's projection on real gloo ranks: world size 1 records its compute at the
smaller batches, world size 2 its buckets and their all-reduce (FSDP: its units, their gathers and
scatters, and a 2-sample step), and the table, the saved JSON and the
baseline carry the projected efficiency beside the measured one. (Its accuracy is measured over
sessions, benchmarks/projection_accuracy.py, never asserted: two shared cores are noisy.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugin.test_verdicts_plugin import ARGS, this_machines_baseline

pytestmark = pytest.mark.timeout(500)


def test_ws2_is_projected_from_ws1_and_the_projection_is_shown_saved_and_recorded(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    baselines, path = this_machines_baseline(tmp_path)
    saved = tmp_path / "bench.json"
    result = suite.runpytest_subprocess(
        *ARGS, "--perf-threads-per-rank", "1", f"--perf-baselines={baselines}", "--perf-update-baselines",
        f"--benchmark-json={saved}",
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    result.stdout.re_match_lines(
        [r"ws2 projected efficiency \d\.\d\d; measured \d\.\d\d \(from ws1: compute .*"]
    )
    infos = {b["extra_info"]["case_id"]: b["extra_info"] for b in json.loads(saved.read_text())["benchmarks"]}
    projected = infos["transformer_tiny-ddp-ws2-fp32-strong"]["projection"]
    assert 0.0 < projected["efficiency"] < 2.0 and projected["buckets"] >= 1 and projected["comm_ms"] > 0
    assert projected["overlap"] is False  # gloo on CPU
    assert "projection" not in infos["transformer_tiny-ddp-ws1-fp32-strong"]
    cases = json.loads(path.read_text())["cases"]
    (ws1,) = cases["transformer_tiny-ddp-ws1-fp32-strong"].values()
    (ws2,) = cases["transformer_tiny-ddp-ws2-fp32-strong"].values()
    # ws1 measured its compute at ws2's per-rank batch; ws2 its buckets, each timed alone
    half = str(infos["transformer_tiny-ddp-ws2-fp32-strong"]["per_rank_batch"])
    assert half in ws1["runs"][0]["scaling"]["phase_ms_at"]
    scaling = ws2["runs"][0]["scaling"]
    assert len(scaling["buckets"]) == len(scaling["bucket_s"]) >= 1
    assert sum(size for size, _ in scaling["buckets"]) > 0
    # and the history keeps it with the runs, where the page draws it beside the measured efficiency
    from scaleguard.history.database import History

    with History(suite.path / ".scaleguard" / "history.sqlite", readonly=True) as db:
        rows = {r.case_id: r for r in db.rows()}
    assert rows["transformer_tiny-ddp-ws2-fp32-strong"].projected == pytest.approx(projected["efficiency"])
    assert rows["transformer_tiny-ddp-ws1-fp32-strong"].projected is None


def test_an_fsdp_case_is_projected_from_its_units_and_what_fsdp_pays_for_them(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    baselines, _ = this_machines_baseline(tmp_path)
    saved = tmp_path / "bench.json"
    args = [a if a != "ddp" else "fsdp" for a in ARGS]
    result = suite.runpytest_subprocess(
        *args, "--perf-threads-per-rank", "1", f"--perf-baselines={baselines}", f"--benchmark-json={saved}"
    )
    result.assert_outcomes(passed=2)
    result.stdout.re_match_lines(
        [
            r"ws2 projected efficiency \d\.\d\d; measured \d\.\d\d \(from ws1: .* all-gathers and reduce-scatters"
        ]
    )
    infos = {b["extra_info"]["case_id"]: b["extra_info"] for b in json.loads(saved.read_text())["benchmarks"]}
    projected = infos["transformer_tiny-fsdp-ws2-fp32-strong"]["projection"]
    assert projected["mode"] == "fsdp" and projected["buckets"] == 3  # the root and its two blocks
    assert 0.0 < projected["efficiency"] < 2.0 and projected["overlap"] is False
    ws1 = infos["transformer_tiny-fsdp-ws1-fp32-strong"]["runs"][0]["scaling"]
    ws2 = infos["transformer_tiny-fsdp-ws2-fp32-strong"]["runs"][0]["scaling"]
    # ws1: its compute at ws2's per-rank batch and at 2 samples; ws2: the same 2-sample step
    # (what FSDP pays for its collectives), each unit's bytes and gathers, each timed alone
    half = str(infos["transformer_tiny-fsdp-ws2-fp32-strong"]["per_rank_batch"])
    assert {half, "2"} <= set(ws1["phase_ms_at"]) and "2" in ws2["phase_ms_at"]
    assert [gathers for _, gathers in ws2["units"]] == [1, 2, 2]
    assert len(ws2["gather_s"]) == len(ws2["scatter_s"]) == 3 and min(ws2["gather_s"]) > 0


@pytest.mark.parametrize("gate", [False, True])
def test_a_straggler_without_a_baseline_is_below_its_projection_and_named(
    suite: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process_tag: str, gate: bool
) -> None:
    from scaleguard.ranks.faults import FAULT_ENV

    # rank 1 busy 120 ms in every backward: ws2 runs far below its projection. 40 ms was near
    # half a step on a 35 ms VM, but a 2-core CI VM whose ws1 step read 98 ms moved ws2 to 0.51
    # against 0.71 projected: inside the 25 points this device's projections may miss by
    monkeypatch.setenv(FAULT_ENV, "slow,rank=1,at=backward,ms=120")
    baselines, _ = this_machines_baseline(tmp_path)
    # no load check: the straggler (120 ms a step) is far beyond what other processes on a CI
    # machine do, while a quarantine for their sake would leave nothing to judge (NOISY)
    extra = [
        "--perf-inject-faults",
        "--perf-no-load-check",
        *(["--perf-fail-below-projection"] if gate else []),
    ]
    result = suite.runpytest_subprocess(
        *ARGS, "--perf-threads-per-rank", "1", f"--perf-baselines={baselines}", *extra
    )
    if gate:
        result.assert_outcomes(passed=1, failed=1)
    else:
        result.assert_outcomes(passed=2)  # a warning: the case is not failed
    result.stdout.re_match_lines(
        # the projection may exceed 1 (ws1 computed its half batch in less than half its step: 1.10
        # on a CI run); the measured efficiency is near half of it
        [r".*transformer_tiny-ddp-ws2-fp32-strong BELOW-PROJECTION: efficiency 0\.\d\d vs \d\.\d\d projected from "
         r"ws1, \d+\.\d points below .*cause: a straggler .*rank 1 computes \d+\.\d ms/step more than the others.*"]
    )  # fmt: skip
