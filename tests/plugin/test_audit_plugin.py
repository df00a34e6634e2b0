"""Issue 22's rows that the suite meets: each a usage error (exit 4) before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaleguard.evidence import baseline
from tests.unit.test_verdicts import case, spread_runs

pytestmark = pytest.mark.timeout(300)

COLLECT = ["--collect-only", "-q", "-p", "no:cacheprovider", "--perf-models", "transformer_tiny"]


def _key(suite: pytest.Pytester) -> str:
    done = suite.run("scaleguard", "hardware-key", "--device", "cpu", "--threads-per-rank", "1")
    return done.stdout.str().strip()


def _usage_error(result: pytest.RunResult, needle: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    text = result.stderr.str() + result.stdout.str()
    assert needle in text and "Traceback" not in text, text


# row 10
def test_an_absent_baseline_torch_names_the_versions_present(suite: pytest.Pytester) -> None:
    key = _key(suite)
    baseline.update(
        suite.path / "baselines" / f"{key}.json", key, {}, [case(spread_runs(3, 0.1, 0.01, seed=1), ws=1)]
    )
    result = suite.runpytest_subprocess(
        *COLLECT, "--perf-threads-per-rank", "1", "--perf-baseline-torch", "9.9"
    )
    _usage_error(result, "torch versions present: 2.11.0")


# row 11
@pytest.mark.parametrize(
    ("ini_line", "option", "needle"),
    [
        ("* min_spread=1.0", None, "unknown threshold 'min_spread'"),
        ("* alpha=1e-6", None, "unknown threshold 'alpha'"),
        ("step=0.2", None, "has no case-id glob"),
        ("transformer_tiny-*", None, "sets no threshold"),
        (None, "0.1 min_spread=1", "is not a number"),
    ],
)
def test_thresholds_that_would_open_the_gate_are_refused(
    suite: pytest.Pytester, ini_line: str | None, option: str | None, needle: str
) -> None:
    if ini_line is not None:
        suite.makeini(f"[pytest]\nperf_case_thresholds =\n    {ini_line}\n")
    args = [*COLLECT] + (["--perf-threshold-step", option] if option else [])
    _usage_error(suite.runpytest_subprocess(*args), needle)


def test_a_tab_separated_line_applies_and_a_glob_matching_nothing_is_named(suite: pytest.Pytester) -> None:
    suite.makeini(
        "[pytest]\nperf_case_thresholds =\n    transformer_tiny-*\tstep=0.2\n    nomatch-* step=0.2\n"
    )
    result = suite.runpytest_subprocess(*COLLECT)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*perf_case_thresholds line 'nomatch-* step=0.2' matches no case*"])
    assert "transformer_tiny-*" not in result.stdout.str().split("matches no case")[0].splitlines()[-1]


# row 13
def test_a_missing_default_baselines_directory_is_a_usage_error(suite: pytest.Pytester) -> None:
    (suite.path / "baselines").rmdir()
    _usage_error(suite.runpytest_subprocess(*COLLECT), "does not exist")


def test_a_baseline_named_for_this_hardware_but_holding_another_is_refused(suite: pytest.Pytester) -> None:
    key = _key(suite)
    path = suite.path / "baselines" / f"{key}.json"
    baseline.update(path, "cuda-other-x8", {}, [case(spread_runs(3, 0.1, 0.01, seed=1), ws=1)])
    assert json.loads(path.read_text())["hardware_key"] == "cuda-other-x8"
    result = suite.runpytest_subprocess(*COLLECT, "--perf-threads-per-rank", "1")
    _usage_error(result, "holds hardware_key 'cuda-other-x8'")


def test_the_workflow_keeps_quoted_extra_arguments_whole(tmp_path: Path) -> None:
    import subprocess

    import yaml

    flow = yaml.safe_load((Path(__file__).parents[2] / ".github/workflows/nightly-gpu.yml").read_text())
    steps = flow["jobs"]["perf"]["steps"]
    script = next(s["run"] for s in steps if s.get("id") == "suite")
    split = next(line for line in script.splitlines() if "readarray" in line)
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{split}\nprintf '<%s>\\n' \"${{extra[@]}}\""],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "EXTRA_ARGS": '-k "ddp and ws2" --perf-models resnet50',
            "PATH": "/usr/bin:/bin:" + str(Path(__import__("sys").executable).parent),
        },
    )
    assert done.stdout.split("\n")[:4] == ["<-k>", "<ddp and ws2>", "<--perf-models>", "<resnet50>"], done


def test_the_workflow_report_step_survives_a_compare_that_exits_2(tmp_path: Path) -> None:
    import subprocess

    import yaml

    flow = yaml.safe_load((Path(__file__).parents[2] / ".github/workflows/nightly-gpu.yml").read_text())
    report = next(s for s in flow["jobs"]["perf"]["steps"] if s.get("name", "").startswith("Report"))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scaleguard").write_text(
        '#!/bin/bash\nif [ "$1" = hardware-key ]; then echo cuda-x; exit 0; fi\necho "bad input: x" >&2; exit 2\n'
    )
    (fake / "scaleguard").chmod(0o755)
    work = tmp_path / "w"
    (work / ".benchmarks" / "m").mkdir(parents=True)
    (work / ".benchmarks" / "m" / "0001_n.json").write_text("{}")
    (work / "baselines").mkdir()
    (work / "baselines" / "cuda-x.json").write_text("{}")
    summary = tmp_path / "summary.md"
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", report["run"]],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{fake}:/usr/bin:/bin", "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert done.returncode == 0, done.stderr
    assert "exited 2 without a report" in summary.read_text() and "bad input: x" in summary.read_text()


def test_shared_gpu_numbers_are_never_recorded(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*COLLECT, "--perf-share-gpu", "--perf-update-baselines")
    _usage_error(result, "never written into a baseline")
