"""Foreign-load accounting on a fake /proc: who used the CPU besides this session's processes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from scaleguard.machine import foreign_load
from scaleguard.machine.foreign_load import account, read_proc

TICKS = foreign_load._TICKS
OWN = 100  # the pytest process


def fake_proc(root: Path, busy: int, steal: int, procs: dict[int, tuple[str, int, int]]) -> Path:
    """``procs``: pid -> (name, ppid, cpu ticks)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 999999 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")
    (root / "loadavg").write_text("1.50 1.00 0.50 2/300 12345\n")
    for pid, (name, ppid, ticks) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        utime, stime = ticks - ticks // 4, ticks // 4
        (root / str(pid) / "stat").write_text(
            f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 0\n"
        )
    return root


def sample(root: Path, at: float) -> foreign_load.ProcSample:
    taken = read_proc(root)
    assert taken is not None
    return replace(taken, unix_time=at)


def two(tmp_path: Path, before: dict, after: dict, busy: tuple[int, int], steal: tuple[int, int] = (0, 0)):
    a = sample(fake_proc(tmp_path / "a", busy[0], steal[0], before), 1000.0)
    b = sample(fake_proc(tmp_path / "b", busy[1], steal[1], after), 1002.0)
    return [a, b]


def test_a_foreign_process_is_named_with_its_cores(tmp_path: Path) -> None:
    # two seconds: our rank (child of pytest) used 2 cores, "pip" 0.9 cores
    before = {OWN: ("python", 1, 10), 101: ("python", OWN, 0), 555: ("pip", 1, 0)}
    after = {OWN: ("python", 1, 10), 101: ("python", OWN, 4 * TICKS), 555: ("pip", 1, int(1.8 * TICKS))}
    report = account(two(tmp_path, before, after, (0, int(5.8 * TICKS))), OWN, (1000.5, 1001.5))
    assert report is not None
    assert abs(report.foreign_cores - 0.9) < 0.02 and report.top[0][:2] == (555, "pip")
    why = report.disturbed(0.25)
    assert why is not None and "another process used 0.90 cores" in why and "pid 555 pip" in why
    assert report.loadavg_1m == 1.5


def test_a_quiet_machine_is_not_disturbed(tmp_path: Path) -> None:
    before = {OWN: ("python", 1, 10), 101: ("python", OWN, 0), 7: ("sshd", 1, 0)}
    after = {OWN: ("python", 1, 12), 101: ("python", OWN, 4 * TICKS), 7: ("sshd", 1, 3)}
    report = account(two(tmp_path, before, after, (0, 4 * TICKS + 5)), OWN, (1000.0, 1002.0))
    assert report is not None and report.foreign_cores < 0.05 and report.disturbed(0.25) is None


def test_grandchildren_loader_workers_count_as_ours(tmp_path: Path) -> None:
    before = {OWN: ("python", 1, 0), 101: ("python", OWN, 0), 202: ("pt_data_worker", 101, 0)}
    after = {OWN: ("python", 1, 0), 101: ("python", OWN, 2 * TICKS), 202: ("pt_data_worker", 101, 2 * TICKS)}
    report = account(two(tmp_path, before, after, (0, 4 * TICKS)), OWN, (1000.0, 1002.0))
    assert report is not None and report.foreign_cores < 0.01


def test_a_rank_that_ended_inside_the_interval_is_not_counted_as_foreign(tmp_path: Path) -> None:
    before = {OWN: ("python", 1, 0), 101: ("python", OWN, 0), 555: ("hog", 1, 0)}
    after = {OWN: ("python", 1, 0), 555: ("hog", 1, TICKS)}  # rank 101 exited: its ticks are gone
    report = account(two(tmp_path, before, after, (0, 4 * TICKS)), OWN, (1000.0, 1002.0))
    assert report is not None and abs(report.foreign_cores - 0.5) < 0.02  # the hog alone


def test_steal_time_and_odd_process_names(tmp_path: Path) -> None:
    before = {OWN: ("python", 1, 0), 9: ("my (weird) proc", 1, 0)}
    after = {OWN: ("python", 1, 0), 9: ("my (weird) proc", 1, 1)}
    report = account(two(tmp_path, before, after, (0, 1), steal=(0, 2 * TICKS)), OWN, (1000.0, 1002.0))
    assert report is not None and abs(report.steal_cores - 1.0) < 0.01
    assert report.disturbed(0.25) is not None and "steal" in (report.disturbed(0.25) or "")
    assert report.top[0][1] == "my (weird) proc"


def test_other_processes_on_the_gpu_disturb_the_run(tmp_path: Path) -> None:
    monitor = foreign_load.LoadMonitor(own_root=OWN, period_s=0.0, root=fake_proc(tmp_path / "p", 0, 0, {
        OWN: ("python", 1, 0), 101: ("python", OWN, 0), 777: ("other-train", 1, 0)}))  # fmt: skip
    monitor.tick()
    monitor.samples[0] = replace(monitor.samples[0], unix_time=0.0)
    report = monitor.report((0.0, 1e12), gpu_pids=[101, 777])
    assert report is not None and report.gpu_processes == ((777, "other-train"),)
    assert "used the case's GPU" in (report.disturbed(0.25) or "")


def test_a_rank_gone_by_report_time_is_still_ours_and_unseen_pids_are_left_out(tmp_path: Path) -> None:
    root = tmp_path / "p"
    fake_proc(root, 0, 0, {OWN: ("python", 1, 0), 101: ("python", OWN, 0)})
    monitor = foreign_load.LoadMonitor(own_root=OWN, period_s=0.0, root=root)
    monitor.tick()  # the rank is alive and on the GPU
    monitor.samples[0] = replace(monitor.samples[0], unix_time=0.0)
    import shutil

    shutil.rmtree(root / "101")  # the rank exited before the report
    report = monitor.report((0.0, 1e12), gpu_pids=[101, 4242])  # 4242: another namespace
    assert report is not None and report.gpu_processes == ()
