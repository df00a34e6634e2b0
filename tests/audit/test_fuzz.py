"""Property: for any document, every reader and CLI command ends in exit 0, 1 or 2 (or, for rank
files, a clean case failure), never a traceback. Documents are valid files of each kind with
one part replaced, removed or added by hypothesis, plus raw bytes for the reader itself.

Bounded so CI stays fast: ``FUZZ_EXAMPLES`` examples per file kind (default 40).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaleguard.cli import main as cli_main
from scaleguard.evidence import baseline
from scaleguard.evidence.files import FileFormatError, read_document
from scaleguard.ranks import launcher, protocol, worker
from tests.conftest import tiny_spec
from tests.unit.test_ingest import write_run
from tests.unit.test_verdicts import case, spread_runs

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
KEY = "cpu-fuzz-1t"

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node[:3]):
            out += _paths(value, (*prefix, index))
    return out


@st.composite
def mutated(draw: st.DrawFn, document: dict) -> str:
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "replace":
            parent[path[-1]] = draw(json_values)
        elif op == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    return json.dumps(doc)


def _cli(*args: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli_main(list(args))
    assert "Traceback" not in err.getvalue()
    assert "cannot use the input" not in err.getvalue(), err.getvalue()  # the reader caught it, not the net
    return code


def _valid_baseline(directory: Path) -> dict:
    path = directory / f"{KEY}.json"
    baseline.update(path, KEY, {"device": "cpu"}, [case(spread_runs(3, 0.1, 0.01, seed=1), ws=1),
                                                   case(spread_runs(3, 0.12, 0.01, seed=2), ws=2)])  # fmt: skip
    return json.loads(path.read_text())


def _valid_saved_run(directory: Path) -> dict:
    entry = case(spread_runs(3, 0.1, 0.004, seed=3), ws=1).to_dict()
    info = {k: entry[k] for k in ("case_id", "group_id", "world_size", "config", "versions", "runs")}
    return {"machine_info": {"scaleguard": {"hardware_key": KEY}}, "benchmarks": [{"extra_info": info}]}


@pytest.fixture(scope="module")
def work() -> Path:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


@FUZZ
@given(data=st.data())
def test_compare_on_any_baseline_exits_0_1_or_2(work: Path, data: st.DataObject) -> None:
    good = work / "good"
    good.mkdir(exist_ok=True)
    doc = _valid_baseline(good)
    path = work / "b.json"
    path.write_text(data.draw(mutated(doc)))
    try:
        baseline.load(path)
    except baseline.BaselineError:
        pass
    assert _cli("compare", str(good / f"{KEY}.json"), str(path)) in (0, 1, 2)
    assert _cli("compare", str(path), str(good / f"{KEY}.json"), "--markdown", str(work / "r.md")) in (
        0,
        1,
        2,
    )


@FUZZ
@given(data=st.data())
def test_compare_on_any_saved_run_exits_0_1_or_2(work: Path, data: st.DataObject) -> None:
    good = work / "good"
    good.mkdir(exist_ok=True)
    _valid_baseline(good)
    path = work / "s.json"
    path.write_text(data.draw(mutated(_valid_saved_run(work))))
    assert _cli("compare", str(good / f"{KEY}.json"), str(path), "--markdown", str(work / "r.md")) in (
        0,
        1,
        2,
    )


@pytest.fixture(scope="module")
def torchrun_record(work: Path) -> tuple[Path, dict]:
    out = work / "tr"
    out.mkdir()
    record = write_run(out)
    return record, json.loads(record.read_text())


@FUZZ
@given(data=st.data())
def test_ingest_of_any_torchrun_record_exits_0_1_or_2(
    work: Path, torchrun_record: tuple[Path, dict], data: st.DataObject
) -> None:
    record, doc = torchrun_record
    record.write_text(data.draw(mutated(doc)))
    code = _cli("ingest", str(record), "--baselines", str(work / "ingest"), "--update-baselines")
    assert code in (0, 1, 2)


@FUZZ
@given(data=st.data())
def test_any_rank_file_is_a_result_or_a_clean_case_failure(work: Path, data: st.DataObject) -> None:
    spec = tiny_spec(world_size=1)
    run_dir = work / "ranks"
    run_dir.mkdir(exist_ok=True)
    good = {
        "case_id": spec.case_id, "rank": 0, "step_s": [0.1, 0.1], "warmup_step_s": [0.2], "steady": True,
        "final_loss": 1.0, "peak_mem_bytes": 1, "mem_kind": "host_max_rss", "device_name": "cpu",
        "runtime": {"torch": "x"}, "settings": {}, "phase_unix": {"configure": 1.0},
        "anatomy": {}, "pid": 1, "process_runs_before": 0, "schema_version": 2,
    }  # fmt: skip
    files = worker.RankFiles.in_dir(run_dir, 0)
    Path(files.result).write_text(data.draw(mutated(good)))
    Path(files.error).write_text(data.draw(mutated({"case_id": "c", "rank": 0, "phase": "p", "exc_type": "E",
                                                    "message": "m", "traceback": "t", "unix_time": 1.0})))  # fmt: skip
    try:
        launcher._collect(spec, run_dir)
    except protocol.CaseFailedError:
        pass
    launcher._read_failure(run_dir, 0)


@FUZZ
@given(raw=st.binary(max_size=2000) | st.text(max_size=2000).map(str.encode))
def test_the_reader_takes_any_bytes_and_returns_an_object_or_a_clear_error(work: Path, raw: bytes) -> None:
    path = work / "raw.json"
    path.write_bytes(raw)
    try:
        assert isinstance(read_document(path, "file", "fix"), dict)
    except FileFormatError as exc:
        assert str(path) in str(exc)
