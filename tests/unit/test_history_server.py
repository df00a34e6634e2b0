"""The server history's faults, on a real PostgreSQL of its own (``tools/local_postgres.py``),
stopped and started by the tests: a night is never lost nor doubled when the server is away at
the start or goes away mid-append; the spool is sent first and exactly once; a read-only role
views and exports and is told it may not write; the password is in no output, file or page."""

from __future__ import annotations

from pathlib import Path

import pytest
from tools import local_postgres

from scaleguard.cli import main as cli_main
from scaleguard.history import database as history
from scaleguard.history.store import deliver, open_history, spool_path
from scaleguard.history.target import ServerDsn, target_of
from tests.unit.test_history import KEY, nights

pytestmark = pytest.mark.timeout(300)
SECRET = local_postgres.PASSWORD


def count(dsn: str) -> int:
    with open_history(target_of(dsn), readonly=True) as db:
        return len(db.rows())


def rows_of(levels: list[float], first: int) -> list[tuple[object, ...]]:
    batches = [history.Batch(nights(levels, first=first), KEY, "suite")]
    return history.appendable(batches, "test", history.Fleet("runner-a", "proj"))


def test_a_night_is_spooled_while_the_server_is_away_and_sent_once(
    own_postgres: Path, tmp_path: Path
) -> None:
    dsn = local_postgres.dsn(own_postgres)
    target = target_of(dsn)
    assert isinstance(target, ServerDsn)
    first = deliver(target, rows_of([0.1, 0.1], 0), tmp_path)
    assert (first.appended, first.spooled) == (4, 0) and count(dsn) == 4
    local_postgres.stop(own_postgres)
    away = deliver(target, rows_of([0.1, 0.1, 0.1], 10), tmp_path)  # unreachable at the start
    assert (away.appended, away.spooled) == (0, 6) and "6 runs kept in" in away.line
    assert SECRET not in away.line and "***" in away.line
    again = deliver(target, rows_of([0.1], 10) + rows_of([0.1], 20), tmp_path)  # one run already spooled
    assert (again.appended, again.spooled) == (0, 2)  # night 10's runs kept once, night 20's added
    with history.History(spool_path(tmp_path, target), readonly=True) as spool:
        assert len(spool.raw_rows()) == 8
    local_postgres.start(own_postgres)
    back = deliver(target, rows_of([0.1], 30), tmp_path)
    assert (back.appended, back.sent, back.spooled) == (2, 8, 0)
    assert "(and 8 runs an earlier session had spooled)" in back.line
    assert count(dsn) == 4 + 8 + 2
    with history.History(spool_path(tmp_path, target), readonly=True) as spool:
        assert spool.raw_rows() == []  # sent, so emptied: the next session sends nothing twice
    assert deliver(target, rows_of([0.1], 30), tmp_path).appended == 0 and count(dsn) == 14


def test_a_server_gone_mid_append_rolls_back_and_the_runs_wait_in_the_spool(
    own_postgres: Path, tmp_path: Path
) -> None:
    import psycopg

    dsn = local_postgres.dsn(own_postgres)
    target = target_of(dsn)
    assert isinstance(target, ServerDsn)
    assert deliver(target, rows_of([0.1], 0), tmp_path).appended == 2
    # every insert now waits 3 s: the server is stopped while the append's transaction is open
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$"
        )
        conn.execute("CREATE TRIGGER slow BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION slow()")
    import threading

    stopper = threading.Timer(1.0, lambda: local_postgres._as_postgres(
        [local_postgres._bin("pg_ctl"), "-D", str(own_postgres / "data"), "-m", "immediate", "stop"]
    ))  # fmt: skip
    stopper.start()
    gone = deliver(target, rows_of([0.1, 0.1], 10), tmp_path)
    stopper.join()
    assert (gone.appended, gone.spooled) == (0, 4) and "not reached" in gone.line
    local_postgres.stop(own_postgres)
    local_postgres.start(own_postgres)
    assert count(dsn) == 2  # the interrupted transaction left nothing
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TRIGGER slow ON runs")
    back = deliver(target, rows_of([0.1], 20), tmp_path)
    assert (back.appended, back.sent) == (2, 4) and count(dsn) == 2 + 4 + 2


def test_a_read_only_role_views_and_exports_but_may_not_write(
    own_postgres: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = local_postgres.dsn(own_postgres)
    reader = local_postgres.dsn(own_postgres, reader=True)
    with open_history(target_of(writer)) as db:
        db.append(nights([0.1, 0.1]), KEY, "suite")
    assert cli_main(["history", "--history", reader]) == 0
    assert "2 nights, 4 runs" in capsys.readouterr().out
    out = tmp_path / "o"
    assert cli_main(["export", "--format", "otava", "--out", str(out), "--history", reader]) == 0
    capsys.readouterr()
    f = tmp_path / "b.json"
    from scaleguard.evidence import baseline

    baseline.update(f, KEY, {}, nights([0.2], first=50))
    assert cli_main(["history", "import", str(f), "--history", reader]) == 2
    err = capsys.readouterr().err
    assert "the role may not write here" in err and "nothing was written" in err
    assert local_postgres.READER_PASSWORD not in err and count(writer) == 4


def test_history_send_delivers_a_spool_by_hand_once(
    own_postgres: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = local_postgres.dsn(own_postgres)
    target = target_of(dsn)
    assert isinstance(target, ServerDsn)
    local_postgres.stop(own_postgres)
    assert deliver(target, rows_of([0.1, 0.1, 0.1], 0), tmp_path).spooled == 6
    argv = ["history", "send", "--history", dsn, "--spool-dir", str(tmp_path)]
    assert cli_main(argv) == 2  # still away: said, nothing lost
    said = capsys.readouterr().err
    assert "cannot connect" in said and SECRET not in said
    local_postgres.start(own_postgres)
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "6 new runs sent from" in out and SECRET not in out and count(dsn) == 6
    assert cli_main(argv) == 0 and "0 new runs sent" in capsys.readouterr().out and count(dsn) == 6
    assert cli_main(["history", "send", "--history", str(tmp_path / "h.sqlite")]) == 2
    assert "give --history postgresql://" in capsys.readouterr().err
