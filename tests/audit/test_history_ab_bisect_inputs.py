"""Hostile and careless inputs to the history, its page, A/B, bisect and user workloads (found by
the third bad-input audit, issue 29; each test is one finding as it was reproduced).

The contract: a value stored in the history is inert in the page and in the terminal; no
supported command loses a run or overwrites an input; every reader of the database and of an
interpreter's probe is bounded and validating; read-only use needs no write access; a
user-caused failure is exit 2 (CLI) or 4 (suite) with a sentence naming the file or option.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from scaleguard import workload
from scaleguard.cli import main as cli_main
from scaleguard.config import ConfigError, PerfConfig
from scaleguard.evidence import baseline
from scaleguard.history import database as history
from scaleguard.schedule import ab, bisect
from tests.unit.test_history import KEY, nights
from tests.unit.test_verdicts import case, spread_runs

HOSTILE = (
    '2.14.1<a href="https://evil.example/l">x</a>'
    '<span style="background:url(https://evil.example/i)">y</span>\x1b[2J\nchange point at 1999'
)


def _exit2(capsys: pytest.CaptureFixture[str], *args: str, needle: str = "") -> str:
    code = cli_main(list(args))
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err and needle in captured.err, captured.err
    return captured.err


def _hostile_history(path: Path) -> Path:
    """A history whose free text (torch version, git sha, session) is hostile markup and
    terminal control, as an `ingest` record or a hand edit can leave it."""
    with history.History(path) as db:
        for i, level in enumerate([0.1] * 6 + [0.13] * 6):
            for evidence in nights([level], first=i):
                hostile = replace(evidence, versions={"torch": HOSTILE, "torch_git": HOSTILE})
                runs = tuple(replace(r, session=f"s{i}{HOSTILE}") for r in evidence.runs)
                db.append([replace(hostile, runs=runs)], KEY, "ingest")
    return path


# 1 -----------------------------------------------------------------------------------------------
def test_stored_markup_is_text_in_the_page_never_an_element(tmp_path: Path) -> None:
    from scaleguard.report import page as history_page

    db = _hostile_history(tmp_path / "h.sqlite")
    with history.History(db, readonly=True) as h:
        page = history_page.render(h.rows())
    body = page.split("</head>", 1)[1]  # plotly's own library is in the head
    assert '<a href="https://evil' not in body and 'style="background:url(' not in body
    assert "\x1b" not in body
    assert "&lt;a href=" in body  # the value is there, as text


def test_the_hostile_page_fetches_nothing_and_holds_no_link_in_a_browser(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    from tests.unit.test_history_page import chromium

    db = _hostile_history(tmp_path / "h.sqlite")
    page_file = tmp_path / "page.html"
    assert cli_main(["history", "--history", str(db), "--html", str(page_file)]) == 0
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_file.as_uri())
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        for point in page.locator(".js-plotly-plot .point").all()[:10]:
            point.hover(force=True)
        links = page.eval_on_selector_all("a[href*='evil'], [style*='evil']", "els => els.length")
        browser.close()
    assert links == 0
    assert all(url.startswith(("file://", "data:", "about:")) for url in requests), requests


# 2 -----------------------------------------------------------------------------------------------
def test_a_symlink_at_the_history_path_is_refused_and_its_target_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "base.json"
    baseline.update(saved, KEY, {}, [case(spread_runs(3, 0.1, 0.004, seed=1), ws=1)])
    target = tmp_path / "elsewhere.sqlite"
    link = tmp_path / "h.sqlite"
    link.symlink_to(target)
    _exit2(capsys, "history", "import", str(saved), "--history", str(link), needle="symbolic link")
    assert not target.exists()


# 3 -----------------------------------------------------------------------------------------------
def test_stored_newlines_and_escapes_are_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _hostile_history(tmp_path / "h.sqlite")
    assert cli_main(["history", "--history", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert not any(line.startswith("change point at 1999") for line in out.splitlines())
    assert "\\x1b[2J\\nchange point at 1999" in out


def test_compare_prints_stored_control_characters_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    baseline.update(old, KEY, {}, [case(spread_runs(4, 0.1, 0.004, seed=1), ws=1)])
    slow = case(spread_runs(4, 0.2, 0.004, seed=2), ws=1)
    baseline.update(new, KEY, {}, [replace(slow, versions={"torch": "2.14.1", "cuda": "\x1b[31m\nFAKE"})])
    cli_main(["compare", str(old), str(new)])
    out = capsys.readouterr().out
    assert "\x1b[31m" not in out


# 4 -----------------------------------------------------------------------------------------------
def test_every_ab_session_has_its_own_run_ids() -> None:
    side = ab.Side("A", ab.Interpreter(sys.executable, ()), {"torch": "x"})
    first = ab.ABSession(side, side, Path("/nonexistent"), 60.0, thresholds=lambda device: None)  # type: ignore[arg-type,return-value]
    second = ab.ABSession(side, side, Path("/nonexistent"), 60.0, thresholds=lambda device: None)  # type: ignore[arg-type,return-value]
    ids = {s.ledgers[x].session_id for s in (first, second) for x in "AB"}
    assert len(ids) == 4


# 5 -----------------------------------------------------------------------------------------------
def test_history_import_of_a_baseline_keeps_every_torch_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "base.json"
    baseline.update(path, KEY, {}, [case(spread_runs(5, 0.1, 0.004, seed=1), ws=1, torch="2.13.0")])
    newer = [replace(r, run_id=f"n{i}") for i, r in enumerate(spread_runs(5, 0.11, 0.004, seed=2))]
    baseline.update(path, KEY, {}, [case(newer, ws=1, torch="2.14.1")])
    db = tmp_path / "h.sqlite"
    assert cli_main(["history", "import", str(path), "--history", str(db)]) == 0
    assert "10 new runs" in capsys.readouterr().out
    with history.History(db, readonly=True) as h:
        assert {r.torch for r in h.rows()} == {"2.13.0", "2.14.1"}


# 6 -----------------------------------------------------------------------------------------------
def _schema1_saved_run(path: Path, node: str, seed: int) -> Path:
    entry = case(spread_runs(1, 0.1, 0.004, seed=seed), ws=1).to_dict()
    info = {k: entry[k] for k in ("case_id", "group_id", "world_size", "config", "versions")}
    info |= {"step_s": list(entry["runs"][0]["step_s"]), "samples_per_s": 640.0, "peak_mem_bytes": [2**30]}
    machine = {"node": node, "scaleguard": {"hardware_key": KEY}}
    path.write_text(
        json.dumps(
            {"machine_info": machine, "datetime": f"2026-01-0{seed}", "benchmarks": [{"extra_info": info}]}
        )
    )
    return path


def test_older_saved_runs_of_two_hosts_with_one_name_both_land(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = _schema1_saved_run(tmp_path / "a" / "0001_nightly.json", "host-a", 1)
    two = _schema1_saved_run(tmp_path / "b" / "0001_nightly.json", "host-b", 2)
    db = tmp_path / "h.sqlite"
    assert cli_main(["history", "import", str(one), str(two), "--history", str(db)]) == 0
    assert "2 new runs" in capsys.readouterr().out


def test_an_older_baseline_without_recorded_at_keeps_every_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {}
    for ws in (1, 2, 4):
        entry = case(spread_runs(1, 0.1 / ws, 0.004, seed=ws), ws=ws).to_dict()
        cases[entry["case_id"]] = {
            "2.11.0": {k: entry[k] for k in ("case_id", "group_id", "world_size", "config", "versions")}
            | {"step_s": list(entry["runs"][0]["step_s"]), "samples_per_s": 640.0, "peak_mem_bytes": 2**30}
        }
    path = tmp_path / f"{KEY}.json"
    path.write_text(json.dumps({"schema_version": 1, "hardware_key": KEY, "hardware": {}, "cases": cases}))
    db = tmp_path / "h.sqlite"
    assert cli_main(["history", "import", str(path), "--history", str(db)]) == 0, capsys.readouterr()
    assert "3 new runs" in capsys.readouterr().out


# 7 -----------------------------------------------------------------------------------------------
def test_compare_refuses_to_write_its_report_over_an_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    baseline.update(old, KEY, {}, [case(spread_runs(4, 0.1, 0.004, seed=1), ws=1)])
    baseline.update(new, KEY, {}, [case(spread_runs(4, 0.1, 0.004, seed=2), ws=1)])
    before = new.read_bytes()
    _exit2(capsys, "compare", str(old), str(new), "--markdown", str(new), needle="would overwrite it")
    assert new.read_bytes() == before


# 8 -----------------------------------------------------------------------------------------------
def _read(**values: str) -> PerfConfig:
    return PerfConfig.read(lambda name: values.get(name))


def test_unusable_session_outputs_are_refused_before_any_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"--perf-ab-save .* is a file"):
        _read(**{"ab-save": str(a_file)})
    with pytest.raises(ConfigError, match=r"--perf-ab-markdown .* is a directory"):
        _read(**{"ab-markdown": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"--perf-history .* is a directory"):
        _read(history=str(tmp_path))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="symbolic link"):
        _read(history=str(link))
    _exit2(
        capsys,
        "ab",
        "--a",
        sys.executable,
        "--b",
        sys.executable,
        "--save-dir",
        str(a_file),
        needle="is a file",
    )


# 9 -----------------------------------------------------------------------------------------------
def test_ingest_with_a_bad_history_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.test_ingest import write_run

    record = write_run(tmp_path / "r.case.json")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"junk" * 100)
    baselines = tmp_path / "baselines"
    _exit2(capsys, "ingest", str(record), "--baselines", str(baselines), "--update-baselines",
           "--history", str(bad), needle="not a usable scaleguard history")  # fmt: skip
    assert not baselines.exists() or not any(baselines.iterdir())


def test_an_import_that_fails_on_a_later_file_writes_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.json"
    baseline.update(good, KEY, {}, [case(spread_runs(3, 0.1, 0.004, seed=1), ws=1)])
    no_key = tmp_path / "nokey.json"
    entry = case(spread_runs(2, 0.1, 0.004, seed=3), ws=1).to_dict()
    info = {k: entry[k] for k in ("case_id", "group_id", "world_size", "config", "versions", "runs")}
    no_key.write_text(json.dumps({"machine_info": {"scaleguard": {}}, "benchmarks": [{"extra_info": info}]}))
    db = tmp_path / "h.sqlite"
    _exit2(capsys, "history", "import", str(good), str(no_key), "--history", str(db))
    assert not db.exists() or cli_main(["history", "--history", str(db)]) == 0
    if db.exists():
        assert "no runs match" in capsys.readouterr().out


# 10 ----------------------------------------------------------------------------------------------
def test_ab_without_a_path_runs_the_suite_not_this_directorys_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    side = ab.Side("A", ab.Interpreter(sys.executable, ()), {"torch": "x"})
    monkeypatch.setattr(ab, "probe", lambda label, python, env=(): side)
    seen: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda command: seen.append(command) or 0)
    monkeypatch.chdir(tmp_path)
    _exit2(capsys, "ab", "--a", sys.executable, "--b", sys.executable, "-k", "tiny", needle="no perf/ here")
    (tmp_path / "perf").mkdir()
    assert cli_main(["ab", "--a", sys.executable, "--b", sys.executable, "-k", "tiny"]) == 0
    assert seen[-1][3:6] == ["perf/", "-k", "tiny"]


# 11 ----------------------------------------------------------------------------------------------
def _valid(path: Path) -> Path:
    with history.History(path) as db:
        db.append(nights([0.1, 0.1]), KEY, "suite")
    return path


def _damage(path: Path, *statements: str) -> Path:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    ("statements", "needle"),
    [
        (("DROP TABLE runs",), "runs table is missing"),
        (("ALTER TABLE runs RENAME TO old", "CREATE TABLE runs (run_id TEXT)"), "has columns run_id"),
        (("CREATE TRIGGER t BEFORE INSERT ON runs BEGIN SELECT RAISE(ABORT, 'no'); END",), "holds a trigger"),
        (("PRAGMA user_version = -3",), "schema -3"),
        # damaged rows: refused when read; appending to such a file is still allowed
        (("UPDATE runs SET torch = x'00ff'",), "torch of the wrong type"),
        (("UPDATE runs SET case_id = 'm-ddp-ws²-fp32-strong'",), "case id of the wrong type"),
        (("UPDATE runs SET peak_mem_bytes = 'lots'",), "peak memory of the wrong type"),
    ],
    ids=["no-runs-table", "other-columns", "aborting-trigger", "negative-version", "binary", "non-ascii-digit",
         "text-memory"],
)  # fmt: skip
def test_a_history_that_is_not_ours_is_exit_2_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], statements: tuple[str, ...], needle: str
) -> None:
    db = _damage(_valid(tmp_path / "h.sqlite"), *statements)
    _exit2(capsys, "history", "--history", str(db), needle=needle)
    saved = tmp_path / "base.json"
    baseline.update(saved, KEY, {}, [case(spread_runs(3, 0.1, 0.004, seed=9), ws=1)])
    if not statements[0].startswith("UPDATE"):  # a file that is not ours takes no import either
        _exit2(capsys, "history", "import", str(saved), "--history", str(db))


def test_a_null_case_id_is_said_not_hidden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _valid(tmp_path / "h.sqlite")
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA writable_schema = ON")  # a tool that ignored the NOT NULL
    conn.execute(
        "UPDATE sqlite_master SET sql = replace(sql, 'case_id TEXT NOT NULL', 'case_id TEXT') WHERE name = 'runs'"
    )
    conn.commit()
    conn.close()
    _damage(db, "UPDATE runs SET case_id = NULL WHERE rowid = 1")
    _exit2(capsys, "history", "--history", str(db), needle="have no case id")


# 12 ----------------------------------------------------------------------------------------------
PROBE_ANSWERS = {
    "number": "print(42)",
    "null": "print('null')",
    "list": "print('[1, 2]')",
    "no-torch-key": 'print(\'{"cuda": "12"}\')',
    "torch-not-text": "print('{\"torch\": 2}')",
    "non-utf8": "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\n')",
    "floods": "import sys\nfor _ in range(200): sys.stdout.write('x' * 1_000_000)",
}


def _fake_python(tmp_path: Path, name: str, body: str) -> str:
    script = tmp_path / f"{name}.py"
    script.write_text(body)
    wrapper = tmp_path / f"{name}-python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.parametrize("answer", sorted(PROBE_ANSWERS))
def test_an_interpreter_that_answers_the_probe_wrongly_is_refused(tmp_path: Path, answer: str) -> None:
    python = _fake_python(tmp_path, answer, PROBE_ANSWERS[answer])
    with pytest.raises(ab.ABInputError, match="side B"):
        ab.probe("B", python)


def test_bisect_and_ab_say_a_wrong_probe_answer_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = _fake_python(tmp_path, "list", PROBE_ANSWERS["list"])
    _exit2(capsys, "ab", "--a", sys.executable, "--b", python, needle="side B")
    assert bisect.main([sys.executable, python], ["perf/"], out=lambda line: None) == 2


def test_pytest_with_a_b_side_that_answers_wrongly_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    python = _fake_python(tmp_path, "null", PROBE_ANSWERS["null"])
    pytester.mkdir("baselines")
    result = pytester.runpytest_subprocess("--perf-ab-b", python, "-p", "no:cacheprovider")
    assert result.ret == 4, result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


# 13 ----------------------------------------------------------------------------------------------
def test_bisect_refuses_the_same_build_as_good_and_bad() -> None:
    said: list[str] = []
    assert bisect.main([sys.executable, sys.executable], ["perf/"], out=said.append) == 2
    assert "same interpreter" in said[-1]


def _same_python_elsewhere(tmp_path: Path) -> Path:
    """This interpreter under another path. A wrapper, not a symlink: a venv's python reached
    through a link outside the venv finds no ``pyvenv.cfg`` and runs as the base python, which has
    no torch (the suite must pass from a venv as users install it)."""
    other = tmp_path / "python"
    other.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    other.chmod(0o755)
    return other


def test_a_probe_refused_by_pytest_is_a_usage_error_not_not_found(tmp_path: Path) -> None:
    other = _same_python_elsewhere(tmp_path)
    said: list[str] = []
    code = bisect.main([sys.executable, str(other)], [str(tmp_path), "--no-such-option"], out=said.append)
    assert code == 2 and "pytest arguments" in said[-1], said


HANGING = """
import time
def test_hangs():
    time.sleep(600)
"""


def test_sigterm_to_bisect_stops_its_probe_and_removes_its_temp_dir(tmp_path: Path, process_tag: str) -> None:
    (tmp_path / "test_hang.py").write_text(HANGING)
    other = _same_python_elsewhere(tmp_path)
    temp = tmp_path / "tmp"
    temp.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-m", "scaleguard.cli", "bisect", sys.executable, str(other), "--", str(tmp_path / "test_hang.py")],
        env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(temp.glob("scaleguard-bisect-*/probe1")):
        time.sleep(0.2)
    time.sleep(2)  # the probe's pytest is collecting or sleeping now
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM, out
    assert "terminated" in out
    assert not list(temp.glob("scaleguard-bisect-*")), list(temp.iterdir())
    # process_tag: nothing the probe started is left


# 14 ----------------------------------------------------------------------------------------------
WORKLOAD_MODULES = {
    "exits": "import sys\nsys.exit(3)\n",
    "parses_argv": "import argparse\nargparse.ArgumentParser().parse_args(['--bogus'])\n",
    "bad_constructor": (
        "import sys\nfrom scaleguard.workload import Workload\n"
        "class W(Workload):\n    name = 'w'\n    def __init__(self):\n        sys.exit(1)\nW_ = W\n"
    ),
    "bad_name": (
        "from scaleguard.workload import Workload\n"
        "class W(Workload):\n    @property\n    def name(self):\n        raise RuntimeError('no name')\nW_ = W()\n"
    ),
}


@pytest.mark.parametrize("module", sorted(WORKLOAD_MODULES))
def test_a_workload_that_exits_or_raises_is_a_workload_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    (tmp_path / f"sg_wl_{module}.py").write_text(WORKLOAD_MODULES[module])
    monkeypatch.syspath_prepend(str(tmp_path))
    attr = "W_" if module.startswith("bad_") else "W"
    with pytest.raises(workload.WorkloadError, match=f"sg_wl_{module}"):
        workload.load_path(f"sg_wl_{module}:{attr}")


def test_a_workload_import_that_hangs_meets_a_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sg_wl_sleeps.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from scaleguard.workloads import contract

    monkeypatch.setattr(contract, "IMPORT_TIMEOUT_S", 1.0)
    with pytest.raises(workload.WorkloadError, match="within 1 s"):
        workload.load_path("sg_wl_sleeps:W")


def test_a_broken_installed_entry_point_is_a_usage_error_without_any_option(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.plugin.conftest import PERF_TEST

    site = tmp_path / "site"
    dist = site / "brokenwl-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenwl\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[scaleguard.workloads]\nbroken = brokenwl_mod:W\n")
    (site / "brokenwl_mod.py").write_text("import sys\nsys.exit(2)\n")
    pytester.makepyfile(test_train_step=PERF_TEST)
    pytester.mkdir("baselines")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 4, text
    assert "brokenwl_mod" in text and "sys.exit" in text and "Traceback" not in text


# 15, 16 ------------------------------------------------------------------------------------------
def test_viewing_writes_nothing_and_does_not_wait_behind_a_writer(tmp_path: Path) -> None:
    db = _valid(tmp_path / "h.sqlite")
    _damage(db, "PRAGMA journal_mode = DELETE")  # a file left in rollback mode
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a session appending right now
    with history.History(db, readonly=True, timeout_s=2) as h:
        assert len(h.rows()) == 4
    writer.execute("ROLLBACK")
    writer.close()
    mode = sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "delete"  # viewing switched nothing: no write access needed


def _create(path: str, start: int) -> None:
    with history.History(Path(path)) as db:
        db.append(nights([0.1], first=start), KEY, "suite")


def test_many_sessions_creating_one_history_at_once_all_land(tmp_path: Path) -> None:
    path = str(tmp_path / "new.sqlite")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_create, args=(path, i)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    with history.History(Path(path), readonly=True) as h:
        assert len(h.rows()) == 16


# 17 ----------------------------------------------------------------------------------------------
def test_a_view_past_the_row_bound_is_refused_with_how_to_narrow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _valid(tmp_path / "h.sqlite")
    monkeypatch.setattr(history, "MAX_VIEW_RUNS", 3)  # the view's bound (it reads nights from the index)
    _exit2(capsys, "history", "--history", str(db), needle="narrow it with --case")
    monkeypatch.setattr(history, "MAX_VIEW_RUNS", 10**6)
    monkeypatch.setattr(history, "MAX_ROWS", 3)  # an export reads every run whole
    _exit2(
        capsys,
        "export",
        "--format",
        "bmf",
        "--history",
        str(db),
        "--out",
        str(tmp_path / "e.json"),
        needle="narrow it with --case",
    )
    _exit2(capsys, "history", "--history", str(db), "--last", "-2", needle="--last takes a positive")


def test_change_points_of_a_long_series_are_found_in_one_pass_per_segment() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    values = np.concatenate([np.full(4000, 0.1), np.full(4000, 0.11)]) * np.exp(rng.normal(0, 0.003, 8000))
    points = history.change_points(values)
    assert [p.index for p in points] == [4000]


def test_an_existing_history_directory_is_a_usage_error_before_the_session(pytester: pytest.Pytester) -> None:
    from tests.plugin.conftest import PERF_TEST

    pytester.makepyfile(test_train_step=PERF_TEST)
    pytester.mkdir("baselines")
    pytester.mkdir("somedir")
    result = pytester.runpytest_subprocess("--perf-history", "somedir", "-p", "no:cacheprovider")
    assert result.ret == 4
    assert "--perf-history somedir is a directory" in result.stdout.str() + result.stderr.str()


# the fuzz, extended to the database and the probe -------------------------------------------------
def test_hostile_rows_and_probe_outputs_never_raise(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.audit.test_fuzz import EXAMPLES

    columns = history._COLUMNS
    value = st.one_of(
        st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=30), st.binary(max_size=20)
    )
    base = _valid(tmp_path / "base.sqlite").read_bytes()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(columns), value, min_size=1, max_size=5), st.binary(max_size=400))
    def check(changes: dict, raw: bytes) -> None:
        db = tmp_path / "fuzz.sqlite"
        db.write_bytes(base)
        conn = sqlite3.connect(db)
        sets = ", ".join(f"{c} = ?" for c in changes)
        try:
            conn.execute(f"UPDATE runs SET {sets} WHERE rowid = 1", list(changes.values()))
            conn.commit()
        except sqlite3.Error:
            pass  # the row the schema refuses is not the reader's problem
        conn.close()
        assert cli_main(["history", "--history", str(db)]) in (0, 2)
        answer = ab._probe_answer(raw)
        assert answer is None or isinstance(answer, dict)

    check()


def test_the_import_deadline_leaves_an_outer_alarm_armed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest-timeout's signal method arms SIGALRM too: a workload import must not disarm it."""
    (tmp_path / "sg_wl_quick.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.signal(signal.SIGALRM, lambda *a: None)
    signal.setitimer(signal.ITIMER_REAL, 300.0)
    try:
        with pytest.raises(workload.WorkloadError, match=r"not a scaleguard\.workload\.Workload"):
            workload.load_path("sg_wl_quick:X")
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 290.0 < left <= 300.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
