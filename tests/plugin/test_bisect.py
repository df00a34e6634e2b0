"""``scaleguard bisect`` over fake builds: wrapper interpreters, the last two of which carry a
real slowdown (every ``nn.Linear`` forward 30 ms longer: +150 % on this case, far beyond the 2-core VM's pair spread of up to 30 %, set up by their own sitecustomize)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]

SLOW = """
import time
import torch

_forward = torch.nn.Linear.forward


def _slow(self, x):
    end = time.perf_counter() + 0.030
    while time.perf_counter() < end:
        pass
    return _forward(self, x)


torch.nn.Linear.forward = _slow
"""


def builds(tmp_path: Path) -> list[str]:
    slow = tmp_path / "slowsite"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW)
    out = []
    for i, bad in enumerate([False, False, True, True]):
        wrapper = tmp_path / f"build{i}-python"
        env = f"PYTHONPATH={slow}${{PYTHONPATH:+:$PYTHONPATH}} " if bad else ""
        wrapper.write_text(f'#!/bin/sh\n{env}exec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        out.append(str(wrapper))
    return out


def test_bisect_names_the_first_bad_build_in_log2_probes(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "bisect", *builds(tmp_path), "--", "test_train_step.py",
         "--perf-models", "transformer_tiny", "--perf-modes", "single", "--perf-scaling", "strong",
         "--perf-steps", "10", "--perf-warmup", "3", "--perf-no-load-check", "--perf-ab-pairs", "6", "--perf-threshold-step", "0.6"],
        cwd=suite.path, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert f"first bad: {tmp_path / 'build2-python'}" in out, out
    probes = [line for line in out.splitlines() if line.startswith("probe build")]
    assert [p.split()[2] for p in probes] == ["3", "1", "2"], probes  # the bad end first, then halves
    assert "REGRESSED" in probes[0] and "SAME" in probes[1] and "REGRESSED" in probes[2]
    assert "95% CI" in out  # each probe's ratio and interval


def test_bisect_bad_input_is_exit_2(suite: pytest.Pytester, tmp_path: Path) -> None:
    for args, needle in (([str(tmp_path / "nope")], "at least the good and the bad"),
                         ([sys.executable, str(tmp_path / "nope")], "does not exist")):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "scaleguard.cli", "bisect", *args],
                              cwd=suite.path, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2 and needle in done.stdout + done.stderr
