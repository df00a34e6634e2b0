"""Shared helpers for the harness's own tests."""

from __future__ import annotations

import os
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
    left = tagged_pids(tag)
    assert not left, f"processes left behind: {left}"
