"""Rank pools with real gloo ranks: reuse without shared evidence, and every fault still
ends in a named rank, a fresh pool for the next case and no process left behind."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scaleguard.case import CaseSpec
from scaleguard.evidence.records import RankResult
from scaleguard.ranks.faults import FAULT_ENV
from scaleguard.ranks.launcher import Pools, run_case
from scaleguard.ranks.protocol import CaseFailedError
from tests.conftest import tagged_pids, tiny_spec

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


@pytest.fixture
def pools(tmp_path: Path, process_tag: str) -> Iterator[Pools]:
    """Closed before ``process_tag`` checks that nothing is left (it is set up first)."""
    made = Pools(tmp_path / "pools")
    yield made
    made.close()


def _cases() -> list[CaseSpec]:
    """Four different ws2 cases (ids differ), seconds each on one thread per rank."""
    return [
        tiny_spec(mode=mode, world_size=2, steps=3, scaling=scaling)
        for mode in ("ddp", "fsdp")
        for scaling in ("strong", "weak")
    ]


def _pids(ranks: list[RankResult]) -> set[int]:
    return {r.pid for r in ranks}


def test_consecutive_cases_share_ranks_but_two_runs_of_one_case_never_do(
    tmp_path: Path, pools: Pools, process_tag: str
) -> None:
    a, b = _cases()[:2]
    first = pools.run(a, tmp_path / "a1", 120)
    second = pools.run(b, tmp_path / "b1", 120)
    assert _pids(second) == _pids(first) and len(_pids(first)) == 2  # reused: no start-up paid
    assert {r.process_runs_before for r in first} == {0} and {r.process_runs_before for r in second} == {1}
    again = pools.run(a, tmp_path / "a2", 120)  # a repeat of a: independent evidence
    assert not _pids(again) & _pids(first)
    assert {r.process_runs_before for r in again} == {0}
    pools.close()
    assert not tagged_pids(process_tag)


def test_a_case_in_a_reused_process_gets_its_own_settings_and_state(
    tmp_path: Path, pools: Pools, process_tag: str
) -> None:
    """Settings, seeds and RNG state are the case's own whatever the previous case left."""
    first, case = _cases()[0], _cases()[1]
    first = dataclasses.replace(
        first, settings=dataclasses.replace(first.settings, cudnn_benchmark=True, allow_tf32=True, seed=1)
    )
    case = dataclasses.replace(
        case, settings=dataclasses.replace(case.settings, cudnn_benchmark=False, allow_tf32=False, seed=7)
    )
    pools.run(first, tmp_path / "first", 120)
    reused = pools.run(case, tmp_path / "reused", 120)
    assert {r.process_runs_before for r in reused} == {1}
    for rank in reused:
        assert rank.settings["cudnn_benchmark"] is False and rank.settings["allow_tf32"] is False
        assert rank.settings["seed"] == 7 and rank.settings["threads_per_rank"] == 1
    fresh = run_case(case, tmp_path / "fresh", 120)
    assert {r.process_runs_before for r in fresh} == {0}
    # same seed, same data: the same training, bit for bit, as in fresh processes
    for r, f in zip(sorted(reused, key=lambda r: r.rank), sorted(fresh, key=lambda r: r.rank), strict=True):
        assert math.isclose(r.final_loss, f.final_loss, rel_tol=1e-6), (r.final_loss, f.final_loss)


def test_a_rank_killed_in_the_pools_third_case_fails_that_case_only(
    tmp_path: Path, pools: Pools, monkeypatch: pytest.MonkeyPatch, process_tag: str
) -> None:
    a, b, c, d = _cases()
    before = pools.run(a, tmp_path / "a", 120)
    assert _pids(pools.run(b, tmp_path / "b", 120)) == _pids(before)
    monkeypatch.setenv(FAULT_ENV, "sigkill,rank=1,phase=measure,step=1")
    with pytest.raises(CaseFailedError) as info:
        pools.run(c, tmp_path / "c", 120)
    assert info.value.case_id == c.case_id and info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert not tagged_pids(process_tag)  # the whole pool was reaped with the failed case
    monkeypatch.delenv(FAULT_ENV)
    after = pools.run(d, tmp_path / "d", 120)
    assert not _pids(after) & _pids(before) and {r.process_runs_before for r in after} == {0}


def test_a_hang_in_a_pool_is_killed_at_the_deadline(
    tmp_path: Path, pools: Pools, monkeypatch: pytest.MonkeyPatch, process_tag: str
) -> None:
    a, b = _cases()[:2]
    pools.run(a, tmp_path / "a", 120)
    monkeypatch.setenv(FAULT_ENV, "hang,rank=0,phase=measure,step=1")
    start = time.monotonic()
    with pytest.raises(CaseFailedError) as info:
        pools.run(b, tmp_path / "b", 20)
    assert "--perf-timeout=20s" in str(info.value) and 20 <= time.monotonic() - start < 60
    assert not tagged_pids(process_tag)


def test_ctrl_c_during_a_pooled_case_reaps_the_pool(tmp_path: Path, pools: Pools, process_tag: str) -> None:
    a, b = _cases()[:2]
    pools.run(a, tmp_path / "a", 120)

    def interrupt() -> None:  # the first tick comes within a second, long before b is done
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pools.run(b, tmp_path / "b", 120, on_tick=interrupt)
    assert not tagged_pids(process_tag)


def test_isolate_gives_every_run_fresh_processes(tmp_path: Path, process_tag: str) -> None:
    isolated = Pools(tmp_path / "pools", isolate=True)
    a, b = _cases()[:2]
    first = isolated.run(a, tmp_path / "a", 120)
    second = isolated.run(b, tmp_path / "b", 120)
    assert not _pids(first) & _pids(second)
    assert not tagged_pids(process_tag)


def test_a_pool_left_open_does_not_hang_the_exit_and_leaves_no_process(
    tmp_path: Path, process_tag: str
) -> None:
    # an interrupt in the wrong place could skip every close(): multiprocessing would then join
    # the idle ranks at interpreter exit, forever (they wait for their next job). The launcher
    # reaps what it started first.
    script = tmp_path / "left_open.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        "from scaleguard.ranks.launcher import Pools\n"
        "from tests.conftest import tiny_spec\n"
        "if __name__ == '__main__':  # spawned ranks import this file again\n"
        "    pools = Pools(Path(sys.argv[1]))\n"
        "    pools.run(tiny_spec(world_size=2, steps=3), Path(sys.argv[1]) / 'run', 120)\n"
        "    print('served, exiting with the pool open', flush=True)\n"
    )
    root = Path(__file__).parents[2]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "pools")],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served, exiting with the pool open" in done.stdout
    assert time.monotonic() - started < 170
    assert not tagged_pids(process_tag)
