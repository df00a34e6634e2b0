"""Issue 39, item 9: how fast each history engine appends a night and serves a view.

    python benchmarks/history_engines.py --nights 4000 --cases 50

Starts a throwaway PostgreSQL (tools/local_postgres.py) and an SQLite file; appends one night
of ``--cases`` runs (rows made by ``appendable``, as a session makes them) and times it; then
fills both with ``--nights`` x ``--cases`` runs (a template row varied per night: the record
column holds a real run) and times ``scaleguard history`` (the terminal view with change points)
and ``scaleguard history --html`` over one case and over everything, each in a fresh process
(its peak RSS from ``resource``, and its largest search worker's, ``scaleguard.history.analysis``):
all cases first (every block searched; the whole ones given to
the history), then from a runner with an empty memo of its own, again, after one more night
appended as a session appends it (which then searches ahead, timed), after one more night
appended with nobody searching ahead (the view searches each case's last block again), and the
page. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

START = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.unit.test_history import nights  # noqa: E402
from tools import local_postgres  # noqa: E402

from scaleguard.history import database as history  # noqa: E402
from scaleguard.history.memo import search_ahead  # noqa: E402
from scaleguard.history.store import open_history  # noqa: E402
from scaleguard.history.target import target_of  # noqa: E402

VIEW = """
import resource, sys, time
sys.argv = ["scaleguard"] + sys.argv[1:]
t0 = time.perf_counter()
from scaleguard.cli import main
code = main(sys.argv[1:])
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest search worker
print("WALL", time.perf_counter() - t0, "RSS", rss, "CODE", code, "CHILD", child, file=sys.stderr)
"""


def night_rows(cases: int, night: int) -> list[tuple[object, ...]]:
    """One night of ``cases`` runs, as a session appends them (``appendable``)."""
    out = []
    for c in range(cases):
        (ev,) = nights([0.1], first=night * 100 + c)
        batch = [history.Batch([ev], "cpu-bench-1t", "suite")]
        (row, _) = history.appendable(batch, "b", history.Fleet("b", "b"))
        fields = list(row)
        fields[0], fields[1] = f"{fields[0]}-c{c}", f"m{c:02d}-ddp-ws1-fp32-strong"
        out.append(tuple(fields))
    return out


def medians(nights_n: int, cases: int) -> np.ndarray:
    """Each case's own nightly medians (nights x cases): 1.5 % noise from a seed of its own (no
    two cases share a block, so the change-point memo saves nothing between them), one outlier
    night in 200, a +5 % step halfway in every case and a +15 % step at a case's own night in
    every fifth."""
    import numpy as np

    out = np.empty((nights_n, cases))
    for c in range(cases):
        rng = np.random.default_rng(1000 + c)
        x = 0.1 * (1 + 0.015 * rng.standard_normal(nights_n))
        x[rng.random(nights_n) < 0.005] *= 1.4
        x[nights_n // 2 :] *= 1.05
        if c % 5 == 0:
            x[int(rng.integers(nights_n // 10, nights_n - 50)) :] *= 1.15
        out[:, c] = x
    return out


def fill(target: str, nights_n: int, cases: int, first: int = 0) -> None:
    template = night_rows(1, 0)[0]
    cols = history._COLUMNS
    i_run, i_case, i_sess, i_time, i_med = (
        cols.index(n) for n in ("run_id", "case_id", "session", "recorded_at", "median_s")
    )
    values = medians(first + nights_n, cases)
    with open_history(target_of(target)) as db:
        batch: list[tuple[object, ...]] = []
        for n in range(first, first + nights_n):
            for c in range(cases):
                row = list(template)
                row[i_run] = f"n{n:05d}-c{c:02d}"
                row[i_case] = f"m{c:02d}-ddp-ws1-fp32-strong"
                row[i_sess] = f"night{n:05d}"
                row[i_time] = (START + datetime.timedelta(hours=n)).isoformat()
                row[i_med] = float(values[n, c])
                batch.append(tuple(row))
            if len(batch) >= 20_000:
                db.append_rows(batch)
                batch = []
        if batch:
            db.append_rows(batch)


def view(target: str, memo_dir: Path, *args: str) -> tuple[float, float, int, float]:
    done = subprocess.run(
        [sys.executable, "-c", VIEW, "history", "--history", target, "--last", "3",
         "--spool-dir", str(memo_dir), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'src'}", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("WALL")]
    if not line:
        raise SystemExit(done.stderr[-2000:])
    parts = line[-1].split()
    return float(parts[1]), int(parts[3]) / 1024, int(parts[5]), int(parts[7]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nights", type=int, default=4000)
    parser.add_argument("--cases", type=int, default=50)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaleguard-pg-bench-"))
    work.chmod(0o755)  # the server runs as the postgres user
    local_postgres.start(work / "pg")
    try:
        targets = {"SQLite": str(work / "h.sqlite"), "PostgreSQL": local_postgres.dsn(work / "pg")}
        print(
            f"| engine | append a night of {args.cases} runs | fill {args.nights} x {args.cases} | "
            "history, one case | history --html, one case | history, all: first view | "
            "all: a fresh runner's first | all: again | a session's night: searched ahead | "
            "all: after it | all: after a night nobody searched ahead | history --html, all |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, target in targets.items():
            appends = []
            for n in range(5):
                rows = night_rows(args.cases, 100 + n)
                with open_history(target_of(target)) as db:
                    t0 = time.perf_counter()
                    db.append_rows(rows)
                    appends.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fill(target, args.nights, args.cases)
            filled = time.perf_counter() - t0
            if name == "PostgreSQL":
                # what autovacuum does within a minute of a big insert (PostgreSQL 13+ vacuums on
                # inserts): the visibility map lets the views' index-only scans skip the table.
                # Right after the fill, before it, the all-cases view took 6.3 s in-process
                import psycopg

                with psycopg.connect(target, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE runs")
                    # and writes its dirty pages out, as a server up for a while has: a checkpoint
                    # of the gigabyte just filled, running beside a timed view, cost it a second
                admin = target.replace("//sg:", "//postgres:").rsplit("/", 1)[0] + "/postgres"
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute("CHECKPOINT")  # a superuser's (as tests/conftest.py connects)
            cells = []
            page = str(work / f"{name}.html")
            # (the runner's memo directory, arguments): "first" is the first view of all, which
            # searches every block and gives the whole ones to the history; "fresh" a runner
            # that never viewed it (an empty memo of its own) after that. A view that changes
            # nothing is timed 3 times (the range shown), a first one once
            views = (
                ("one", ["--case", "m07-*"], 1),
                ("one", ["--case", "m07-*", "--html", page], 1),
                ("first", [], 1),
                ("fresh", [], 1),
                ("fresh", [], 3),
                ("fresh", "session", 0),
                ("fresh", [], 1),
                ("fresh", "bare", 0),
                ("fresh", [], 1),
                ("fresh", ["--html", page], 3),
            )
            ahead = ""
            for memo_name, extra, repeat in views:
                if extra in ("session", "bare"):  # the next night: each case's last block is new
                    night = 10**6 + len(ahead)
                    with open_history(target_of(target)) as db:
                        db.append_rows(night_rows(args.cases, night))
                        if extra == "session":  # as a session does after its append (suite.py)
                            t0 = time.perf_counter()
                            long = search_ahead(db, None, work / f"memo-{name}-session", "cpu-bench-1t",
                                                "m00-ddp-ws1-fp32-strong")  # fmt: skip
                            ahead = f"{time.perf_counter() - t0:.2f} s ({long} series)"
                    continue
                timed = [view(target, work / f"memo-{name}-{memo_name}", *extra) for _ in range(repeat)]
                walls = sorted(t[0] for t in timed)
                rss, codes = max(t[1] for t in timed), {t[2] for t in timed}
                child = max(t[3] for t in timed)
                span = f"{walls[0]:.2f}" + (f"-{walls[-1]:.2f}" if repeat > 1 else "")
                worker = f" (+ worker {child:.0f})" if child > 0 else ""
                cells.append(
                    f"{span} s, {rss:.0f} MiB{worker}" + ("" if codes == {0} else f" (exit {codes})")
                )
            appended = f"{min(appends) * 1e3:.0f}-{max(appends) * 1e3:.0f} ms (5 nights)"
            cells.insert(5, ahead)
            print(f"| {name} | {appended} | {filled:.0f} s | " + " | ".join(cells) + " |", flush=True)
    finally:
        local_postgres.stop(work / "pg")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
