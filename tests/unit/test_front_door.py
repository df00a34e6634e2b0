"""A torch-free front door (issue 28, item 3): pytest imports every plugin at start, `--help`
included, and the CLI's `compare`, `history` and `export` never train anything; neither may
pay torch's import (1.2-1.4 s on the 2-core VM, measured with -X importtime)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    ["scaleguard.plugin", "scaleguard.config", "scaleguard.case", "scaleguard.evidence.runs", "scaleguard.cli",
     "scaleguard.history.database", "scaleguard.history.changepoints", "scaleguard.history.export", "scaleguard.report.terminal"],
)  # fmt: skip
def test_importing_the_front_door_does_not_import_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


def test_compare_help_and_pytest_help_run_without_torch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    probe = "import sys, runpy; sys.argv = {argv!r}; \ntry:\n    runpy.run_module({mod!r}, run_name='__main__')\nexcept SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    for mod, argv in (
        ("scaleguard.cli", ["scaleguard", "compare", "--help"]),
        ("pytest", ["pytest", "--help"]),
    ):
        done = subprocess.run([sys.executable, "-c", probe.format(argv=argv, mod=mod)], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.stdout.strip().splitlines()[-1] == "NO-TORCH", (
            mod,
            done.stdout[-500:],
            done.stderr[-500:],
        )
