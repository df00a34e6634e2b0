"""`scaleguard export`: a history or a saved run as Bencher's BMF (checked against Bencher's
published JSON schema) and as Otava's CSV (the layout Otava's CSV reader and test config take)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml

from scaleguard.cli import main as cli_main
from scaleguard.evidence import baseline
from scaleguard.history import database as history
from scaleguard.history import export
from tests.unit.test_history import KEY, nights

# Bencher's BMF schema as published (https://bencher.dev/bmf.json, draft-07)
BMF_SCHEMA = {
    "$id": "https://bencher.dev/bmf.json",
    "$schema": "http://json-schema.org/draft-07/schema",
    "type": "object",
    "patternProperties": {
        ".+": {
            "type": "object",
            "patternProperties": {
                ".+": {
                    "type": "object",
                    "properties": {
                        "value": {"type": "number"},
                        "lower_value": {"type": "number"},
                        "upper_value": {"type": "number"},
                    },
                    "required": ["value"],
                }
            },
        }
    },
}


def _history(tmp_path: Path, key: str = KEY) -> Path:
    db = tmp_path / "h.sqlite"
    with history.History(db) as h:
        for i, level in enumerate([0.1] * 8 + [0.13] * 8):
            h.append(nights([level], first=i), key, "suite")
            h.append(nights([level * 0.6], case_ws=2, first=100 + i), key, "suite")
    return db


def test_bmf_of_a_history_is_valid_bencher_json_with_every_measure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bmf.json"
    assert (
        cli_main(["export", "--format", "bmf", "--history", str(_history(tmp_path)), "--out", str(out)]) == 0
    )
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, BMF_SCHEMA)
    assert set(doc) == {"m-ddp-ws1-fp32-strong", "m-ddp-ws2-fp32-strong"}
    latency = doc["m-ddp-ws1-fp32-strong"]["latency"]
    assert latency["value"] == pytest.approx(0.13e9, rel=0.01)  # the latest night, in ns
    assert latency["lower_value"] < latency["value"] < latency["upper_value"]
    assert doc["m-ddp-ws1-fp32-strong"]["throughput"]["value"] == pytest.approx(64 / 0.13, rel=0.02)
    assert doc["m-ddp-ws1-fp32-strong"]["peak-memory"]["value"] == 2**30
    assert f"bencher run --testbed {KEY}" in capsys.readouterr().out


def test_bmf_takes_one_testbed_and_a_named_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _history(tmp_path)
    with history.History(db) as h:
        h.append(nights([0.2], first=50), "cpu-other-1t", "suite")
    out = tmp_path / "bmf.json"
    assert cli_main(["export", "--format", "bmf", "--history", str(db), "--out", str(out)]) == 2
    assert "choose one with --hardware-key" in capsys.readouterr().err
    args = ["export", "--format", "bmf", "--history", str(db), "--out", str(out), "--hardware-key", KEY]
    assert cli_main([*args, "--session", "night003"]) == 0
    assert json.loads(out.read_text())["m-ddp-ws1-fp32-strong"]["latency"]["value"] == pytest.approx(
        0.1e9, rel=0.01
    )
    assert cli_main([*args, "--session", "nope"]) == 2
    assert cli_main([*args[:-2], "--out", str(db)]) == 2  # never over an input


def test_a_saved_run_exports_as_a_history_does(tmp_path: Path) -> None:
    saved = tmp_path / f"{KEY}.json"
    baseline.update(saved, KEY, {}, nights([0.1]))
    out = tmp_path / "bmf.json"
    assert cli_main(["export", str(saved), "--format", "bmf", "--out", str(out)]) == 0
    jsonschema.validate(json.loads(out.read_text()), BMF_SCHEMA)


def test_otava_csv_has_one_file_per_case_and_a_config_otava_reads(tmp_path: Path) -> None:
    out = tmp_path / "otava"
    assert (
        cli_main(["export", "--format", "otava", "--history", str(_history(tmp_path)), "--out", str(out)])
        == 0
    )
    config = yaml.safe_load((out / "otava.yaml").read_text())
    assert set(config["tests"]) == {f"{KEY}/m-ddp-ws1-fp32-strong", f"{KEY}/m-ddp-ws2-fp32-strong"}
    for test in config["tests"].values():  # what otava.test_config.create_csv_test_config reads
        assert (
            test["type"] == "csv" and test["time_column"] == "time" and isinstance(test["attributes"], list)
        )
        assert test["metrics"]["step_ms"]["direction"] == -1
        rows = list(csv.DictReader(io.StringIO((out / test["file"]).read_text())))
        assert len(rows) == 16 and all(r["step_ms"] and r["time"].endswith("+00:00") for r in rows)
        assert set(test["metrics"]) <= set(rows[0])
    name = export.otava_file_name(KEY, "m-ddp-ws1-fp32-strong")
    steps = [float(r["step_ms"]) for r in csv.DictReader((out / name).open())]
    assert [p.index for p in history.change_points([s / 1e3 for s in steps])] == [8]


def test_stored_text_cannot_become_a_formula_or_a_row(tmp_path: Path) -> None:
    rows = [
        replace(r, torch='=HYPERLINK("http://x")\n2.14', session=f"@{r.session}")
        for r in export.rows_of_cases(nights([0.1, 0.1]), KEY)
    ]
    made = export.otava(export.nights(rows))
    text = made.files[export.otava_file_name(KEY, "m-ddp-ws1-fp32-strong")]
    parsed = list(csv.reader(io.StringIO(text)))
    assert len(parsed) == 3 and parsed[1][1].startswith("'=") and parsed[1][3].startswith("'@")


def test_a_stored_time_that_is_no_time_is_left_out_never_a_formula() -> None:
    rows = export.rows_of_cases(nights([0.1, 0.1, 0.1]), KEY)
    bad = {"night000": '=HYPERLINK("http://x")', "night001": ""}
    rows = [replace(r, recorded_at=bad.get(r.session, r.recorded_at)) for r in rows]
    made = export.otava(export.nights(rows))
    (name,) = [n for n in made.files if n.endswith(".csv")]
    times = [r["time"] for r in csv.DictReader(io.StringIO(made.files[name]))]
    assert made.untimed == 2 and len(times) == 1 and times[0].endswith("+00:00") and "=" not in times[0]
    with pytest.raises(export.ExportError, match="2 nights carry no valid recorded time"):
        export.otava(export.nights([r for r in rows if r.session in bad]))


def _hostile_history(tmp_path: Path, key: str, case_id: str) -> Path:
    """A history whose stored key and case id were written by another tool (scaleguard's own
    append refuses both): what a view must still read without harm."""
    db = tmp_path / "h.sqlite"
    with history.History(db) as h:
        h.append(nights([0.1, 0.1]), KEY, "suite")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET hardware_key = ?, case_id = ?", (key, case_id))
    return db


@pytest.mark.parametrize(
    ("key", "case_id"),
    [
        ("../../up", "m-ddp-ws1"),
        ("/etc", "passwd"),
        (KEY, "../../../x"),
        (KEY, "a/../../b"),
        ("k" * 200, "c" * 200),
    ],
)
def test_an_otava_file_never_lands_outside_out(tmp_path: Path, key: str, case_id: str) -> None:
    db = _hostile_history(tmp_path, key, case_id)
    out = tmp_path / "deep" / "out"
    assert cli_main(["export", "--format", "otava", "--history", str(db), "--out", str(out)]) == 0
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file() and "sqlite" not in p.name}
    assert written and all(p.parent == Path("deep/out") and len(p.name) < 200 for p in written), written


def test_two_cases_whose_joined_names_meet_get_two_files() -> None:
    rows = [*export.rows_of_cases(nights([0.1]), "cpu-a"), *export.rows_of_cases(nights([0.2]), "cpu-a__b")]
    rows = [replace(rows[0], case_id="b__m"), replace(rows[1], case_id="m")]
    made = export.otava(export.nights(rows))
    assert len(made.files) == 3 and made.files["otava.yaml"].count("file:") == 2


def test_the_suggested_commands_quote_and_neutralise_stored_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "cpu-x; rm -rf ~ \x1b[31m"
    db = _hostile_history(tmp_path, key, "m-ddp-ws1-fp32-strong")
    assert (
        cli_main(["export", "--format", "bmf", "--history", str(db), "--out", str(tmp_path / "b.json")]) == 0
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if "bencher run" in x)
    assert "\x1b" not in line and "--testbed 'cpu-x; rm -rf ~ " in line


def test_bmf_refuses_what_bencher_would(tmp_path: Path) -> None:
    for bad in ({}, {"x": {}}, {"x": {"Latency ns": {"value": 1}}}, {"x": {"latency": {"value": float("nan")}}},
                {"x": {"latency": {"value": 1, "lower_value": 2, "upper_value": 1}}}):  # fmt: skip
        with pytest.raises(export.ExportError):
            export.check_bmf(bad)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [("[!m]*", set()), ("m-ddp-ws[1]-*", {"m-ddp-ws1-fp32-strong"}), ("*ws2*", {"m-ddp-ws2-fp32-strong"})],
)
def test_case_patterns_pick_the_same_cases_from_a_history_and_from_a_saved_file(
    tmp_path: Path, pattern: str, expected: set[str]
) -> None:
    """One rule (shell-style, ``[!seq]`` a negation) where SQLite's GLOB read ``[!m]`` as "! or m"."""
    db = _history(tmp_path)
    with history.History(db, readonly=True) as h:
        assert {r.case_id for r in h.rows("cpu-*", pattern)} == expected
    saved = tmp_path / "b.json"
    baseline.update(saved, KEY, {}, nights([0.1], first=1) + nights([0.06], case_ws=2, first=2))
    out = tmp_path / "o"
    code = cli_main(["export", str(saved), "--format", "otava", "--case", pattern, "--hardware-key", "cpu-*",
                     "--out", str(out)])  # fmt: skip
    written = set(yaml.safe_load((out / "otava.yaml").read_text())["tests"]) if code == 0 else set()
    assert code == (0 if expected else 2) and written == {f"{KEY}/{c}" for c in expected}


def test_an_empty_pattern_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _history(tmp_path)
    for option in ("--case", "--hardware-key"):
        assert cli_main(["history", "--history", str(db), option, ""]) == 2
        assert (
            cli_main(
                [
                    "export",
                    "--format",
                    "otava",
                    "--history",
                    str(db),
                    "--out",
                    str(tmp_path / "o"),
                    option,
                    "",
                ]
            )
            == 2
        )
        assert f"{option} is empty" in capsys.readouterr().err


def test_an_otava_out_that_is_a_dangling_link_or_too_long_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _history(tmp_path)
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nowhere")
    for out, says in ((link, "symbolic link"), (tmp_path / ("x" * 300), "cannot be used")):
        assert cli_main(["export", "--format", "otava", "--history", str(db), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert says in err and "bug" not in err, err
    assert not (tmp_path / "nowhere").exists()


def test_a_night_whose_runs_lie_orders_of_magnitude_apart_exports_without_an_interval() -> None:
    rows = export.rows_of_cases(nights([0.1]), KEY)
    rows = [replace(rows[0], median_s=5e-324), replace(rows[1], median_s=1e5)]
    (night,) = export.nights(rows)
    assert night.step_bounds_s is None


def test_history_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    import subprocess
    import sys

    db = tmp_path / "h.sqlite"
    with history.History(db) as h:
        for i in range(0, 600, 50):
            h.append([e for n in range(i, i + 50) for e in nights([0.1], first=n)], KEY, "suite")
    done = subprocess.run(
        f"{sys.executable} -m scaleguard.cli history --history {db} --last 1000 | head -1",
        shell=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.count("\n") == 1 and done.stderr == "", done.stderr
