"""``scaleguard ingest`` takes only records that their own, finished torchrun run wrote."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main
from scaleguard.evidence.files import atomic_write_json
from scaleguard.evidence.records import RankResult
from scaleguard.evidence.runs import RunRecord, run_file
from scaleguard.schedule import torchrun_entry
from tests.conftest import tiny_spec


def write_run(out: Path, finish: bool = True) -> Path:
    spec = tiny_spec(world_size=1)
    steps = (0.1, 0.11, 0.1, 0.12)
    rank = RankResult(
        spec.case_id,
        0,
        steps,
        (),
        True,
        0.1,
        1000,
        "host_max_rss",
        "cpu",
        {"torch": "t"},
        {"threads_per_rank": 1},
    )
    run_id = torchrun_entry._start_marker(out, spec.case_id, "job")
    atomic_write_json(torchrun_entry.record_path(out, spec.case_id),
                      run_file(spec, replace(RunRecord.from_ranks(spec, [rank]), session=run_id)))  # fmt: skip
    if finish:
        torchrun_entry._write_marker(out, spec.case_id, run_id, "done")
    return torchrun_entry.record_path(out, spec.case_id)


def test_a_finished_record_is_ingested(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = write_run(tmp_path)
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines"]) == 0
    assert "1 cases recorded" in capsys.readouterr().out


def test_a_record_of_a_failed_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = write_run(tmp_path, finish=False)
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path)]) == 2
    assert "did not finish" in capsys.readouterr().err


def test_a_stale_record_is_refused_and_a_new_run_removes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = write_run(tmp_path)
    old_bytes = record.read_bytes()
    torchrun_entry._start_marker(tmp_path, tiny_spec(world_size=1).case_id, "job2")  # the next job starts
    assert not record.exists()  # its stale output is gone before it runs
    record.write_bytes(old_bytes)  # e.g. restored by a careless copy: the marker names job2
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path)]) == 2
    assert "stale record" in capsys.readouterr().err


def test_a_corrupt_record_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = write_run(tmp_path)
    data = json.loads(record.read_text())
    data["run"]["step_s"] = "abc"
    record.write_text(json.dumps(data))
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path)]) == 2
    assert "field 'step_s'" in capsys.readouterr().err


def test_a_schema_2_record_still_ingests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record written before schema 3 (the run's fields beside its spec, ``machine_state``),
    made by that scaleguard's own ``RunResult.to_dict``, reads as the same run."""
    fixture = Path(__file__).parent / "data" / "torchrun-record-schema2.json"
    data = json.loads(fixture.read_text())
    spec_id = tiny_spec(world_size=2).case_id
    record = torchrun_entry.record_path(tmp_path, spec_id)
    record.write_text(fixture.read_text())
    torchrun_entry._write_marker(tmp_path, spec_id, data["run_id"], "done")
    spec, run = torchrun_entry.read_finished_record(record)
    assert spec.case_id == spec_id and run.session == data["run_id"]
    assert run.step_s == tuple(data["step_s"]) and run.rank_peak_mem_bytes == (1000, 1001)
    assert run.gpu == {"sm_clock_mhz": 1980} and run.gpu_whole_run == {"samples": 3}
    assert run.host["slurm"]["nodes"] == ["n1", "n2"] and run.host["foreign_cores"] == 0.01
    assert run.anatomy is not None and run.notes == tuple(data["notes"])
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines"]) == 0
    assert "1 cases recorded" in capsys.readouterr().out


def test_a_run_given_twice_or_ingested_again_counts_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], history_target: str
) -> None:
    from scaleguard.evidence import baseline
    from scaleguard.history.store import open_history
    from scaleguard.history.target import target_of

    record = write_run(tmp_path)
    base = tmp_path / "b"
    common = ["--baselines", str(base), "--update-baselines", "--history", history_target, "--project", "p1"]
    assert cli_main(["ingest", str(record), str(record), *common]) == 0
    assert "counted once" in capsys.readouterr().err
    assert cli_main(["ingest", str(record), *common]) == 0  # the same run, a second ingest
    (path,) = base.glob("*.json")
    loaded = baseline.load(path)
    assert loaded is not None
    (entry,) = [e for by_torch in loaded.cases.values() for e in by_torch.values()]
    with open_history(target_of(history_target), readonly=True) as h:  # a file or a server alike
        (row,) = h.rows()
        assert len(entry.runs) == 1 and row.project == "p1" and row.runner


def test_a_records_device_name_reaches_the_terminal_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = write_run(tmp_path)
    data = json.loads(record.read_text())
    data["run"]["device_name"] = "cpu\x1b[2J\x1b]0;owned\x07"
    data["run"]["notes"] = ["a note \x1b[31mred\x1b[0m"]  # shown in the table's caption
    record.write_text(json.dumps(data))
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines"]) == 0
    out = capsys.readouterr()
    assert "\x1b" not in out.out + out.err and "\x07" not in out.out + out.err


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("device_name", "x" * 450, "not a hardware key"),
        ("runtime", {"torch": "2.14 evil"}, "is no version"),
        ("settings", {"threads_per_rank": "x"}, "not a count of threads"),
    ],
)
def test_a_record_the_baseline_or_history_would_refuse_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: object, says: str
) -> None:
    record = write_run(tmp_path)
    data = json.loads(record.read_text())
    data["run"][where] = value
    record.write_text(json.dumps(data))
    db, base = tmp_path / "h.sqlite", tmp_path / "b"
    args = ["ingest", str(record), "--baselines", str(base), "--update-baselines", "--history", str(db)]
    assert cli_main(args) == 2
    assert says in capsys.readouterr().err
    assert not db.exists() and not list(base.glob("*.json"))


@pytest.mark.parametrize("part", ["foreign_load", "slurm", "during_steps", "whole_run"])
def test_a_schema_2_record_whose_machine_state_part_is_no_object_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], part: str
) -> None:
    fixture = Path(__file__).parent / "data" / "torchrun-record-schema2.json"
    data = json.loads(fixture.read_text())
    data["machine_state"][part] = [1, 2]
    spec_id = tiny_spec(world_size=2).case_id
    record = torchrun_entry.record_path(tmp_path, spec_id)
    record.write_text(json.dumps(data))
    torchrun_entry._write_marker(tmp_path, spec_id, data["run_id"], "done")
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines"]) == 2
    err = capsys.readouterr().err
    assert f"field {part!r} must be an object" in err and "bug" not in err


def test_a_record_nested_600_deep_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = write_run(tmp_path)
    data = json.loads(record.read_text())
    deep: dict = {}
    node = deep
    for _ in range(600):
        node["x"] = {}
        node = node["x"]
    data["run"]["host"] = deep
    record.write_text(json.dumps(data))
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines"]) == 2
    err = capsys.readouterr().err
    assert "nests deeper than 16 levels" in err and "bug" not in err
