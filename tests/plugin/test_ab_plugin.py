"""``scaleguard ab`` as users run it: a real pytest session in A/B mode over the suite's file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaleguard.ranks.faults import FAULT_ENV

pytestmark = pytest.mark.timeout(500)


def test_scaleguard_ab_cli_gates_and_saves_both_sides(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    out = tmp_path / "ab"
    args = ["--perf-models", "transformer_tiny", "--perf-modes", "single", "--perf-scaling", "strong",
            "--perf-steps", "6", "--perf-warmup", "2", "--perf-no-load-check"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "ab", "--a", sys.executable, "--b", sys.executable,
         "--b-env", f"{FAULT_ENV}=slow,pct=100", "--pairs", "6", "--markdown", str(out / "ab.md"),
         "--plot", str(out / "ab.png"), "--save-dir", str(out), "test_train_step.py", *args,
         "--perf-inject-faults"],
        cwd=suite.path, capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "scaleguard A/B" in done.stdout and "REGRESSED" in done.stdout
    md = (out / "ab.md").read_text()
    assert "| transformer_tiny-single-ws1-fp32-strong |" in md and "REGRESSED" in md
    assert (out / "ab.png").read_bytes()[:4] == b"\x89PNG"
    for side in ("A", "B"):
        saved = json.loads((out / f"{side}.json").read_text())
        assert saved["benchmarks"][0]["extra_info"]["runs"]
    compared = subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "compare", str(out / "A.json"), str(out / "B.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert compared.returncode in (0, 1), compared.stderr  # read as saved runs, no crash
    bench = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", str(out / "A.json"), str(out / "B.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "ab", "--a", sys.executable, "--b", "/usr/bin/python3.11"],
        cwd=suite.path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "has no torch" in bad.stderr
