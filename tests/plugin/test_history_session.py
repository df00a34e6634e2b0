"""A session whose server history is away: it measures, judges and keeps its night in the
spool; the next session that reaches the server sends it first. The DSN's password is in no
line, saved file or page (a real PostgreSQL of the test's own, stopped and started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tools import local_postgres

from scaleguard.cli import main as cli_main
from scaleguard.history import changepoints
from scaleguard.history.changepoints import LONG_SERIES
from scaleguard.history.database import _COLUMNS, History
from scaleguard.history.store import open_history
from scaleguard.history.target import target_of

pytestmark = pytest.mark.timeout(300)


def test_a_session_keeps_its_night_while_the_server_is_away_and_no_output_shows_the_password(
    own_postgres: Path, suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = local_postgres.dsn(own_postgres)
    monkeypatch.setenv("SCALEGUARD_HISTORY", dsn)  # as CI passes a secret
    args = ["--perf-models", "transformer_tiny", "--perf-modes", "single", "--perf-scaling", "strong",
            "--perf-steps", "4", "--perf-warmup", "2", "--perf-no-load-check", "--perf-confirm", "0",
            "--benchmark-save=night", f"--benchmark-storage=file://{suite.path / 'bench'}",
            "--perf-project", "vision"]  # fmt: skip
    local_postgres.stop(own_postgres)
    away = suite.runpytest_subprocess(*args)
    away.assert_outcomes(passed=1)  # measured and judged without the server
    away.stdout.fnmatch_lines(["*history postgresql://sg:***@127.0.0.1:*/sg not reached*1 runs kept in*"])
    local_postgres.start(own_postgres)
    # years of earlier nights of the same case on the server: the session that appends its night
    # searches the change points ahead, so the next viewer (a fresh runner) searches nothing
    with History(next((suite.path / ".scaleguard").glob("history-spool-*.sqlite"))) as spool:
        (spooled,) = spool.raw_rows()
    years = LONG_SERIES + 60
    with open_history(target_of(dsn)) as db:
        db.append_rows([_earlier(spooled, n, years) for n in range(years)])
    back = suite.runpytest_subprocess(*args)
    back.assert_outcomes(passed=1)
    back.stdout.fnmatch_lines(
        [
            "*history postgresql://sg:***@*: 1 runs appended (and 1 runs an earlier session*"
            "; change points of 1 long series searched ahead*"
        ]
    )
    searched: list[int] = []
    real = changepoints._candidates
    monkeypatch.setattr(changepoints, "_candidates", lambda x, m: searched.append(x.size) or real(x, m))
    assert cli_main(["history", "--history", dsn, "--spool-dir", str(suite.path / "fresh")]) == 0
    assert searched == []  # every block and the answer: the session's
    with open_history(target_of(dsn), readonly=True) as db:
        rows = [r for r in db.rows() if not r.session.startswith("earlier-")]
    assert len(rows) == 2 and len({r.session for r in rows}) == 2
    assert {r.project for r in rows} == {"vision"} and all(r.runner for r in rows)
    page = suite.path / "page.html"
    assert cli_main(["history", "--history", dsn, "--html", str(page)]) == 0
    shown = "\n".join(away.outlines + away.errlines + back.outlines + back.errlines) + page.read_text()
    shown += "".join(p.read_text() for p in (suite.path / "bench").rglob("*.json"))
    shown += "".join(p.read_text(errors="replace") for p in suite.path.rglob("*.json"))
    assert local_postgres.PASSWORD not in shown
    saved = json.loads(next((suite.path / "bench").rglob("*.json")).read_text())
    assert local_postgres.PASSWORD not in json.dumps(saved)


def _earlier(row: tuple[object, ...], n: int, of: int) -> tuple[object, ...]:
    """``row`` as night ``n`` of ``of`` nights before it (a day apart), its step 10 % slower for
    the first half of them."""
    import datetime

    fields = list(row)
    at = {name: _COLUMNS.index(name) for name in ("run_id", "session", "recorded_at", "median_s")}
    when = datetime.datetime.fromisoformat(str(row[at["recorded_at"]])) - datetime.timedelta(days=of - n)
    fields[at["run_id"]], fields[at["session"]] = f"earlier{n}", f"earlier-night{n}"
    fields[at["recorded_at"]] = when.isoformat()
    fields[at["median_s"]] = float(row[at["median_s"]]) * (1.1 if n < of // 2 else 1.0)  # type: ignore[arg-type]
    return tuple(fields)
