"""Issue 19: a team's own workload, from a package outside the repository, through the suite
(ddp and fsdp at ws1/ws2 with gloo), ``scaleguard ab`` and torchrun + ingest; bad workloads are
usage errors at collection; a workload that breaks inside a rank fails its case by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main

pytestmark = [pytest.mark.dist, pytest.mark.timeout(500)]
EXAMPLE = Path(__file__).parents[2] / "examples" / "custom_workload" / "tinymlp.py"
FAST = ["--perf-scaling", "strong", "--perf-steps", "4", "--perf-warmup", "2", "--perf-no-load-check",
        "-p", "no:cacheprovider"]  # fmt: skip


@pytest.fixture
def user_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example copied into a package outside the repository, importable by PYTHONPATH only."""
    pkg = tmp_path / "teamcode" / "teamperf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(EXAMPLE, pkg / "workloads.py")
    (pkg / "broken.py").write_text(
        "import torch\nfrom teamperf.workloads import TinyMLP\n"
        "class Wrong(TinyMLP):\n    name = 'wrongshape'\n"
        "    def synthetic_batch(self, batch, generator):\n"
        "        return torch.randn(batch, 7, generator=generator), torch.zeros(batch, dtype=torch.long)\n"
        "class Boom(TinyMLP):\n    name = 'boom'\n    def build(self):\n        raise RuntimeError('no weights file')\n"
        "class BadBatch(TinyMLP):\n    name = 'badbatch'\n    strong_global_batch = 0\n"
        "NOT_A_WORKLOAD = 3\n"
        "class Clash(TinyMLP):\n    name = 'resnet50'\n"
    )
    monkeypatch.setenv(
        "PYTHONPATH", str(tmp_path / "teamcode") + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    return pkg


def test_a_users_workload_runs_in_ddp_and_fsdp_at_ws1_and_ws2(
    suite: pytest.Pytester, user_pkg: Path, tmp_path: Path, process_tag: str
) -> None:
    storage = tmp_path / "bench"
    result = suite.runpytest_subprocess(
        *FAST, "--perf-workloads", "teamperf.workloads:TinyMLP", "--perf-modes", "ddp,fsdp",
        "--perf-update-baselines", "--benchmark-save=mine", f"--benchmark-storage=file://{storage}",
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert "tinymlp-fsdp-ws2-fp32-strong" in out and "GFLOPS/process (FlopCounterMode)" in out
    (saved,) = storage.glob("*/*_mine.json")
    infos = [b["extra_info"] for b in json.loads(saved.read_text())["benchmarks"]]
    assert {i["case_id"] for i in infos} == {
        f"tinymlp-{m}-ws{w}-fp32-strong" for m in ("ddp", "fsdp") for w in (1, 2)
    }
    assert all(
        i["workload"] == "teamperf.workloads:TinyMLP" and i["throughput"]["flops_per_step"] > 0 for i in infos
    )
    assert all(i["throughput"]["mfu"] is None for i in infos)  # CPU: the peak is unknown, never guessed
    (baseline,) = (suite.path / "baselines").glob("*.json")
    assert "tinymlp-ddp-ws2-fp32-strong" in json.loads(baseline.read_text())["cases"]


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("teamperf.nosuchmodule:X", "does not import"),
        ("teamperf.workloads:Missing", "has no attribute 'Missing'"),
        ("teamperf.broken:NOT_A_WORKLOAD", "is a int, not a scaleguard.workload.Workload"),
        ("teamperf.broken:BadBatch", "strong_global_batch must be a positive integer"),
        ("teamperf.broken:Clash", "name 'resnet50' is already taken"),
        ("not a path", "expected package.module:attribute"),
    ],
)
def test_a_bad_workload_is_a_usage_error_at_collection(
    suite: pytest.Pytester, user_pkg: Path, path: str, needle: str
) -> None:
    result = suite.runpytest_subprocess(
        "--collect-only", "-q", "-p", "no:cacheprovider", "--perf-workloads", path
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    err = result.stderr.str()
    assert needle in err and "Traceback" not in err, err


@pytest.mark.parametrize(("path", "needle"), [("teamperf.broken:Boom", "no weights file"),
                                              ("teamperf.broken:Wrong", "expected input with shape")])  # fmt: skip
def test_a_workload_that_breaks_in_a_rank_fails_its_case_by_name(
    suite: pytest.Pytester, user_pkg: Path, process_tag: str, path: str, needle: str
) -> None:
    result = suite.runpytest_subprocess(
        *FAST, "--perf-workloads", path, "--perf-modes", "ddp", "--perf-world-sizes", "2"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "-ddp-ws2-fp32-strong: rank" in out and "build model and batches" in out and needle in out, out


def test_a_users_workload_through_scaleguard_ab(
    suite: pytest.Pytester, user_pkg: Path, process_tag: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "ab", "--a", sys.executable, "--b", sys.executable, "--pairs", "2",
         "test_train_step.py", *FAST, "--perf-workloads", "teamperf.workloads:TinyMLP", "--perf-modes", "single"],
        cwd=suite.path, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-2000:]
    assert "tinymlp-single-ws1-fp32-strong" in done.stdout and "scaleguard A/B" in done.stdout


def test_a_users_workload_through_torchrun_and_ingest(
    user_pkg: Path, tmp_path: Path, process_tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exe = shutil.which("torchrun")
    runner = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    case = "tinymlp-ddp-ws2-fp32-strong"
    done = subprocess.run(
        [*runner, "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "-m", "scaleguard.schedule.torchrun_entry",
         "--case", case, "--device", "cpu", "--steps", "4", "--warmup", "2", "--threads-per-rank", "1",
         "--workloads", "teamperf.workloads:TinyMLP", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = tmp_path / "out" / f"{case}.case.json"
    assert json.loads(record.read_text())["spec"]["workload"] == "teamperf.workloads:TinyMLP"
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines"]) == 0
    assert "1 cases recorded" in capsys.readouterr().out
