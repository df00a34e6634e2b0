"""``scaleguard bisect`` over fake builds: wrapper interpreters or wheels, the slow ones carrying a
real slowdown (every ``nn.Linear`` forward 30 ms longer: +150 % on this case, far beyond the 2-core VM's pair spread of up to 30 %, set up by their own sitecustomize)."""

from __future__ import annotations

import os
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
    for i, bad in enumerate([False, True]):
        wrapper = tmp_path / f"build{i}-python"
        env = f"PYTHONPATH={slow}${{PYTHONPATH:+:$PYTHONPATH}} " if bad else ""
        wrapper.write_text(f'#!/bin/sh\n{env}exec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        out.append(str(wrapper))
    return out


def bisect(suite: pytest.Pytester, *builds: str) -> subprocess.CompletedProcess[str]:
    """`scaleguard bisect BUILDS -- ...` over one small case, slowed builds far beyond noise."""
    return subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "bisect", *builds, "--", "test_train_step.py",
         "--perf-models", "transformer_tiny", "--perf-modes", "single", "--perf-scaling", "strong",
         "--perf-steps", "5", "--perf-warmup", "2", "--perf-no-load-check", "--perf-ab-pairs", "6", "--perf-threshold-step", "0.6"],
        cwd=suite.path, capture_output=True, text=True, timeout=840,
    )  # fmt: skip


def test_bisect_names_the_first_bad_build_probing_the_bad_end_first(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    # two interpreters, the second slowed: one real probe of the bad end, REGRESSED. The search's
    # order over many builds (log2 of them) and probes that read SAME or undecided are
    # tests/unit/test_bisect_search.py's, over scripted probes; the wheel test below probes twice
    done = bisect(suite, *builds(tmp_path))
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert f"first bad: {tmp_path / 'build1-python'}" in out, out
    assert f"last good: {tmp_path / 'build0-python'}" in out, out
    probes = [line for line in out.splitlines() if line.startswith("probe build")]
    assert [p.split()[2] for p in probes] == ["1"], probes  # the bad end, confirmed before anything
    assert "REGRESSED" in probes[0]
    assert "95% CI" in out  # each probe's ratio and interval


def test_bisect_bad_input_is_exit_2(suite: pytest.Pytester, tmp_path: Path) -> None:
    for args, needle in (([str(tmp_path / "nope")], "at least the good and the bad"),
                         ([sys.executable, str(tmp_path / "nope")], "does not exist")):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "scaleguard.cli", "bisect", *args],
                              cwd=suite.path, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2 and needle in done.stdout + done.stderr


def fake_wheel(directory: Path, version: str, slow: bool, tag: str = "py3-none-any") -> Path:
    """A wheel named torch that holds no torch package: the venv's ``import torch`` finds this
    environment's torch behind it; a slow one carries the slowdown as a ``.pth`` import."""
    import zipfile

    path = directory / f"torch-{version}-{tag}.whl"
    info = f"torch-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: scaleguard-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    if slow:
        files["_scaleguard_slow.py"] = SLOW
        files["_scaleguard_slow.pth"] = "import _scaleguard_slow\n"
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_bisect_over_a_wheel_directory_orders_by_version_and_installs_only_what_it_probes(
    suite: pytest.Pytester, tmp_path: Path, process_tag: str
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # by file name the release sorts first ('-' < '.'); by version it is the newest
    fake_wheel(wheels, "2.15.0", slow=True)
    fake_wheel(wheels, "2.15.0.dev20261101", slow=False)
    fake_wheel(wheels, "2.15.0.dev20261102", slow=True)
    fake_wheel(wheels, "2.15.0.dev20261103", slow=True)
    fake_wheel(wheels, "2.15.0.dev20261104", slow=True, tag="cp27-cp27m-win32")  # not for here: skipped
    (wheels / "torchvision-0.30.0-py3-none-any.whl").write_bytes(b"")  # not torch: ignored
    done = bisect(suite, "--wheels", str(wheels))
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert f"first bad: {wheels / 'torch-2.15.0.dev20261102-py3-none-any.whl'}" in out, out
    probes = [line for line in out.splitlines() if line.startswith("probe build")]
    # builds: 0 dev1101, 1 dev1102, 2 dev1103, 3 the release; the bad end first, then halves
    assert [p.split()[2] for p in probes] == ["3", "1"], probes
    installed = [line for line in out.splitlines() if " installed into " in line]
    assert [line.split()[2] for line in installed] == [
        "torch-2.15.0.dev20261101-py3-none-any.whl",
        "torch-2.15.0-py3-none-any.whl",
        "torch-2.15.0.dev20261102-py3-none-any.whl",
    ], installed  # build 2 (dev1103) is never needed, never installed
    # a probe takes minutes: its pairs are reported as they are decided
    assert any(line.startswith("  scaleguard: transformer_tiny-single") and " pairs: " in line
               for line in out.splitlines()), out  # fmt: skip


def test_bisect_wheel_directory_bad_input_is_exit_2(suite: pytest.Pytester, tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    fake_wheel(one, "2.15.0", slow=False)
    twice = tmp_path / "twice"
    twice.mkdir()
    fake_wheel(twice, "2.15.0", slow=False)
    fake_wheel(twice, "2.15.0", slow=False, tag="py311-none-any")
    broken = tmp_path / "broken"
    broken.mkdir()
    fake_wheel(broken, "2.14.0", slow=False)
    (broken / "torch-2.15.0-py3-none-any.whl").write_bytes(b"not a zip file")
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    fake_wheel(hostile, "2.14.0", slow=False)
    os.mkfifo(hostile / "torch-2.15.0-py3-none-any.whl")  # a reader that opens it waits forever
    devzero = tmp_path / "devzero"
    devzero.mkdir()
    fake_wheel(devzero, "2.14.0", slow=False)
    (devzero / "torch-2.15.0-py3-none-any.whl").symlink_to("/dev/zero")
    for directory, needle in (
        (hostile, "is not a regular file"),
        (devzero, "is not a regular file"),
        (tmp_path / "nope", "is not a directory"),
        (one, "1 torch wheel(s) for this interpreter"),
        (twice, "are both torch 2.15.0"),
        (broken, "torch-2.15.0-py3-none-any.whl: could not be installed"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "scaleguard.cli", "bisect", "--wheels", str(directory), "--", "test_train_step.py"],
            cwd=suite.path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2 and needle in done.stdout + done.stderr, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr


HANGING_PROBE = """
import signal
import time


def test_hangs():
    if {ignore_interrupt}:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(600)
"""


@pytest.mark.parametrize("ignore_interrupt", [False, True], ids=["interruptible", "ignores-sigint"])
def test_a_probe_that_never_answers_is_stopped_at_its_deadline(
    suite: pytest.Pytester,
    tmp_path: Path,
    process_tag: str,
    monkeypatch: pytest.MonkeyPatch,
    ignore_interrupt: bool,
) -> None:
    import time

    from scaleguard.schedule import bisect as bisect_module

    monkeypatch.setattr(bisect_module, "INTERRUPT_GRACE_S", 5.0)
    monkeypatch.chdir(suite.path)
    hang = suite.path / "test_hang.py"
    hang.write_text(HANGING_PROBE.format(ignore_interrupt=ignore_interrupt))
    started = time.monotonic()
    probe = bisect_module.probe_build(
        sys.executable, sys.executable, [str(hang)], 0, tmp_path, timeout_s=30.0
    )
    took = time.monotonic() - started
    assert probe.status == "FAILED" and "no answer within 30 s (--probe-timeout)" in probe.stories[0]
    assert took < 30.0 + 5.0 + 60.0, took  # the deadline, the grace, and the child's own exit
    # process_tag: nothing the probe started is left


def test_probe_timeout_must_be_a_positive_number(suite: pytest.Pytester) -> None:
    for value in ("0", "-3", "soon", "nan"):
        done = subprocess.run(
            [sys.executable, "-m", "scaleguard.cli", "bisect", "--probe-timeout", value, "a", "b"],
            cwd=suite.path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "--probe-timeout takes seconds" in done.stderr, (value, done.stderr)
    # one parser: the options in any order, before or after the builds
    done = subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", "bisect", "--wheels", str(suite.path), "--probe-timeout", "0",
         "--", "-k", "x"],
        cwd=suite.path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--probe-timeout takes seconds" in done.stderr, done.stderr
