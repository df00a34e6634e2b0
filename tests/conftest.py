"""Shared helpers for the harness's own tests."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy.fft  # noqa: F401  (see below)
import pytest
import scipy.stats  # noqa: F401

from scaleguard.case import CaseSpec, RunSettings

# numpy's extension modules (numpy.fft, through scipy.stats) are imported here, before any
# test: pytester's in-process runs drop the modules first imported inside them, and numpy
# refuses a second import in one process ("cannot load module more than once per process"),
# which failed tests/unit/test_config.py run after tests/plugin/test_plugin.py

TAG_ENV = "SCALEGUARD_TEST_TAG"


def tiny_spec(
    mode: str = "ddp",
    world_size: int = 2,
    steps: int = 4,
    model: str = "transformer_tiny",
    scaling: str = "strong",
    inputs: str = "synthetic",
) -> CaseSpec:
    """A case that runs in seconds on one CPU thread per rank."""
    return CaseSpec(
        model=model,
        mode=mode,
        world_size=world_size,
        precision="fp32",  # type: ignore[arg-type]
        scaling=scaling,
        inputs=inputs,
        device="cpu",
        profile="smoke",  # type: ignore[arg-type]
        global_batch=8 if scaling == "strong" else 4 * world_size,
        settings=RunSettings(
            steps=steps,
            warmup_min=2,
            warmup_max=4,
            warmup_tolerance=0.5,
            threads_per_rank=1,
            loader_workers=0,
        ),
    )


def tagged_pids(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``SCALEGUARD_TEST_TAG=tag``:
    spawned ranks inherit it, so this finds every descendant even in its own process group."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # multiprocessing's resource tracker serves the test process itself and ends with it
        if state != "Z" and b"resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def process_tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Tag this test's child processes; after the test, assert none of them is left."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, tag)
    yield tag
    left = lingering(tag)
    assert not left, f"processes left behind: {left}"


# a process that was killed, or whose parent just exited (multiprocessing's resource tracker
# of a pytest subprocess, a rank's group after SIGKILL), takes a moment to be gone; while
# exiting, its cmdline already reads empty. An orphan lives on: seconds of grace hide none.
EXIT_GRACE_S = 10.0


def lingering(tag: str, within_s: float = EXIT_GRACE_S) -> list[str]:
    """The tagged processes still alive after ``within_s``, each as 'pid (state) cmdline'."""
    deadline = time.monotonic() + within_s
    while (left := tagged_pids(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [_described(pid) for pid in left]


def _described(pid: int) -> str:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (
            (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return f"{pid} (gone while described)"
    return f"{pid} ({state}) {cmdline.strip()[:300] or '(no cmdline: exiting)'}"


# A real PostgreSQL for the history tests (tools/local_postgres.py: initdb + pg_ctl as the
# postgres user under a temporary directory). Without Debian's postgresql the server's half of
# each test skips, unless SCALEGUARD_REQUIRE_POSTGRES=1 (as .ci/run sets it) makes it a failure.
PG_ROOT = Path("/tmp/scaleguard-postgres-tests")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Path]:
    """The root of a running throwaway server (stopped after the session)."""
    from tools import local_postgres

    if not local_postgres.available():
        if os.environ.get("SCALEGUARD_REQUIRE_POSTGRES") == "1":
            pytest.fail(
                "SCALEGUARD_REQUIRE_POSTGRES=1 but PostgreSQL is not installed (apt-get install postgresql)"
            )
        pytest.skip("PostgreSQL is not installed (apt-get install -y postgresql)")
    pytest.importorskip("psycopg", reason="pip install 'psycopg[binary]' (the [test] extra has it)")
    local_postgres.stop(PG_ROOT)  # a server an interrupted run left
    import shutil

    shutil.rmtree(PG_ROOT, ignore_errors=True)
    local_postgres.start(PG_ROOT)
    yield PG_ROOT
    local_postgres.stop(PG_ROOT)


def fresh_database(root: Path) -> str:
    """A new, empty database on the test server, owned by the writer ``sg``: its DSN."""
    import psycopg
    from tools import local_postgres

    name = "t_" + uuid.uuid4().hex[:12]
    admin = local_postgres.dsn(root).replace("//sg:", "//postgres:").rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} OWNER sg")  # a name we made: hex only
    with psycopg.connect(local_postgres.dsn(root).rsplit("/", 1)[0] + f"/{name}", autocommit=True) as conn:
        conn.execute(
            "ALTER DEFAULT PRIVILEGES FOR ROLE sg IN SCHEMA public GRANT SELECT ON TABLES TO sg_reader"
        )
    return local_postgres.dsn(root).rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def history_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a history test's history lives, on each engine: a file, or a fresh database."""
    if request.param == "sqlite":
        return str(tmp_path / "h.sqlite")
    return fresh_database(request.getfixturevalue("postgres"))


@pytest.fixture
def own_postgres(postgres: Path) -> Iterator[Path]:
    """A server of the test's own, which it may stop and start: its root, where the postgres
    user can reach it (pytest's temporary directories are the root user's alone)."""
    import shutil
    import tempfile

    from tools import local_postgres

    root = Path(tempfile.mkdtemp(prefix="scaleguard-pg-"))
    local_postgres.start(root)
    yield root
    local_postgres.stop(root)
    shutil.rmtree(root, ignore_errors=True)
