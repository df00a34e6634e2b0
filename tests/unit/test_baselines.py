"""Baseline files: schema 2 round trip, run retention, schema-1 migration, the locked merge,
and every kind of bad file as a clear error that leaves the bytes alone."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from scaleguard.evidence import baseline, files
from scaleguard.evidence.baseline import BaselineError, BaselineFile
from scaleguard.schema import SCHEMA_VERSION
from tests.unit.test_verdicts import case, runs_of

KEY = "cpu-x-1t"


def _file(tmp_path: Path, n_runs: int = 3) -> Path:
    path = tmp_path / f"{KEY}.json"
    baseline.update(path, KEY, {"device": "cpu"}, [case(runs_of([0.1] * n_runs, sessions=2))])
    return path


def test_round_trip_keeps_runs_and_spread(tmp_path: Path) -> None:
    path = _file(tmp_path)
    loaded = baseline.load(path)
    assert loaded is not None and loaded.migrated_from is None
    entry = loaded.entry("m-ddp-ws2-fp32-strong", None)
    assert entry is not None and len(entry.runs) == 3 and entry.sessions == 2
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    stored = data["cases"]["m-ddp-ws2-fp32-strong"]["2.11.0"]
    assert stored["run_spread"] is not None and len(stored["runs"][0]["step_s"]) == 40
    assert '"step_s": [0.' in path.read_text()  # one line per sample list: reviewable diffs


def test_updates_append_runs_keep_the_last_k_and_restart_on_request(tmp_path: Path) -> None:
    path = _file(tmp_path)
    more = case(runs_of([0.2] * 3, sessions=1))
    more = more.with_runs(
        [r.__class__(**{**r.__dict__, "run_id": f"new-{i}"}) for i, r in enumerate(more.runs)]
    )
    merged = baseline.update(path, KEY, {}, [more], keep=4)
    entry = merged.entry("m-ddp-ws2-fp32-strong", "2.11.0")
    assert entry is not None and [r.run_id for r in entry.runs][-3:] == ["new-0", "new-1", "new-2"]
    assert len(entry.runs) == 4  # oldest dropped
    restarted = baseline.update(path, KEY, {}, [case(runs_of([0.3]))], restart=frozenset({more.case_id}))
    entry = restarted.entry(more.case_id, "2.11.0")
    assert (
        entry is not None and len(entry.runs) == 1 and entry.runs[0].median_s == pytest.approx(0.3, rel=0.05)
    )


def test_other_torch_versions_and_cases_are_untouched(tmp_path: Path) -> None:
    path = _file(tmp_path)
    baseline.update(path, KEY, {}, [case(runs_of([0.1]), torch="2.12.0"), case(runs_of([0.1]), ws=1)])
    loaded = baseline.load(path)
    assert loaded is not None
    assert set(loaded.cases["m-ddp-ws2-fp32-strong"]) == {"2.11.0", "2.12.0"}
    assert set(loaded.cases) == {"m-ddp-ws2-fp32-strong", "m-ddp-ws1-fp32-strong"}


def test_foreign_hardware_is_never_overwritten(tmp_path: Path) -> None:
    path = _file(tmp_path)
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=r"holds hardware cpu-x-1t.*not overwritten"):
        baseline.update(path, "cuda-other-x1", {}, [case(runs_of([0.1]))])
    assert path.read_bytes() == before


SCHEMA1 = {
    "schema_version": 1,
    "hardware_key": KEY,
    "hardware": {},
    "cases": {
        "m-ddp-ws2-fp32-strong": {
            "2.11.0": {
                "case_id": "m-ddp-ws2-fp32-strong", "group_id": "m-ddp-fp32-strong", "world_size": 2,
                "config": {"model": "m", "world_size": 2, "global_batch": 64}, "step_s": [0.1, 0.11, 0.1],
                "summary": {}, "samples_per_s": 640.0, "speedup": 1.8, "scaling_efficiency": 0.9,
                "peak_mem_bytes": 100, "versions": {"torch": "2.11.0"}, "recorded_at": "2026-01-01",
                "commit": None, "throttled": False, "schema_version": 1,
            }
        }
    },
}  # fmt: skip


def test_schema1_loads_as_one_run_each_and_is_written_back_in_the_current_schema(tmp_path: Path) -> None:
    path = tmp_path / f"{KEY}.json"
    path.write_text(json.dumps(SCHEMA1))
    loaded = baseline.load(path)
    assert loaded is not None and loaded.migrated_from == 1
    entry = loaded.entry("m-ddp-ws2-fp32-strong", None)
    assert entry is not None and len(entry.runs) == 1 and entry.efficiency() == 0.9
    baseline.update(path, KEY, {}, [case(runs_of([0.1]), ws=1)])
    data = json.loads(path.read_text())
    assert (
        data["schema_version"] == SCHEMA_VERSION
        and len(data["cases"]["m-ddp-ws2-fp32-strong"]["2.11.0"]["runs"]) == 1
    )


def _entry_field(text: str, key: str, value: str) -> str:
    data = json.loads(text)
    entry = data["cases"]["m-ddp-ws2-fp32-strong"]["2.11.0"]
    target = entry["runs"][0] if key in entry["runs"][0] else entry
    target[key] = "__RAW__"
    return json.dumps(data).replace('"__RAW__"', value)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: t[: len(t) // 2], "corrupt or truncated JSON"),
        (lambda t: "[1, 2]", "expected a JSON object"),
        (
            lambda t: t.replace(f'"schema_version": {SCHEMA_VERSION}', '"schema_version": 7'),
            "newer scaleguard: upgrade",
        ),
        (
            lambda t: t.replace(f'"schema_version": {SCHEMA_VERSION}', '"schema_version": 0'),
            "schema_version 0",
        ),
        (
            lambda t: t.replace(f'"schema_version": {SCHEMA_VERSION}', '"schema_version": "2"'),
            "schema_version '2'",
        ),
        (lambda t: _entry_field(t, "step_s", '"abc"'), "field 'step_s' must be a list of seconds"),
        (lambda t: _entry_field(t, "step_s", '[0.1, "x"]'), "item 1 is str"),
        (lambda t: _entry_field(t, "step_s", "[]"), "has 0 samples; needs 2"),
        (lambda t: _entry_field(t, "step_s", "[0.1]"), "has 1 samples; needs 2"),
        (lambda t: _entry_field(t, "step_s", "[0.1, -0.2]"), "must be finite and positive"),
        (lambda t: _entry_field(t, "step_s", "NaN"), "NaN is not a number JSON allows"),
        (lambda t: _entry_field(t, "config", "null"), "field 'config' is null"),
        (lambda t: _entry_field(t, "peak_mem_bytes", "1" + "0" * 5000), "invalid JSON value"),
        (lambda t: _entry_field(t, "peak_mem_bytes", "1" + "0" * 300), "outside"),
        (lambda t: _entry_field(t, "runs", "[]"), "field 'runs' is empty"),
        (lambda t: "[" * 100000 + "]" * 100000, "nested too deeply"),
        (lambda t: t.replace("{", "\udcff", 1), "not UTF-8"),
    ],
)
def test_bad_files_are_clear_errors_and_untouched(tmp_path: Path, damage, message: str) -> None:
    path = _file(tmp_path)
    text = damage(path.read_text())
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=message) as info:
        baseline.load(path)
    assert str(path) in str(info.value)
    with pytest.raises(BaselineError):
        baseline.update(path, KEY, {}, [case(runs_of([0.1]))])
    assert path.read_bytes() == before


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(tmp_path)
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 1000)
    with pytest.raises(BaselineError, match="larger than the"):
        baseline.load(path)


def test_missing_baseline_is_none(tmp_path: Path) -> None:
    assert baseline.load(tmp_path / "nope.json") is None


def _hold_lock(
    path: str, held: multiprocessing.synchronize.Event, release: multiprocessing.synchronize.Event
) -> None:
    with baseline.locked(Path(path)):
        held.set()
        release.wait(30)


def test_a_held_lock_makes_the_writer_wait_then_give_up_with_a_clear_error(tmp_path: Path) -> None:
    path = _file(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(path), held, release))
    holder.start()
    try:
        assert held.wait(60)
        with pytest.raises(BaselineError, match="another scaleguard session"):
            with baseline.locked(path, timeout_s=0.5):
                pass
    finally:
        release.set()
        holder.join(30)
    with baseline.locked(path, timeout_s=5):
        pass  # free again


def test_concurrent_updates_keep_every_case(tmp_path: Path) -> None:
    path = tmp_path / f"{KEY}.json"
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            for step in range(5):
                baseline.update(path, KEY, {}, [case(runs_of([0.1]), ws=10 * index + step + 1)])
                time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    loaded = baseline.load(path)
    assert loaded is not None and len(loaded.cases) == 20


def test_unwritable_directory_is_found_before_measuring(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(BaselineError, match="not writable"):
        baseline.check_writable(blocked / "baselines")


def test_baseline_file_text_is_valid_json(tmp_path: Path) -> None:
    file = BaselineFile(tmp_path / "x.json", KEY, {}).merged([case(runs_of([0.1, 0.2]))])
    assert json.loads(file.to_text())["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[2] / "baselines").glob("*.json")), ids=lambda p: p.name
)
def test_every_committed_baseline_reads_and_writes_back_the_same_runs(path: Path, tmp_path: Path) -> None:
    """The committed files (schema 2) read with this scaleguard and survive its write-back."""
    loaded = baseline.load(path)
    assert loaded is not None and loaded.cases
    copy = tmp_path / path.name
    copy.write_text(loaded.to_text())
    again = baseline.load(copy)
    assert again is not None and again.migrated_from is None
    for case_id, by_torch in loaded.cases.items():
        for torch_version, entry in by_torch.items():
            assert again.cases[case_id][torch_version].runs == entry.runs
