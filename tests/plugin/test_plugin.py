"""The plugin as users drive it: a real ``pytest`` subprocess over a perf test file."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main
from scaleguard.ranks.faults import FAULT_ENV
from tests.conftest import TAG_ENV, lingering, tagged_pids

pytestmark = pytest.mark.timeout(300)

FAST = [
    "--perf-models",
    "transformer_tiny",
    "--perf-scaling",
    "strong",
    "--perf-steps",
    "4",
    "--perf-warmup",
    "2",
    "-p",
    "no:cacheprovider",
]


def test_benchmark_save_holds_the_measured_per_step_samples(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    storage = tmp_path / "bench"
    result = suite.runpytest_subprocess(
        *FAST,
        "--perf-modes",
        "single,dp,ddp",
        "-rs",
        "--benchmark-save=smoke",
        "--benchmark-save-data",
        f"--benchmark-storage=file://{storage}",
    )
    result.assert_outcomes(passed=3, skipped=1)  # dp-ws2; DataParallel at ws1 is not a case
    result.stdout.fnmatch_lines(
        ["*scaleguard scaling*", "*transformer_tiny-ddp-fp32-strong*", "*DataParallel needs CUDA devices*"]
    )
    (saved,) = storage.glob("*/*_smoke.json")
    data = json.loads(saved.read_text())
    names = sorted(b["param"] for b in data["benchmarks"])
    assert names == [
        "transformer_tiny-ddp-ws1-fp32-strong",
        "transformer_tiny-ddp-ws2-fp32-strong",
        "transformer_tiny-single-ws1-fp32-strong",
    ]
    for bench in data["benchmarks"]:
        stats, info = bench["stats"], bench["extra_info"]
        samples = stats["data"]
        assert stats["rounds"] == len(samples) >= 4  # adaptive sampling may add steps
        assert stats["min"] == min(samples) and stats["max"] == max(samples)
        assert stats["median"] == pytest.approx(statistics.median(samples))
        assert stats["mean"] == pytest.approx(statistics.mean(samples))
        assert stats["stddev"] == pytest.approx(statistics.stdev(samples))
        # computed independently by scaleguard from the rank files: the same numbers. One run
        # per case on a quiet machine; a noisy one may add confirm runs (a provisional
        # BELOW-PROJECTION on a busy CI runner did), whose steps follow in order
        runs = info["runs"]
        assert [s for run in runs for s in run["step_s"]] == pytest.approx(samples)
        assert all(run["peak_mem_bytes"] > 0 for run in runs)
        counted = [run for run in runs if run.get("quarantine") is None] or runs
        run_medians = [statistics.median(run["step_s"]) for run in counted]
        assert info["median_step_s"] == pytest.approx(statistics.geometric_mean(run_medians))
        if len(runs) == 1:
            assert info["median_step_s"] == pytest.approx(stats["median"])
        assert info["samples_per_s"] == pytest.approx(info["global_batch"] / info["median_step_s"])
        assert info["world_size"] in (1, 2) and info["settings"]["threads_per_rank"] == 1
    ws2 = next(b for b in data["benchmarks"] if b["extra_info"]["world_size"] == 2)["extra_info"]
    speedup = ws2["runs"][0]["speedup"]
    assert speedup is not None and ws2["runs"][0]["scaling_efficiency"] == pytest.approx(speedup / 2)
    # the case's efficiency is its counted runs' mean: none where a busy machine quarantined
    # every run (CI on a VM losing a third of its time to steal did)
    effs = [r["scaling_efficiency"] for r in ws2["runs"] if r.get("quarantine") is None]
    assert ws2["scaling_efficiency"] == (pytest.approx(statistics.fmean(effs)) if effs else None)
    machine = data["machine_info"]
    assert machine["torch_version"].startswith("2.") and machine["threads_per_rank"] == 1
    assert machine["scaleguard"]["device"] == "cpu" and machine["cpu_model"]
    compare = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", str(saved)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert compare.returncode == 0, compare.stderr
    assert "transformer_tiny-ddp-ws2-fp32-strong" in compare.stdout
    # our own compare reads the same file (raw samples kept in extra_info): a run against itself
    md = tmp_path / "self.md"
    assert cli_main(["compare", str(saved), str(saved), "--markdown", str(md)]) == 0
    assert "| transformer_tiny-ddp-ws2-fp32-strong |" in md.read_text() and "REGRESSED" not in md.read_text()


def test_ids_select_with_k(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*FAST, "--collect-only", "-q", "-k", "ddp and ws2")
    result.stdout.fnmatch_lines(
        [
            "*test_train_step[[]transformer_tiny-ddp-ws2-fp32-strong[]]*",
            "*1/4 tests collected (3 deselected)*",  # DataParallel at ws1 is no case,
        ]
    )


def test_failing_case_fails_only_itself_and_names_the_rank(
    suite: pytest.Pytester, process_tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "raise,rank=1,phase=warmup,step=1")
    result = suite.runpytest_subprocess(*FAST, "--perf-modes", "single,ddp", "--perf-inject-faults")
    result.assert_outcomes(passed=2, failed=1)  # ws1 cases have no rank 1 and still pass
    result.stdout.fnmatch_lines(
        [
            "*FAULT INJECTED into every run (the environment): SCALEGUARD_INJECT_FAULT=raise,rank=1*",
            "*transformer_tiny-ddp-ws2-fp32-strong: rank 1: InjectedFault*",
        ]
    )


@pytest.mark.parametrize(
    ("fault", "extra", "says"),
    [
        (
            "raise,rank=1",
            (),
            "*SCALEGUARD_INJECT_FAULT='raise,rank=1' is set (the environment)*--perf-inject-faults*",
        ),
        (
            "explode",
            ("--perf-inject-faults",),
            "*SCALEGUARD_INJECT_FAULT='explode' (the environment) is no fault*",
        ),
        (
            "slow,ms=x",
            ("--perf-inject-faults",),
            "*SCALEGUARD_INJECT_FAULT='slow,ms=x' (the environment) is no fault*",
        ),
    ],
)
def test_a_stray_or_bad_fault_variable_is_a_usage_error_before_any_run(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fault: str, extra: tuple[str, ...], says: str
) -> None:
    monkeypatch.setenv(FAULT_ENV, fault)
    result = suite.runpytest_subprocess(*FAST, *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([says])


def test_bad_options_are_usage_errors(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*FAST, "--perf-modes", "single,zero")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*scaleguard: unknown modes*zero*choose from single, dp, ddp, fsdp, compile*"]
    )


def test_ini_twins_are_read(suite: pytest.Pytester) -> None:
    suite.makeini("[pytest]\nperf_models = resnet18_cifar\nperf_modes = ddp\nperf_world_sizes = 2\n")
    result = suite.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*resnet18_cifar-ddp-ws2-fp32-strong*", "*3 tests collected*"])


@pytest.mark.parametrize(
    ("line", "option"), [("perf_device = gpu", "device"), ("perf_profile = huge", "profile")]
)
def test_an_ini_twin_goes_through_the_choices_its_option_has(
    suite: pytest.Pytester, line: str, option: str
) -> None:
    suite.makeini(f"[pytest]\n{line}\n")
    result = suite.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--perf-{option} (ini: perf_{option}) takes one of *, got '*'*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_under_xdist_perf_cases_skip_with_the_reason(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*FAST, "--perf-modes", "single", "-n", "1", "-rs")
    result.stdout.fnmatch_lines(["*perf cases run serially*"])
    result.assert_outcomes(skipped=1)


def _ranks(pids: list[int]) -> list[int]:
    """The spawned rank processes among ``pids``."""
    ranks = []
    for pid in pids:
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                ranks.append(pid)
        except OSError:
            continue
    return ranks


def test_ctrl_c_during_a_case_leaves_no_process_and_no_baseline(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    # ws1 cases finish (results exist), then rank 1 of ws2 hangs and the user presses Ctrl-C
    env = dict(os.environ, **{FAULT_ENV: "hang,rank=1,phase=measure,step=0", TAG_ENV: process_tag})
    baselines = tmp_path / "baselines"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *FAST,
        "--perf-modes",
        "single,ddp",
        "--perf-timeout",
        "120",
        f"--perf-baselines={baselines}",
        "--perf-update-baselines",
        "--perf-inject-faults",
        "--perf-threshold-step",
        "0.9",
    ]
    # Ctrl-C as a terminal delivers it: SIGINT handled. A runner that starts the tests in the
    # background (`cmd &` in a script) hands them SIGINT ignored, and Python keeps it ignored
    proc = subprocess.Popen(cmd, cwd=suite.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_ranks(tagged_pids(process_tag))) < 2:
        time.sleep(0.5)  # both ws2 ranks alive (pools run one at a time; the machine probe's
        # processes carry the tag too, and are not ranks)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    assert "interrupted: baselines not updated" in out.decode()
    # the sidecar lock file may exist (checked before measuring); no baseline was written
    assert not baselines.exists() or not [p for p in baselines.iterdir() if not p.name.endswith(".lock")]
    assert not lingering(process_tag)
