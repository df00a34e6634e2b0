"""Issue 21: a slower machine alone never fails the main command, a real change on it still does.

The machine is made slower for a whole session without any foreign process: a CPU quota on the
session's cgroup (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``; root only, skipped
elsewhere). Every process of the session — pytest, the probe, the ranks — runs under it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scaleguard.ranks.faults import FAULT_ENV

pytestmark = pytest.mark.timeout(600)

SELECT = [
    "-k", "transformer_tiny and single and strong", "--perf-world-sizes", "1",
    "--perf-steps", "12", "--perf-warmup", "3", "--perf-no-history", "-p", "no:cacheprovider",
    # one thread: the case moves by the quota alone (2 intra-op threads both throttled wait on
    # each other and moved +337 % where the all-cores probe moved +304 %: too close to assert on)
    "--perf-threads-per-rank", "1",
]  # fmt: skip
SHARE = 0.25  # of every core: a machine four times slower, one core or many


def _cgroup() -> Iterator[Path]:
    """A fresh cgroup whose processes get SHARE of every core; skip where none can be made."""
    cores = len(os.sched_getaffinity(0))
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    group = None
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            group = v1 / f"scaleguard-{uuid.uuid4().hex[:8]}"
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(100000 * cores * SHARE)))
        elif "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
            group = v2 / f"scaleguard-{uuid.uuid4().hex[:8]}"
            group.mkdir()
            (group / "cpu.max").write_text(f"{int(100000 * cores * SHARE)} 100000")
        else:
            pytest.skip("no writable cgroup cpu controller (v1 cpu or v2 cpu.max)")
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup with a CPU quota here: {exc}")
    yield group
    for _ in range(50):  # the session's processes are gone; the kernel may lag a moment
        try:
            group.rmdir()
            return
        except OSError:
            import time

            time.sleep(0.1)


@pytest.fixture
def quota() -> Iterator[Path]:
    yield from _cgroup()


def _session(cwd: Path, baselines: Path, group: Path | None, fault: str | None, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "pytest", "perf/", *SELECT, f"--perf-baselines={baselines}", *extra]
    if fault:
        command.append("--perf-inject-faults")
    if group is not None:  # the session joins the cgroup before anything of it starts
        command = ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh", *command]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=550)
    return done.stdout + done.stderr


def test_a_cpu_quota_moves_the_case_without_failing_it_and_a_real_slowdown_still_fails(
    tmp_path: Path, quota: Path
) -> None:
    root = Path(__file__).parents[2]
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    recorded = _session(root, baselines, None, None, "--perf-update-baselines", "--perf-repeats", "3")
    assert "1 cases recorded" in recorded, recorded

    slower_machine = _session(root, baselines, quota, None)
    assert "1 passed" in slower_machine and "REGRESSED:" not in slower_machine, slower_machine
    moved = re.search(
        r"this machine runs the probe (\d+)% slower than the baseline's .*on all cores", slower_machine
    )
    assert moved and int(moved.group(1)) > 50, slower_machine  # 4x slower: far beyond the probe's noise
    assert "moved with the machine" in slower_machine or "with it (a host-bound step" in slower_machine

    # the same machine and the workload's compute 4x: 4x beyond anything the machine explains
    # (8x cost a slow CI VM a minute a run for nothing more). No confirm runs: the first run's
    # verdict is what this asserts (confirm runs are the session tests' subject)
    slowed = _session(root, baselines, quota, "slow,pct=300", "--perf-confirm", "0")
    assert "1 failed" in slowed, slowed
    assert re.search(
        r"transformer_tiny-single-ws1-fp32-strong REGRESSED: .*runs the probe \d+% slower", slowed
    ), slowed
