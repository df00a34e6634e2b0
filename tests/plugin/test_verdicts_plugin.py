"""Verdicts as users meet them: record a baseline, slow the DDP all-reduce, see it caught."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from scaleguard.baseline import host_hardware_key
from scaleguard.env import host_fingerprint
from scaleguard.faults import FAULT_ENV

pytestmark = pytest.mark.timeout(400)

# wide step threshold: CPU runs differ run to run by 10-20 %; the injected delay is far larger
ARGS = [
    "--perf-models",
    "transformer_tiny",
    "--perf-modes",
    "ddp",
    "--perf-scaling",
    "strong",
    "--perf-steps",
    "15",
    "--perf-warmup",
    "3",
    "--perf-threshold-step",
    "0.5",
    "--perf-threshold-efficiency",
    "0.2",
    "-p",
    "no:cacheprovider",
]


def test_slowed_allreduce_is_a_scaling_regression_at_ws2_only(
    suite: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process_tag: str
) -> None:
    baselines = tmp_path / "baselines"
    recorded = suite.runpytest_subprocess(*ARGS, f"--perf-baselines={baselines}", "--perf-update-baselines")
    recorded.assert_outcomes(passed=2)
    recorded.stdout.fnmatch_lines(["*scaleguard: baseline*: 2 cases recorded*"])
    (path,) = baselines.glob("cpu-*-1t.json")
    assert set(json.loads(path.read_text())["cases"]) == {
        "transformer_tiny-ddp-ws1-fp32-strong",
        "transformer_tiny-ddp-ws2-fp32-strong",
    }

    monkeypatch.setenv(FAULT_ENV, "commdelay,ms=80")  # every all-reduce bucket waits 80 ms
    slowed = suite.runpytest_subprocess(*ARGS, f"--perf-baselines={baselines}")
    slowed.assert_outcomes(passed=1, failed=1)
    out = slowed.stdout.str()
    story = re.search(r"transformer_tiny-ddp-ws2-fp32-strong REGRESSED: step .*", out)
    assert story, out
    change = float(re.search(r"\(\+(\d+\.\d)%", story.group(0)).group(1))
    assert change > 50, story.group(0)  # the delay, not noise: noise is never this large
    # named so only when the ws1 verdict of the same run was OK, IMPROVED or NOISY
    assert "(scaling regression: ws1 unchanged)" in story.group(0)
    assert "ws1-fp32-strong REGRESSED" not in out


def this_machines_baseline(tmp_path: Path) -> tuple[Path, Path]:
    """The baseline directory and the file this machine's CPU runs (1 thread/rank) would use."""
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    return baselines, baselines / f"{host_hardware_key(host_fingerprint(), 'cpu', 1)}.json"


def test_corrupt_baseline_stops_with_the_file_named_and_left_alone(
    suite: pytest.Pytester, tmp_path: Path
) -> None:
    baselines, path = this_machines_baseline(tmp_path)
    path.write_text('{"schema_version": 1, "hardware_key": "x", "cases": {')
    before = path.read_bytes()
    result = suite.runpytest_subprocess(*ARGS, f"--perf-baselines={baselines}", "--perf-update-baselines")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*baseline {path}: corrupt or truncated JSON*"])
    assert path.read_bytes() == before


def test_foreign_hardware_baseline_is_new_and_never_overwritten(
    suite: pytest.Pytester, tmp_path: Path
) -> None:
    baselines, path = this_machines_baseline(tmp_path)
    path.write_text(
        json.dumps({"schema_version": 1, "hardware_key": "cuda-nvidia-h200-x1", "hardware": {}, "cases": {}})
    )
    before = path.read_bytes()
    result = suite.runpytest_subprocess(
        *ARGS,
        "--perf-world-sizes",
        "1",
        "--perf-threads-per-rank",
        "1",
        f"--perf-baselines={baselines}",
        "--perf-update-baselines",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*NEW: *recorded on cuda-nvidia-h200-x1*other hardware is never compared*",
            "*baselines not updated*not overwritten*",
        ]
    )
    assert path.read_bytes() == before
