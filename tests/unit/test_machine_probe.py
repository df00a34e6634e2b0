"""The machine probe: a torch-free figure of this machine's speed, stored with every run and
shown beside the baseline runs'."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from scaleguard.evidence import baseline
from scaleguard.evidence.ledger import Ledger
from scaleguard.evidence.runs import RunRecord
from scaleguard.machine.probe import MachineSpeed, run_probe
from scaleguard.report.terminal import machine_line as _machine_line
from tests.conftest import tiny_spec
from tests.unit.test_session import result
from tests.unit.test_verdicts import case, run


def test_the_probe_measures_and_every_run_carries_it_into_the_baseline(tmp_path: Path) -> None:
    speed = run_probe()
    assert speed is not None and speed.score > 0 and speed.python_ops_per_s > 1e5
    ledger = Ledger("s")
    ledger.machine = speed.to_dict()
    spec = tiny_spec(world_size=1)
    record = ledger.add(spec, result(spec, 0.1))
    assert record.machine["score"] == round(speed.score, 4)
    back = RunRecord.from_dict(record.to_dict(), "run", "fix")
    assert back.machine == record.machine
    path = tmp_path / "cpu-k-1t.json"
    baseline.update(path, "cpu-k-1t", {}, [ledger.evidence(spec.case_id)])
    loaded = baseline.load(path)
    assert loaded is not None
    (entry,) = loaded.cases[spec.case_id].values()
    assert entry.runs[0].machine["score"] == round(speed.score, 4)


def test_the_header_says_how_this_machine_compares_with_the_baseline_runs(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    runs = [replace(run(0.1, index=i, seed=i), machine={"score": 0.5}) for i in range(3)]
    baseline.update(path, "k", {}, [case(runs, ws=1)])
    speed = MachineSpeed(python_ops_per_s=6e6, copy_gb_per_s=10 * 0.6**2 / 0.6)  # score 0.6
    line = _machine_line(speed, baseline.load(path))
    assert "median 0.500 over 3 runs (this machine +20%)" in line and line.startswith("machine probe 0.600")
    assert "carry no probe" in _machine_line(speed, None)
    assert "could not run" in _machine_line(None, None)


def test_a_probe_killed_mid_way_leaves_no_worker() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from scaleguard.machine.probe import _CHILD

    probe = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.DEVNULL)

    def workers() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(stat[1]) == probe.pid and stat[0] != "Z":
                    found.append(int(entry))
        return found

    deadline = time.monotonic() + 30
    while not workers() and time.monotonic() < deadline:
        time.sleep(0.02)
    seen = workers()
    assert seen, "the probe started no worker"
    probe.send_signal(signal.SIGKILL)  # what subprocess.run does to it on Ctrl-C
    probe.wait()
    # a worker's own life is >= 6 timed loops (~0.7 s here): gone well before that = killed
    deadline = time.monotonic() + 0.25
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}/stat") and
                                              open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
                                              for pid in seen):  # fmt: skip
        time.sleep(0.05)
    alive = [pid for pid in seen if os.path.exists(f"/proc/{pid}/stat")
             and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]  # fmt: skip
    assert not alive, alive


def test_the_per_core_sweep_is_kept_as_scalars_a_run_record_can_hold() -> None:
    """A run's ``machine`` record holds numbers only: a list there made the baseline's own
    write-back check refuse the file (seen on the H200: a whole recording lost)."""
    from scaleguard.machine.probe import MachineSpeed

    speed = MachineSpeed(15.4e6, 13.0, parallel_ops_per_s=2e8, cores=16,
                         core_ops_per_s=((0, 14.4e6), (5, 15.2e6), (15, 15.4e6)))  # fmt: skip
    data = speed.to_dict()
    assert all(isinstance(v, (int, float)) for v in data.values()), data
    assert data["slowest_core_ops_per_s"] == 14.4e6 and data["cores_swept"] == 3
