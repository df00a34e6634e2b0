"""The history on both engines, from one parametrised fixture (``history_target``: a file, or a
fresh database on a real PostgreSQL started by ``tools/local_postgres.py``): appends land once,
16 writers at once lose nothing, views, change points, export and the page read the same, a
fleet's runners pool and narrow. The server's own faults (stopped, restarted, a read-only role,
its password) are in ``test_history_server.py``."""

from __future__ import annotations

import gc
import json
import multiprocessing
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main
from scaleguard.evidence import baseline
from scaleguard.history import database as history
from scaleguard.history.store import Store, open_history
from scaleguard.history.target import target_of
from tests.unit.test_history import KEY, nights


def opened(text: str, readonly: bool = False) -> Store:
    return open_history(target_of(text), readonly=readonly)


def _writer(target: str, start: int, runner: str) -> None:
    with opened(target) as db:
        for evidence in nights([0.1] * 5, first=start):
            db.append([evidence], KEY, "suite", fleet=history.Fleet(runner, "proj"))
        db.append(nights([0.1], first=9000), KEY, "suite", fleet=history.Fleet(runner, "proj"))  # shared


def test_sixteen_writers_at_once_land_every_run_once_and_a_reader_never_waits(history_target: str) -> None:
    with opened(history_target) as db:
        assert db.append(nights([0.1, 0.1]), KEY, "suite") == 4
        assert db.append(nights([0.1, 0.1]), KEY, "suite") == 0  # the same runs again: nothing new
    ctx = multiprocessing.get_context("spawn")
    writers = 16 if history_target.startswith("postgresql") else 4  # SQLite: one writer at a time
    procs = [
        ctx.Process(target=_writer, args=(history_target, 100 * (w + 1), f"runner{w:02d}"))
        for w in range(writers)
    ]
    reads: list[float] = []
    done = threading.Event()

    def read() -> None:
        with opened(history_target, readonly=True) as view:
            while not done.is_set():
                t0 = time.monotonic()
                view.rows(KEY)
                reads.append(time.monotonic() - t0)

    reader = threading.Thread(target=read)
    for p in procs:
        p.start()
    reader.start()
    for p in procs:
        p.join(180)
    done.set()
    reader.join(60)
    assert [p.exitcode for p in procs] == [0] * writers
    with opened(history_target, readonly=True) as db:
        rows = db.rows(KEY)
        ids = [r.run_id for r in rows]
        assert len(ids) == len(set(ids)) == 4 + writers * 5 * 2 + 2  # the shared night once
        assert {r.runner for r in rows} >= {f"runner{w:02d}" for w in range(writers)}
        assert len(db.rows(KEY, runner="runner0[0-3]")) == 4 * 10 + 2 * (
            # the shared night belongs to whichever writer landed it first
            sum(
                1
                for r in rows
                if r.session == "night9000" and r.runner in {"runner00", "runner01", "runner02", "runner03"}
            )
            // 2
        )
    assert reads, "the reader read nothing while the writers wrote"


def test_the_views_export_and_page_read_alike_on_both_engines(
    history_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for i, (level, torch) in enumerate([(0.1, "2.13.0")] * 8 + [(0.115, "2.14.1")] * 8):
        f = tmp_path / f"b{i}.json"
        baseline.update(f, KEY, {}, nights([level], torch=torch, first=i))
        files.append(str(f))
    assert cli_main(["history", "import", *files, "--history", history_target, "--project", "team-a"]) == 0
    assert "32 new runs from 16 files" in capsys.readouterr().out
    assert cli_main(["history", "import", *files, "--history", history_target]) == 0
    assert "0 new runs" in capsys.readouterr().out
    argv = ["history", "--history", history_target, "--last", "3", "--threshold-step", "0.05"]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "m-ddp-ws1-fp32-strong  (cpu-hist-1t, 16 nights, 32 runs)" in out
    assert "change point at 2026-11-01T08:00:00 [night008]: +" in out and "torch 2.13.0 -> 2.14.1" in out
    with opened(history_target, readonly=True) as db:
        assert {r.project for r in db.rows()} == {"team-a"} and {r.runner for r in db.rows()} == {None}
    bmf = tmp_path / "bmf.json"
    assert cli_main(["export", "--format", "bmf", "--out", str(bmf), "--history", history_target]) == 0
    doc = json.loads(bmf.read_text())
    assert doc["m-ddp-ws1-fp32-strong"]["latency"]["value"] > 0
    otava = tmp_path / "otava"
    assert cli_main(["export", "--format", "otava", "--out", str(otava), "--history", history_target]) == 0
    (csv_file,) = [p for p in otava.glob("*.csv")]
    assert len(csv_file.read_text().splitlines()) == 1 + 16  # a header and a night per line
    page = tmp_path / "page.html"
    assert cli_main(["history", "--history", history_target, "--html", str(page)]) == 0
    assert "m-ddp-ws1-fp32-strong" in page.read_text()
    capsys.readouterr()
    assert cli_main(["history", "--history", history_target, "--runner", "nobody"]) == 0
    assert "no runs match" in capsys.readouterr().out
    for project, shown in (("team-a", True), ("team-[ab]", True), ("team-b", False)):
        assert cli_main(["history", "--history", history_target, "--project", project]) == 0
        assert ("16 nights, 32 runs" in capsys.readouterr().out) is shown
    assert cli_main(["export", "--format", "bmf", "--out", str(bmf), "--history", history_target,
                     "--project", "team-b"]) == 2  # fmt: skip
    assert cli_main(["export", "--format", "bmf", "--out", str(bmf), files[0], "--runner", "x"]) == 2
    assert "narrow a history" in capsys.readouterr().err


def test_a_sqlite_history_moves_onto_the_server_once(
    history_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "runner.sqlite"
    with history.History(old) as db:
        db.append(nights([0.1, 0.1, 0.1]), KEY, "suite", fleet=history.Fleet("gpu-box-7", "vision"))
    if history_target.endswith("h.sqlite"):
        history_target = str(tmp_path / "other.sqlite")
    for expected in (6, 0):  # idempotent: the second import adds nothing
        assert cli_main(["history", "import", str(old), "--history", history_target]) == 0
        assert f"{expected} new runs from 1 files" in capsys.readouterr().out
    with opened(history_target, readonly=True) as db, history.History(old, readonly=True) as src:
        assert [(r.run_id, r.median_s, r.runner, r.project) for r in db.rows()] == [
            (r.run_id, r.median_s, r.runner, r.project) for r in src.rows()
        ]
        assert {r.runner for r in db.rows()} == {"gpu-box-7"}


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
fs1:/export/home /home nfs4 rw,vers=4.2 0 0
/dev/sdb1 /home/local xfs rw 0 0
lustre@o2ib:/scratch /scratch lustre rw 0 0
"""


def test_a_network_file_system_is_named_and_its_history_written_without_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert history.network_filesystem(Path("/home/alice/h"), MOUNTS) == "nfs4"
    assert history.network_filesystem(Path("/home/local/h"), MOUNTS) is None  # the longer mount point
    assert history.network_filesystem(Path("/scratch/x"), MOUNTS) == "lustre"
    assert history.network_filesystem(Path("/tmp"), MOUNTS) is None
    mounts = tmp_path / "mounts"
    mounts.write_text(f"srv:/vol {tmp_path} nfs rw 0 0\n")
    monkeypatch.setattr(history, "MOUNTS_FILE", mounts)
    with history.History(tmp_path / "h.sqlite") as db:
        assert db._db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert "network file system (nfs)" in db.notes[0]
        assert db.append(nights([0.1]), KEY, "suite") == 2


def test_a_projection_is_kept_with_its_runs_and_drawn_beside_the_measured_efficiency(
    history_target: str, tmp_path: Path
) -> None:
    ws2 = [
        replace(ev, runs=tuple(replace(r, scaling_efficiency=0.85) for r in ev.runs))
        for ev in nights([0.06, 0.06], case_ws=2)
    ]
    case_id = ws2[0].case_id
    batch = history.Batch(ws2[:1], KEY, "suite", projections={case_id: {"efficiency": 0.93, "world_size": 2}})
    odd = history.Batch(ws2[1:], KEY, "suite", projections={case_id: {"efficiency": "0.9; DROP"}})
    with opened(history_target) as db:
        assert db.append_rows(history.appendable([batch, odd], "t", history.Fleet("r"))) == 4
        rows = db.rows(KEY)
    assert sorted(r.projected for r in rows if r.projected is not None) == [0.93, 0.93]
    assert sum(r.projected is None for r in rows) == 2  # a projection of the wrong type: dropped, not trusted
    page = tmp_path / "p.html"
    assert cli_main(["history", "--history", history_target, "--html", str(page)]) == 0
    assert "projected from ws1" in page.read_text()


@pytest.mark.parametrize("column, value", [("record", "not json"), ("record", "[1]"), ("world_size", "two")])
def test_a_hostile_history_file_is_refused_at_import_and_nothing_is_written(
    history_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, value: str
) -> None:
    import sqlite3

    old = tmp_path / "hostile.sqlite"
    with history.History(old) as db:
        db.append(nights([0.1]), KEY, "suite")
    conn = sqlite3.connect(old)
    conn.execute(f"UPDATE runs SET {column} = ?", (value,))  # a column name of the test's own
    conn.commit()
    conn.close()
    if history_target.endswith("h.sqlite"):
        history_target = str(tmp_path / "other.sqlite")
    assert cli_main(["history", "import", str(old), "--history", history_target]) == 2
    assert "of the wrong type or size" in capsys.readouterr().err


def test_a_view_reads_every_night_from_the_index_and_the_last_nights_whole(
    history_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with opened(history_target) as db:
        db.append(nights([0.1] * 6), KEY, "suite", fleet=history.Fleet("r1", "p"))
        db.append(nights([0.1] * 2, first=100), KEY, "suite", fleet=history.Fleet("r2", "p"))
    with opened(history_target, readonly=True) as db:
        (read,) = db.view(recent=3)
    assert [n.session for n in read.nights][-3:] == ["night005", "night100", "night101"]
    assert len(read.nights) == 8 and read.runs == 16 and read.runners == ("r1", "r2")
    assert {r.session for r in read.recent} == {"night005", "night100", "night101"} and len(read.recent) == 6
    monkeypatch.setattr(history, "RECENT_NIGHTS", 2)
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "p.html"
    assert cli_main(["history", "--history", history_target, "--last", "1", "--html", str(page)]) == 0
    assert "(cpu-hist-1t, 8 nights, 16 runs, runners r1, r2)" in capsys.readouterr().out
    assert "the last 2 nights of each case" in page.read_text()
    # an old night's run, far outside the nights read whole, is still checked, and named
    bad = "'x'" if history_target.endswith(".sqlite") else "'NaN'::double precision"
    with opened(history_target) as db:
        sql = f"UPDATE runs SET median_s = {bad} WHERE session = 'night001'"  # the test's own text
        if history_target.endswith(".sqlite"):
            db._db.execute(sql)  # type: ignore[attr-defined]
        else:
            with db._db.transaction():  # type: ignore[attr-defined]
                db._db.execute(sql)  # type: ignore[attr-defined]
    assert cli_main(["history", "--history", history_target]) == 2
    err = capsys.readouterr().err
    assert "has a median step of the wrong type or size" in err and "night001" in err
    # the collector, held off while a view reads, is back after a refusal too; a caller's own
    # pause is left to that caller
    assert gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(history.HistoryError), opened(history_target, readonly=True) as db:
            db.view()
        assert not gc.isenabled()
    finally:
        gc.enable()


# years of nights: the whole blocks' change-point candidates kept in the history itself -----------


def _fill_long(target: str, values: list[float], first: int = 0) -> None:
    """One case of ``len(values)`` nights from night ``first``, one run a night (a real run's
    row, varied per night)."""
    import datetime

    (row, _) = history.appendable(
        [history.Batch(nights([0.1]), KEY, "suite")], target, history.Fleet("r", "p")
    )
    cols = history._COLUMNS
    at = {name: cols.index(name) for name in ("run_id", "session", "recorded_at", "median_s")}
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    rows = []
    for n, value in enumerate(values, start=first):
        fields = list(row)
        fields[at["run_id"]], fields[at["session"]] = f"run{n:05d}", f"night{n:05d}"
        fields[at["recorded_at"]] = (start + datetime.timedelta(hours=n)).isoformat()
        fields[at["median_s"]] = value
        rows.append(tuple(fields))
    with opened(target) as db:
        db.append_rows(rows)


def _forget_memo(target: str) -> None:
    """The history's change-point memo emptied (whole blocks and the series' answers)."""
    with opened(target) as db:
        if target.endswith(".sqlite"):
            db._db.execute("DELETE FROM changepoint_blocks")  # type: ignore[attr-defined]
        else:
            with db._db.transaction():  # type: ignore[attr-defined]
                db._db.execute("DELETE FROM changepoint_blocks")  # type: ignore[attr-defined]


def _blocks_held(target: str) -> dict[str, str]:
    with opened(target) as db:
        cur = db._db.execute("SELECT digest, found FROM changepoint_blocks")  # type: ignore[attr-defined]
        return dict(cur.fetchall())


def test_a_history_keeps_whole_blocks_for_every_viewer_and_a_reader_or_a_forged_entry_changes_nothing(
    history_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from scaleguard.history import changepoints as cp

    n = cp.LONG_SERIES + 700  # blocks at 0, 512, ..., 2560: five whole, the last one growing
    rng = np.random.default_rng(3)
    values = (
        0.1 * np.exp(0.01 * rng.standard_normal(n)) * np.where(np.arange(n) >= 1500, 1.15, 1.0)
    ).tolist()
    _fill_long(history_target, values)
    whole = [d for d, is_whole in cp.block_keys(values) if is_whole]
    assert len(whole) == 5 and len(cp.block_keys(values)) == 6

    searched: list[int] = []
    real = cp._candidates
    monkeypatch.setattr(cp, "_candidates", lambda x, m: searched.append(x.size) or real(x, m))

    def view(memo_dir: str, target: str = history_target) -> str:
        searched.clear()
        assert (
            cli_main(["history", "--history", target, "--last", "1", "--spool-dir", str(tmp_path / memo_dir)])
            == 0
        )
        out = capsys.readouterr().out
        assert "[night01500]: +15.0%" in out
        return out

    reader = history_target
    if not history_target.endswith(".sqlite"):  # a read-only role: views, gives the history nothing
        from tools import local_postgres

        reader = history_target.replace(
            f"//sg:{local_postgres.PASSWORD}@", f"//sg_reader:{local_postgres.READER_PASSWORD}@"
        )
        first = view("reader", reader)
        assert len(searched) == 6 and _blocks_held(history_target) == {}  # every block searched, nothing kept
    first = view("first")  # the first view by a writer's role: every block searched, the whole ones kept
    held = _blocks_held(history_target)
    (place,) = set(held) - set(whole)  # and the series' answer, at the case's one place
    assert sorted(held) == sorted([*whole, place])
    assert view("fresh") == first and searched == []  # a fresh runner: the history's answer
    if reader != history_target:
        assert view("reader2", reader) == first and searched == []  # a reader finds it too
    # one more night: the answer held names the series before it, so a fresh runner searches the
    # growing block again, and its answer takes the case's place for the next one
    _fill_long(history_target, [values[-1]], first=len(values))
    after = view("night")
    assert len(searched) == 1 and set(_blocks_held(history_target)) == set(held)
    assert view("night2") == after and searched == []
    if reader != history_target:
        # a role that may not read the blocks at all: its view searches them, and each refusal,
        # inside the view's pipeline of series (the next case's already asked for), aborts
        # nothing else. A second case, a copy of the first, keeps a series in that pipeline
        columns = (
            ", ".join(history._COLUMNS)
            .replace("run_id", "run_id || 'b'")
            .replace("case_id", "replace(case_id, 'm-', 'n-')")
        )
        with opened(history_target) as db, db._db.transaction():  # type: ignore[attr-defined]
            db._db.execute(f"INSERT INTO runs SELECT {columns} FROM runs")  # type: ignore[attr-defined]
            db._db.execute("REVOKE SELECT ON changepoint_blocks FROM sg_reader")  # type: ignore[attr-defined]
        assert (
            cli_main(["history", "--history", reader, "--last", "1", "--spool-dir", str(tmp_path / "r3")])
            == 0
        )
        out = capsys.readouterr().out
        assert out.count("[night01500]: +15.0%") == 2, out  # (searched by the workers: two long cases)
        with opened(history_target) as db, db._db.transaction():  # type: ignore[attr-defined]
            db._db.execute("DELETE FROM runs WHERE case_id LIKE 'n-%'")  # type: ignore[attr-defined]

    # a forged entry (no writer of ours made it): searched again, the answer unchanged, overwritten
    with opened(history_target) as db:
        sql = "UPDATE changepoint_blocks SET found = '[99999, -4]'"  # the test's own text
        if history_target.endswith(".sqlite"):
            db._db.execute(sql)  # type: ignore[attr-defined]
        else:
            with db._db.transaction():  # type: ignore[attr-defined]
                db._db.execute(sql)  # type: ignore[attr-defined]
    assert view("forged") == after and len(searched) == 6  # the answer's entry forged too
    assert view("forged2") == after and searched == []  # mended by that writer's view


def test_an_import_searches_long_series_ahead_for_every_viewer(
    history_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from scaleguard.history import changepoints as cp

    old = tmp_path / "runner.sqlite"
    _fill_long(str(old), [0.1 * (1.2 if n >= 900 else 1.0) * (1 + 0.01 * (n % 7 - 3)) for n in range(2600)])
    if history_target.endswith("h.sqlite"):
        history_target = str(tmp_path / "into.sqlite")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["history", "import", str(old), "--history", history_target, "--spool-dir", "m"]) == 0
    assert "change points of 1 long series searched ahead" in capsys.readouterr().out
    searched: list[int] = []
    real = cp._candidates
    monkeypatch.setattr(cp, "_candidates", lambda x, m: searched.append(x.size) or real(x, m))
    assert cli_main(["history", "--history", history_target, "--spool-dir", str(tmp_path / "viewer")]) == 0
    assert "+20.0%" in capsys.readouterr().out and searched == []  # its answer, kept by the import


# the change points searched beside the reading (scaleguard.history.analysis) --------------------


def _fill_cases(target: str, cases: int, n: int, start: int = 0) -> None:
    """``cases`` cases of ``n`` nights each (from night ``start``), one run a night, each with
    its own steps."""
    import datetime

    import numpy as np

    (row, _) = history.appendable(
        [history.Batch(nights([0.1]), KEY, "suite")], target, history.Fleet("r", "p")
    )
    cols = history._COLUMNS
    at = {name: cols.index(name) for name in ("run_id", "session", "recorded_at", "median_s", "case_id")}
    epoch = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    rows = []
    for c in range(cases):
        rng = np.random.default_rng(c)
        steps = (
            np.ones(n)
            * np.where(np.arange(n) >= 300 + 97 * c, 1.2, 1.0)
            * np.where(np.arange(n) >= n - 200 - 31 * c, 0.85, 1.0)
        )
        values = 0.1 * np.exp(0.01 * rng.standard_normal(n)) * steps
        for k, value in enumerate(values.tolist(), start=start):
            fields = list(row)
            fields[at["run_id"]], fields[at["session"]] = f"run{c}-{k:05d}", f"night{k:05d}"
            fields[at["recorded_at"]] = (epoch + datetime.timedelta(hours=k)).isoformat()
            fields[at["median_s"]] = value
            fields[at["case_id"]] = f"m{c}-ddp-ws1-fp32-strong"
            rows.append(tuple(fields))
    with opened(target) as db:
        db.append_rows(rows)


def _stop_first_worker(monkeypatch: pytest.MonkeyPatch, signum: int) -> list[int]:
    """The first worker given a case is sent ``signum`` at once; returns its pid (once sent)."""
    import os

    from scaleguard.history import analysis

    hit: list[int] = []
    real = analysis.Search._pump

    def pump(self: analysis.Search, wait_s: float) -> None:
        real(self, wait_s)
        busy = [w for w in self.workers if w.held]
        if busy and not hit:
            hit.append(busy[0].proc.pid)
            os.kill(busy[0].proc.pid, signum)

    monkeypatch.setattr(analysis.Search, "_pump", pump)
    return hit


@pytest.mark.parametrize("fault", ["none", "killed", "stopped"])
def test_change_points_searched_beside_the_reading_are_the_same_with_any_workers_and_faults(
    history_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Six long cases: the answer of the one-process ``history.analyse`` over the same reads, with
    0, 1 or 3 workers; with a worker killed (SIGKILL) or stopped (SIGSTOP, past a short
    deadline) mid-view, its cases are searched by the reader, and no worker is left behind."""
    import signal

    from scaleguard.history import analysis
    from scaleguard.history.memo import ChangePointMemo, viewed

    _fill_cases(history_target, 6, 2600)  # blocks at 0, 512, ..., 2048: four whole, one growing
    with opened(history_target, readonly=True) as db:
        expected = history.analyse(db.view())

    def shape(series: list[history.CaseSeries]) -> list[tuple[str, list[tuple[int, float, float]]]]:
        return [(one.case_id, [(p.index, p.change, p.p_value) for p in one.points]) for one in series]

    assert all(len(one.points) == 2 for one in expected)  # each case's two steps, found
    counts = [0, 1, 3] if fault == "none" else [2]
    if fault != "none":
        monkeypatch.setattr(analysis, "TASK_DEADLINE_S", 1.0)
        hit = _stop_first_worker(monkeypatch, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    started: list[analysis._Worker] = []
    real_start = analysis.Search._start

    def start(self: analysis.Search) -> None:
        real_start(self)
        started.extend(self.workers)

    monkeypatch.setattr(analysis.Search, "_start", start)
    for workers in counts:
        started.clear()
        _forget_memo(history_target)  # each view searches: the last one's answers are not given
        with opened(history_target, readonly=True) as db:
            series, notes = viewed(db, None, tmp_path / f"memo{workers}", workers=workers)
        assert shape(series) == shape(expected), workers
        assert [one.nights.values for one in series] == [one.nights.values for one in expected]
        assert notes == []
        assert len(started) == workers and not any(w.proc.is_alive() for w in started)
    if fault != "none":
        assert hit, "no worker was given a case"
    # the memo the workers filled is the reader's: a second view searches the growing blocks alone
    memo = ChangePointMemo(tmp_path / f"memo{counts[-1]}")
    with opened(history_target, readonly=True) as db:
        for read in db.view():
            hits = memo.lookup(db, history.columns_of(read.nights)[1])
            assert len(hits) == 5  # every block's candidates, sent back by whoever searched it
    memo.close()


def test_a_view_that_changes_nothing_takes_each_long_series_answer_from_the_memo(
    history_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long series' change points are kept whole in the runner's memo, by its values and every
    setting: the same view again searches nothing and answers the same; a night more, or an
    entry no writer of ours made, is searched again."""
    import sqlite3

    from scaleguard.history import analysis
    from scaleguard.history.memo import NAME, SERIES_PREFIX, viewed

    _fill_cases(history_target, 3, 2600)
    searched: list[int] = []
    real = analysis.search

    def counted(values: object, magnitude: float, hits: dict[str, list[int]]) -> analysis.Found:
        searched.append(1)
        return real(values, magnitude, hits)  # type: ignore[arg-type]

    monkeypatch.setattr(analysis, "search", counted)

    def view() -> list[tuple[str, list[tuple[int, float, float]]]]:
        searched.clear()
        with opened(history_target, readonly=True) as db:
            series, notes = viewed(db, None, tmp_path / "memo", workers=0)
        assert notes == []
        return [(one.case_id, [(p.index, p.change, p.p_value) for p in one.points]) for one in series]

    first = view()
    assert len(searched) == 3 and all(len(points) == 2 for _, points in first)
    assert view() == first and searched == []  # nothing new: every answer kept
    # a forged answer (no writer of ours made it): searched again, the same answer, overwritten
    memo_file = sqlite3.connect(tmp_path / "memo" / NAME)
    with memo_file:
        forged = "UPDATE blocks SET found = '[[99999, 0.5, 0.0]]' WHERE digest LIKE ?"
        memo_file.execute(forged, (SERIES_PREFIX + "%",))
    memo_file.close()
    assert view() == first and searched == []  # the history's answers, where the file's are refused
    _forget_memo(history_target)  # the runner's file alone
    assert view() == first and len(searched) == 3
    assert view() == first and searched == []
    # one more night in one case: that case alone searched again
    _fill_cases(history_target, 1, 1, start=2600)
    after = view()
    assert len(searched) == 1 and after[1:] == first[1:]
