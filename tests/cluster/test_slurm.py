"""``pytest perf/ --perf-slurm`` on a real two-node Slurm (tools/local_slurm.sh): recorded and
judged across the nodes like a local session; each scheduler fault said, with an empty queue."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaleguard.ranks.faults import FAULT_ENV
from tests.cluster.conftest import queue
from tests.conftest import tagged_pids

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

KEY = "slurm-cpu-*-1t-1pn.json"


def cluster_args(root: Path, shared: Path, *extra: str) -> list[str]:
    """The cluster session's options; the run's files under ``shared``, its rootdir beside it
    (an argument that is a path, as --benchmark-storage, would move pytest's rootdir)."""
    return [
        "--rootdir",
        str(root),
        "--perf-slurm",
        "--perf-device",
        "cpu",
        "--perf-models",
        "transformer_tiny",
        "--perf-modes",
        "ddp",
        "--perf-scaling",
        "strong",
        "--perf-inputs",
        "synthetic",
        "--perf-steps",
        "5",
        "--perf-warmup",
        "2",
        "--perf-threads-per-rank",
        "1",
        # no confirm runs: ranks time-sharing this host's two cores are too noisy for them to
        # settle anything, and each costs a step on every node (the verdicts' power is
        # measured apart; the session tests on one machine test confirm runs)
        "--perf-confirm",
        "0",
        "--perf-slurm-dir",
        str(shared),
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        *extra,
    ]


def test_a_two_node_session_is_recorded_judged_and_catches_a_slowdown_on_one_node(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str
) -> None:
    shared = tmp_path / "shared"
    recorded = suite.runpytest_subprocess(
        *cluster_args(suite.path, shared, "--perf-update-baselines", "--perf-repeats", "3"), timeout=400
    )
    recorded.assert_outcomes(passed=2)
    out = recorded.stdout.str()
    assert "Slurm allocation" in out and "n1,n2" in out
    (path,) = (suite.path / "baselines").glob(KEY)
    data = json.loads(path.read_text())
    assert data["hardware"]["scheduler"] == "slurm" and data["hardware"]["ranks_per_node"] == 1
    (entry,) = data["cases"]["transformer_tiny-ddp-ws2-fp32-strong"].values()
    assert entry["config"]["nodes"] == 2  # a two-node case: never compared with a one-node one
    assert len(entry["runs"]) == 3
    assert all(r["host"]["slurm"]["nodes"] == ["n1", "n2"] for r in entry["runs"])
    (ws1,) = data["cases"]["transformer_tiny-ddp-ws1-fp32-strong"].values()
    assert "nodes" not in ws1["config"]  # one node: a one-node record of the same case matches

    bench = tmp_path / "bench"
    # unmodified: never REGRESSED. With confirm runs, as a night has them, and thresholds far
    # above this VM's noise: the two "nodes" share its 2 cores, so a slower minute of the VM
    # moves ws2 (gloo over loopback, two ranks on two cores) more than ws1. CI runs met the
    # all-reduce 0.6 -> 3.8 ms at half the probe's speed, and (2026-12-07) ws2 +24 % and its
    # efficiency 0.86 -> 0.64 over all 3 runs with the probe 24 % slow: an A/A that close to
    # the default 10 % is a rate to measure, not a test's assertion. The slowdown below is
    # judged at the defaults, far beyond them
    judged = suite.runpytest_subprocess(
        *cluster_args(suite.path, shared, "--benchmark-save=cluster", f"--benchmark-storage=file://{bench}"),
        "--perf-confirm",
        "2",
        "--perf-threshold-step",
        "0.6",
        "--perf-threshold-efficiency",
        "0.4",
        timeout=400,
    )
    judged.assert_outcomes(passed=2)
    # no case ends REGRESSED; a first run that read so (then cleared by its confirm runs: a CI
    # run's ws2 did) is the progress line "REGRESSED so far; 2 confirm runs", not a verdict
    assert not re.search(r"REGRESSED(?! so far)", judged.stdout.str()), judged.stdout.str()
    (saved,) = bench.glob("*/*_cluster.json")
    params = sorted(b["param"] for b in json.loads(saved.read_text())["benchmarks"])
    assert params == ["transformer_tiny-ddp-ws1-fp32-strong", "transformer_tiny-ddp-ws2-fp32-strong"]
    history = suite.path / ".scaleguard" / "history.sqlite"
    assert history.is_file()

    # rank 1 runs on n2: 4x its compute there, n1 untouched
    os.environ[FAULT_ENV] = "slow,rank=1,pct=300"
    try:
        slowed = suite.runpytest_subprocess(
            *cluster_args(suite.path, shared, "-k", "ws2", "--perf-inject-faults"), timeout=400
        )
    finally:
        del os.environ[FAULT_ENV]
    slowed.assert_outcomes(failed=1, deselected=1)
    slowed.stdout.fnmatch_lines(["*transformer_tiny-ddp-ws2-fp32-strong REGRESSED: step*"])


def test_a_rank_killed_mid_run_fails_its_case_with_the_step_and_the_rank(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(FAULT_ENV, "sigkill,rank=1,phase=measure,step=2")
    result = suite.runpytest_subprocess(
        *cluster_args(suite.path, tmp_path / "shared", "-k", "ws2", "--perf-inject-faults"), timeout=400
    )
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["*transformer_tiny-ddp-ws2-fp32-strong: rank 1: Slurm step *.* on n1,n2 ended FAILED*task 1 on n2*"]
    )


def test_a_hung_rank_meets_the_cases_deadline(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(FAULT_ENV, "hang,rank=1,phase=measure,step=1")
    started = time.monotonic()
    result = suite.runpytest_subprocess(
        *cluster_args(
            suite.path, tmp_path / "shared", "-k", "ws2", "--perf-timeout", "10", "--perf-inject-faults"
        ),
        timeout=400,
    )
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["*ws2-fp32-strong*Slurm step * past its deadline of 40 s; srun interrupted*"]
    )
    assert time.monotonic() - started < 200


def test_an_allocation_past_its_time_limit_fails_the_case_running_on_it(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(FAULT_ENV, "hang,rank=1,phase=measure,step=1")
    result = suite.runpytest_subprocess(
        *cluster_args(
            suite.path,
            tmp_path / "shared",
            "-k",
            "ws2",
            "--perf-slurm-time",
            "1",
            "--perf-timeout",
            "400",
            "--perf-inject-faults",
        ),
        timeout=500,
    )
    result.assert_outcomes(failed=1, deselected=1)
    # Slurm ends the allocation at its limit (it checks about once a minute), and the step on it
    result.stdout.re_match_lines([r".*ws2-fp32-strong.*Slurm step \S+ on n1,n2 ended (TIMEOUT|CANCELLED).*"])


@pytest.mark.parametrize("skip", [False, True])
def test_a_partition_that_is_down_is_said_with_the_queue_reason_not_waited_out(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, skip: bool
) -> None:
    args = ["--perf-slurm-partition", "closed", "--perf-slurm-pending-timeout", "5"]
    result = suite.runpytest_subprocess(
        *cluster_args(
            suite.path, tmp_path / "shared", *args, *(["--perf-slurm-skip-pending", "-rs"] if skip else [])
        ),
        timeout=200,
    )
    if skip:
        result.assert_outcomes(skipped=2)
    else:
        result.assert_outcomes(failed=2)
    result.stdout.re_match_lines(
        [r".*Slurm allocation \d+ \(2 node\(s\), partition closed\) still pending after 5 s "
         r"\(reason: PartitionDown\); cancelled.*"]
    )  # fmt: skip


def test_ctrl_c_during_a_run_cancels_the_step_and_the_allocation(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str
) -> None:
    env = {**os.environ, FAULT_ENV: "hang,rank=0,phase=measure,step=1"}
    cmd = [sys.executable, "-m", "pytest",
           *cluster_args(suite.path, tmp_path / "shared", "-k", "ws2", "--perf-inject-faults")]  # fmt: skip
    # Ctrl-C as a terminal delivers it: SIGINT handled. A runner that starts the tests in the
    # background (`cmd &` in a script) hands them SIGINT ignored, and Python keeps it ignored: a
    # CI run so started found the session asleep in its step 120 s after the signal
    proc = subprocess.Popen(cmd, cwd=suite.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((tmp_path / "shared").glob("*/*/srun.log")) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(8)  # the step's ranks are up (and rank 0 hangs)
    assert queue(), "the allocation should be running"
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired as exc:
        # seen once in a full CI run (never alone): say where the session was, then end it, so
        # the next test does not meet its processes
        where = _process_tree(proc.pid)
        proc.kill()
        proc.communicate(timeout=30)
        pytest.fail(f"the session did not end within 120 s of Ctrl-C; its processes:\n{where}\n"
                    f"its output:\n{(exc.output or b'').decode(errors='replace')[-3000:]}")  # fmt: skip
    assert proc.returncode == 2, out.decode()[-2000:]  # pytest: interrupted
    assert b"KeyboardInterrupt" in out
    assert not queue()
    deadline = time.monotonic() + 30
    while tagged_pids(process_tag) and time.monotonic() < deadline:
        time.sleep(0.5)


def test_ab_on_a_cluster_alternates_both_sides_on_one_allocation(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str
) -> None:
    result = suite.runpytest_subprocess(
        *cluster_args(
            suite.path,
            tmp_path / "shared",
            "-k",
            "ws2",
            "--perf-ab-b",
            sys.executable,
            "--perf-ab-pairs",
            "3",
        ),
        timeout=500,
    )
    out = result.stdout.str()
    assert out.count("Slurm allocation ") == 1, out[-3000:]  # one allocation holds A and B
    assert "REGRESSED" not in out
    runs = sorted((tmp_path / "shared").glob("ab-*/*/srun.log"))
    # at least the 2 pairs an A/B case needs; more when undecided (the cap is 3)
    assert len(runs) >= 4 and {p.parent.name.split(".")[-1][0] for p in runs} == {"A", "B"}


def test_ab_sides_with_their_own_srun_arguments_are_probed_and_run_in_their_own_steps(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str
) -> None:
    """Two container images on one allocation: each side's srun arguments reach its steps only
    (here a CPU binding stands in for ``--container-image``, which the local Slurm lacks), and
    each side's Python is probed inside such a step, where a container's Python lives."""
    result = suite.runpytest_subprocess(
        *cluster_args(
            suite.path, tmp_path / "shared", "-k", "ws1", "--perf-ab-b", sys.executable, "--perf-ab-pairs", "2",
            # "=": the value starts with "--" (argparse would take it for an option)
            "--perf-ab-srun-args-a=--cpu-bind=verbose,map_cpu:0",
            "--perf-ab-srun-args-b=--cpu-bind=verbose,map_cpu:1",
        ),
        timeout=500,
    )  # fmt: skip
    out = result.stdout.str()
    assert out.count("Slurm allocation ") == 1, out[-3000:]
    result.stdout.re_match_lines(
        [r".*side A: \S+ probed in step .+ with --cpu-bind=verbose,map_cpu:0: torch .*",
         r".*side B: \S+ probed in step .+ with --cpu-bind=verbose,map_cpu:1: torch .*"],
    )  # fmt: skip
    logs = sorted((tmp_path / "shared").glob("ab-*/*/srun.log"))
    sides = {p: p.parent.name.split(".")[-1][0] for p in logs}
    assert len(logs) >= 4 and set(sides.values()) == {"A", "B"}
    for log, side in sides.items():
        text = log.read_text()
        # srun's verbose binding: CPU 0 (mask 0x1) for A's steps, CPU 1 (mask 0x2) for B's
        assert ("mask 0x1 set" if side == "A" else "mask 0x2 set") in text, (side, text[-800:])


def test_a_side_whose_python_is_not_in_its_steps_is_a_usage_error_with_the_steps_words(
    suite: pytest.Pytester, slurm_env: dict[str, str], tmp_path: Path, process_tag: str
) -> None:
    result = suite.runpytest_subprocess(
        *cluster_args(
            suite.path, tmp_path / "shared", "-k", "ws1", "--perf-ab-b", "/opt/image-b/bin/python",
            "--perf-ab-srun-args-b=--cpu-bind=map_cpu:1",
        ),
        timeout=300,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    result.stdout.re_match_lines(
        [r".*side B: the probe step .+ \(--cpu-bind=map_cpu:1 /opt/image-b/bin/python\).*"]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not queue()


def _process_tree(root: int) -> str:
    """Each process under ``root``: pid, state, what the kernel says it waits in, its command."""
    lines, todo = [], [root]
    while todo:
        pid = todo.pop()
        proc = Path(f"/proc/{pid}")
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (proc / "wchan").read_text() or "-"
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
            children = (proc / "task" / str(pid) / "children").read_text().split()
        except OSError:
            continue
        lines.append(f"{pid} {state} {wchan} {cmd}")
        todo += [int(c) for c in children]
    return "\n".join(lines)
