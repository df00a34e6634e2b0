"""A real Slurm for the cluster tests: the project's own script starts munge, slurmctld and two
slurmd (nodes n1, n2) on this host. Without slurm-wlm the tests skip, unless
SCALEGUARD_REQUIRE_SLURM=1 (as ``.ci/run`` sets it) makes that a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugin.conftest import suite  # noqa: F401 - the pytester dir with the suite's test file

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "local_slurm.sh"
STATE_DIR = "/tmp/scaleguard-slurm-tests"


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[dict[str, str]]:
    """SLURM_CONF of a running two-node cluster; stopped after the session."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        if os.environ.get("SCALEGUARD_REQUIRE_SLURM") == "1":
            pytest.fail("SCALEGUARD_REQUIRE_SLURM=1 but slurm-wlm/munge are not installed")
        pytest.skip("slurm-wlm and munge are not installed (apt-get install -y slurm-wlm munge)")
    env = {**os.environ, "SCALEGUARD_SLURM_DIR": STATE_DIR}
    done = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    conf = {"SLURM_CONF": f"{STATE_DIR}/slurm.conf"}
    yield conf
    subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def slurm_env(local_slurm: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """SLURM_CONF for this test and its subprocesses; after it, nothing of ours in squeue."""
    for key, value in local_slurm.items():
        monkeypatch.setenv(key, value)
    yield local_slurm
    assert_queue_empty()


def queue() -> list[str]:
    done = subprocess.run(["squeue", "-h", "-o", "%i %j %T %r"], capture_output=True, text=True, timeout=30)
    return [line for line in done.stdout.splitlines() if "scaleguard" in line]


def assert_queue_empty(deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while queue() and time.monotonic() < end:
        time.sleep(0.5)
    left = queue()
    if left:
        subprocess.run(["scancel", "--name", left[0].split()[1]], timeout=30, check=False)
    assert not left, f"left in squeue: {left}"
