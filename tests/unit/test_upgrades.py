"""Older files upgraded dict to dict into the current shape, then read by the one reader."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scaleguard.evidence.files import FileFormatError
from scaleguard.evidence.runs import CaseEvidence, read_run_file
from scaleguard.evidence.upgrades import baseline_entry_from_1

SCHEMA1_ENTRY: dict[str, Any] = {
    "case_id": "resnet18_cifar-ddp-ws1-fp32-strong",
    "group_id": "resnet18_cifar-ddp-fp32-strong",
    "world_size": 1,
    "config": {"mode": "ddp"},
    "versions": {"torch": "2.1.0"},
    "step_s": [0.1, 0.11, 0.12],
    "samples_per_s": 100.0,
    "peak_mem_bytes": 1000,
    "recorded_at": "2024-01-01T00:00:00+00:00",
    "throttled": True,
}


def test_a_schema1_entry_becomes_one_run_with_the_id_it_always_had() -> None:
    upgraded = baseline_entry_from_1(copy.deepcopy(SCHEMA1_ENTRY), "w", "fix")
    assert set(upgraded) == {"case_id", "group_id", "world_size", "config", "versions", "runs"}
    (run,) = CaseEvidence.from_dict(upgraded, "w", "fix").runs
    # the id the hand-built reader gave this entry (a history that imported it knows the run)
    assert run.run_id == "schema1-ea88ca15e3a2"
    assert run.session == "schema1-2024-01-01T00:00:00+00:00"
    assert run.quarantine == "throttled (schema 1)" and run.step_s == (0.1, 0.11, 0.12)
    assert run.samples_per_s == 100.0 and run.peak_mem_bytes == 1000


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("peak_mem_bytes", "lots", "peak_mem_bytes"),  # passed on: the run's reader checks it
        ("world_size", 0, "world_size"),  # passed on: the entry's reader checks it
        ("step_s", [0.1, -1.0], "step_s"),  # read by the upgrade: its digest is the run's id
        ("recorded_at", ["not", "text"], "recorded_at"),
    ],
)
def test_an_upgraded_entry_meets_the_current_readers_checks(field: str, value: object, named: str) -> None:
    bad = {**copy.deepcopy(SCHEMA1_ENTRY), field: value}
    with pytest.raises(FileFormatError, match=named):
        CaseEvidence.from_schema1(bad, "baseline b.json, case c", "fix")


@pytest.mark.parametrize("anatomy", [{}, None])
def test_a_schema2_record_without_an_anatomy_reads_as_a_run_without_one(anatomy: object) -> None:
    data = json.loads((Path(__file__).parent / "data" / "torchrun-record-schema2.json").read_text())
    data["anatomy"] = anatomy
    _, run = read_run_file(data, "record r.json", "fix")
    assert run.anatomy is None and run.session == data["run_id"] and run.peak_mem_bytes == 1001
