"""The torchrun path with gloo: one node with two ranks, and two local "nodes" on loopback."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]
CASE = "transformer_tiny-ddp-ws2-fp32-strong"
ENTRY = [
    "-m",
    "scaleguard.torchrun_entry",
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


def torchrun() -> list[str]:
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_record(out: Path) -> dict:
    record = json.loads((out / f"{CASE}.case.json").read_text())
    assert record["spec"]["world_size"] == 2 and len(record["step_s"]) == 5
    assert len(record["peak_mem_bytes"]) == 2  # both ranks folded in by rank 0
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
    endpoint = f"127.0.0.1:{free_port()}"
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
        for node in nodes:
            node.kill()
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
