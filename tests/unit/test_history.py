"""The history database (concurrent writers, an interrupted writer, idempotent imports,
migrations) and change points on synthetic series with known steps."""

from __future__ import annotations

import multiprocessing
import os
import signal
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
