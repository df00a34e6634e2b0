"""The history database (concurrent writers, an interrupted writer, idempotent imports,
migrations) and change points on synthetic series with known steps."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scaleguard.cli import main as cli_main
from scaleguard.evidence import baseline
from scaleguard.history import database as history
from tests.unit.test_verdicts import case, run

KEY = "cpu-hist-1t"


def nights(levels: list[float], case_ws: int = 1, torch: str = "2.14.1", first: int = 0) -> list:
    """One case's evidence per night: 2 runs a night at the given levels (0.3 % run noise)."""
    out = []
    rng = np.random.default_rng(first)
    for i, level in enumerate(levels, start=first):
        runs = [
            replace(run(level * float(np.exp(rng.normal(0, 0.003))), session=f"night{i:03d}", index=k, seed=i * 10 + k),
                    recorded_at=f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:0{k}")
            for k in range(2)
        ]  # fmt: skip
        out.append(case(runs, ws=case_ws, torch=torch))
    return out


def _writer(path: str, start: int) -> None:
    with history.History(Path(path)) as db:
        for evidence in nights([0.1] * 5, first=start):
            db.append([evidence], KEY, "suite")


def test_appending_is_idempotent_and_concurrent_writers_all_land(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with history.History(path) as db:
        assert db.append(nights([0.1, 0.1]), KEY, "suite") == 4
        assert db.append(nights([0.1, 0.1]), KEY, "suite") == 0  # the same runs again: nothing new
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), 100 * (w + 1))) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with history.History(path) as db:
        assert len(db.rows(KEY)) == 4 + 4 * 5 * 2


WRITER_KILLED_MID_TRANSACTION = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("INSERT INTO runs (run_id, case_id, group_id, world_size, hardware_key, session, recorded_at, source, median_s, record) VALUES ('torn', 'c', 'g', 1, 'k', 's', 't', 'x', 0.1, '{}')")
print("inside", flush=True)
time.sleep(60)
"""


def test_a_writer_killed_mid_transaction_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    with history.History(path) as db:
        db.append(nights([0.1]), KEY, "suite")
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER_KILLED_MID_TRANSACTION, str(path)], stdout=subprocess.PIPE
    )
    assert child.stdout is not None and child.stdout.readline().strip() == b"inside"
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    with history.History(path, timeout_s=10) as db:
        ids = {r.run_id for r in db.rows()}
        assert "torn" not in ids and len(ids) == 2
        assert db.append(nights([0.1], first=5), KEY, "suite") == 2  # the next writer is not blocked


def test_an_older_schema_is_migrated_and_a_newer_or_foreign_file_refused(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite"
    sqlite3.connect(old).execute("CREATE TABLE unrelated (x)").connection.commit()  # user_version 0
    with history.History(old) as db:
        assert db.append(nights([0.1]), KEY, "suite") == 2
    newer = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(history.HistoryError, match="newer than this scaleguard"):
        history.History(newer)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(history.HistoryError, match="not a usable scaleguard history"):
        history.History(junk)


def test_change_points_find_known_steps_and_none_in_a_flat_series() -> None:
    rng = np.random.default_rng(1)
    flat = list(0.1 * np.exp(rng.normal(0, 0.004, 40)))
    assert history.change_points(flat) == []
    stepped = flat[:20] + [x * 1.05 for x in flat[20:]]
    (point,) = history.change_points(stepped)
    assert point.index == 20 and 0.04 < point.change < 0.06
    two = flat[:15] + [x * 1.08 for x in flat[15:30]] + [x * 1.08 * 0.9 for x in flat[30:]]
    assert [p.index for p in history.change_points(two)] == [15, 30]


def test_the_cli_imports_idempotently_and_names_the_change_point_and_its_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.sqlite"
    files = []
    for i, (level, torch) in enumerate([(0.1, "2.13.0")] * 8 + [(0.106, "2.14.1")] * 8):
        f = tmp_path / f"b{i}.json"
        baseline.update(f, KEY, {}, nights([level], torch=torch, first=i))
        files.append(str(f))
    assert cli_main(["history", "import", *files, "--history", str(path)]) == 0
    assert "32 new runs from 16 files" in capsys.readouterr().out
    assert cli_main(["history", "import", *files, "--history", str(path)]) == 0
    assert "0 new runs" in capsys.readouterr().out
    assert cli_main(["history", "--history", str(path), "--last", "3"]) == 0
    out = capsys.readouterr().out
    assert "m-ddp-ws1-fp32-strong  (cpu-hist-1t, 16 nights, 32 runs)" in out
    # +6 % on a CPU key is below the CPU step threshold (10 %): not a change point by default
    assert "change point" not in out
    assert cli_main(["history", "--history", str(path), "--last", "3", "--threshold-step", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "change point at 2026-11-01T08:00:00 [night008]: +" in out and "torch 2.13.0 -> 2.14.1" in out
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"\x00" * 4096)
    assert cli_main(["history", "--history", str(bad)]) == 2
    assert "not a usable scaleguard history" in capsys.readouterr().err
    assert cli_main(["history", "import", str(tmp_path / "missing.json"), "--history", str(path)]) == 2


def test_a_fifo_a_device_or_a_hand_edited_history_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "h.fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.sqlite"
    zero.symlink_to("/dev/zero")
    for bad, says in (
        (fifo, "not a regular file"),
        (zero, "symbolic link"),
        (tmp_path, "not a regular file"),
    ):
        assert cli_main(["history", "--history", str(bad)]) == 2
        assert says in capsys.readouterr().err
    path = tmp_path / "h.sqlite"
    with history.History(path) as db:
        db.append(nights([0.1]), KEY, "suite")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE runs SET median_s = 'fast'")
    conn.commit()
    conn.close()
    assert cli_main(["history", "--history", str(path)]) == 2
    assert "median step of the wrong type" in capsys.readouterr().err


def test_what_a_view_would_refuse_is_never_appended(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    for key, cases, says in (
        ("cuda-" + "x" * 450, nights([0.1]), "not a hardware key"),
        ("../../up", nights([0.1]), "not a hardware key"),
        (KEY, [replace(nights([0.1])[0], case_id="a b")], "case id"),
        (KEY, [replace(nights([0.1])[0], versions={"torch": "9" * 500})], "torch"),
    ):
        with history.History(path) as db, pytest.raises(history.HistoryError, match=says):
            db.append(cases, key, "suite")
    with history.History(path, readonly=True) as db:
        assert db.rows() == []


def test_two_machines_runs_sharing_run_ids_are_all_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for key in ("cpu-host-a-1t", "cpu-host-b-1t"):
        f = tmp_path / f"{key}.json"
        baseline.update(f, key, {}, nights([0.1, 0.1, 0.1]))  # the same run ids on both
        files.append(str(f))
    path = tmp_path / "h.sqlite"
    assert cli_main(["history", "import", *files, "--history", str(path)]) == 0
    assert "12 new runs from 2 files" in capsys.readouterr().out


SCHEMA_1 = ";".join(history.migration(1, "sqlite")) + ";"


def test_a_schema_1_history_is_migrated_with_every_row(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_1 + "PRAGMA user_version = 1;")
    conn.close()
    with history.History(path) as db:  # takes it to schema 2 (empty): then a schema-1 row written
        pass
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE runs;" + SCHEMA_1 + "PRAGMA user_version = 1;")
    conn.close()
    with history.History(path) as db:
        assert db.append(nights([0.1, 0.1]), KEY, "suite") == 4
    # the old layout with rows: made by hand as schema 1 made it, then opened by this scaleguard
    old = tmp_path / "old.sqlite"
    with history.History(path, readonly=True) as db:
        rows = db._db.execute(f"SELECT {', '.join(history._COLUMNS[:21])} FROM runs").fetchall()
    conn = sqlite3.connect(old)
    conn.executescript(SCHEMA_1 + "PRAGMA user_version = 1;")
    conn.executemany("INSERT INTO runs VALUES (" + ", ".join("?" * 21) + ")", rows)
    conn.commit()
    conn.close()
    with history.History(old) as db:
        assert int(db._db.execute("PRAGMA user_version").fetchone()[0]) == history.SCHEMA
        assert len(db.rows()) == 4 and all(r.runner is None and r.project is None for r in db.rows())
        assert db.append(nights([0.1, 0.1]), "cpu-other-1t", "suite") == 4  # same ids, another key
        assert {r.runner for r in db.rows("cpu-other-1t")} == {socket.gethostname()}


def test_a_refused_import_leaves_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "b.json"
    # a baseline may hold a 500-character git id (versions take up to 4096), a history 400
    baseline.update(
        f, KEY, {}, [replace(nights([0.1])[0], versions={"torch": "2.14.1", "torch_git": "a" * 500})]
    )
    path = tmp_path / "new.sqlite"
    assert cli_main(["history", "import", str(f), "--history", str(path)]) == 2
    assert not path.exists() and "nothing was written" in capsys.readouterr().err


def test_a_history_this_user_cannot_write_is_still_viewed_and_exported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.sqlite"
    with history.History(path) as db:
        db.append(nights([0.1, 0.1]), KEY, "suite")
    real_access = os.access

    def no_write(p: object, mode: int, **kw: object) -> bool:  # a colleague's file, as root is not
        if mode & os.W_OK and str(p).startswith(str(path)):
            return False
        return real_access(p, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", no_write)
    assert cli_main(["history", "--history", str(path)]) == 0
    assert "2 nights" in capsys.readouterr().out
    out = tmp_path / "otava"
    assert cli_main(["export", "--format", "otava", "--history", str(path), "--out", str(out)]) == 0


# the year of whole runs a view reads is checked column by column: the same rule as row by row
_GOOD_ROW = (
    "run1", "m-ddp-ws2-fp32-strong", "cpu-hist-1t", "2.14.1", None, "night001", "2026-11-01T00:00:00",
    "suite", 0.1, 0.9, 1000, None, "OK", 80.0, "cpu", "r", "p", 0.95,
)  # fmt: skip
_DAMAGE = [
    (0, 7), (0, "x" * 401), (1, "m ws2"), (1, None), (2, 3.5), (3, 7), (4, "g" * 401), (5, None),
    (6, b"t"), (7, None), (8, True), (8, 0.0), (8, float("nan")), (8, -1.0), (8, 1e12), (8, "0.1"),
    (9, float("inf")), (9, "0.9"), (9, False), (10, -1), (10, True), (10, 1.5), (11, 3), (12, 4),
    (13, -0.5), (13, float("nan")), (14, "tpu"), (14, 3), (15, 9), (16, "p" * 401),
    (17, 250.0), (17, float("nan")), (17, "0.9"), (17, True),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), _DAMAGE)
def test_whole_runs_checked_as_columns_agree_with_the_row_rule(field: int, value: object) -> None:
    rows = [_GOOD_ROW, tuple(value if i == field else v for i, v in enumerate(_GOOD_ROW))]
    try:
        expected: object = [history._checked_row("h", r) for r in rows]
    except history.HistoryError as exc:
        expected = str(exc)
    try:
        got: object = history._checked_rows("h", rows)
    except history.HistoryError as exc:
        got = str(exc)
    assert got == expected
    assert history._checked_rows("h", [_GOOD_ROW]) == [history._checked_row("h", _GOOD_ROW)]
