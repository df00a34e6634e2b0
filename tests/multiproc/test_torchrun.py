"""The torchrun path with gloo: one node with two ranks, and two local "nodes" on loopback."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
CASE = "transformer_tiny-ddp-ws2-fp32-strong"
ENTRY = [
    "-m",
    "scaleguard.schedule.torchrun_entry",
    "--case",
    CASE,
    "--device",
    "cpu",
    "--steps",
    "5",
    "--warmup",
    "2",
    "--threads-per-rank",
    "1",
]


STORE_SERVER = """
import sys, time, datetime
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=300))
time.sleep(300)  # killed by the test when the nodes are done
"""


def wait_listening(port: int, proc: subprocess.Popen[bytes], deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the rendezvous store did not listen on {port} within {deadline_s} s")


def torchrun() -> list[str]:
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_record(out: Path) -> dict:
    record = json.loads((out / f"{CASE}.case.json").read_text())
    # at least the 5 steps asked for: adaptive sampling adds steps until the median is pinned
    assert record["spec"]["world_size"] == 2 and len(record["run"]["step_s"]) >= 5
    assert record["run"]["session"] and json.loads((out / f"{CASE}.run.json").read_text())["state"] == "done"
    assert len(record["run"]["rank_peak_mem_bytes"]) == 2  # both ranks folded in by rank 0
    return record


def test_single_node_two_ranks(tmp_path: Path, process_tag: str) -> None:
    done = subprocess.run(
        [
            *torchrun(),
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            *ENTRY,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check_record(tmp_path)


def test_two_local_nodes_with_c10d_rendezvous_then_ingest(
    tmp_path: Path, process_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the rendezvous store lives in its own process, as on a cluster's head service: when the
    # store lives inside node 0's agent and node 0 finishes first, node 1's agent loses the store
    # while it is still watching it and exits non-zero after the work is done (seen here)
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    store = subprocess.Popen([sys.executable, "-c", STORE_SERVER, str(port)])
    wait_listening(port, store)
    nodes = [
        subprocess.Popen(
            [
                *torchrun(),
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(i),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                "sg-test",
                *ENTRY,
                "--out",
                str(tmp_path / f"node{i}"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for proc in [*nodes, store]:
            proc.kill()
            proc.wait(timeout=30)
    assert all(node.returncode == 0 for node in nodes), "\n".join(o[-2000:] for o in outputs)
    record_dir = next(
        d for d in (tmp_path / "node0", tmp_path / "node1") if (d / f"{CASE}.case.json").exists()
    )
    check_record(record_dir)
    baselines = tmp_path / "baselines"
    files = [str(record_dir / f"{CASE}.case.json")]
    # five steps on a busy 2-core box are too few to pin a median to the CPU default threshold
    lenient = ["--threshold-step", "0.9"]
    assert cli_main(["ingest", *files, "--baselines", str(baselines), "--update-baselines", *lenient]) == 0
    out = capsys.readouterr().out
    assert f"{CASE} NEW" in out and "1 cases recorded" in out
    (written,) = baselines.glob("cpu-*-1t.json")
    assert CASE in json.loads(written.read_text())["cases"]
    assert cli_main(["ingest", *files, "--baselines", str(baselines), *lenient]) == 0  # identical: OK
    assert f"{CASE} NEW" not in capsys.readouterr().out
