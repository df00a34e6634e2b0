"""The nightly workflow is valid GitHub Actions and does what the README promises."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).parents[2] / ".github" / "workflows" / "nightly-gpu.yml"


def test_workflow_validates_against_the_github_schema() -> None:
    exe = shutil.which("check-jsonschema")
    if exe is None:
        pytest.fail("check-jsonschema is part of the test extras: pip install -e '.[test]'")
    done = subprocess.run(
        [exe, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_workflow_runs_the_suite_nightly_and_keeps_the_evidence() -> None:
    flow = yaml.safe_load(WORKFLOW.read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert "schedule" in triggers and "workflow_dispatch" in triggers
    job = flow["jobs"]["perf"]
    assert "self-hosted" in job["runs-on"] and "${{ matrix.label }}" in job["runs-on"]
    assert "gpu" in job["strategy"]["matrix"]["label"]  # a matrix over the pool's runner labels
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    # the history: the fleet's server when its secret is set, else a cache per hardware key (never
    # per runner name: a pool's runners pool their nights), checkpointed before it is saved
    assert job["env"]["SCALEGUARD_HISTORY"] == "${{ secrets.SCALEGUARD_HISTORY }}"
    names = [step.get("name") for step in job["steps"]]
    caches = [s for s in job["steps"] if s.get("uses", "").startswith("actions/cache/")]
    assert caches and all(
        "steps.hw.outputs.key" in s["with"]["key"] and "runner.name" not in str(s["with"]) for s in caches
    )
    assert names.index("Hardware key") < names.index("Restore the history")
    assert names.index("Checkpoint the history") < names.index("Save the history")
    assert "wal_checkpoint" in runs
    assert "pytest perf/" in runs and "--benchmark-save" in runs and "scaleguard compare" in runs
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    for kept in (".benchmarks/", "report.md", "report.png"):
        assert kept in upload["with"]["path"]


def test_workflow_inputs_never_reach_a_shell_line_and_the_baseline_is_this_machines() -> None:
    flow = yaml.safe_load(WORKFLOW.read_text())
    for step in flow["jobs"]["perf"]["steps"]:
        # ${{ inputs.* }} inside `run:` is pasted into the script: shell injection for dispatchers
        assert "${{ inputs." not in step.get("run", ""), step.get("name")
    runs = "\n".join(step.get("run", "") for step in flow["jobs"]["perf"]["steps"])
    assert "scaleguard hardware-key" in runs and "baselines/*.json | head" not in runs
