"""One option table: pytest's options, their ini twins, the CLI's shared flags and the doc all
come from ``scaleguard.options.OPTIONS``, and the one reader reads every one of them."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from scaleguard import options
from scaleguard.cli import build_parser
from scaleguard.config import PerfConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"


def test_the_doc_is_made_from_the_table() -> None:
    text = DOC.read_text()
    assert options.document_with_table(text) == text, (
        "docs/options.md differs from scaleguard.options.OPTIONS: run "
        "`python -m scaleguard.options --write docs/options.md`"
    )


def test_the_doc_check_sees_a_hand_edit() -> None:
    edited = DOC.read_text().replace("| auto | where cases run", "| cpu | where cases run")
    assert options.document_with_table(edited) != edited


def test_every_option_is_a_pytest_option_and_an_ini_twin(pytester: pytest.Pytester) -> None:
    out = pytester.runpytest_subprocess("--help").stdout.str()
    for opt in options.OPTIONS:
        if opt.kind != "ini-lines":
            assert opt.flag in out, opt.flag
        assert f"  {opt.dest} (" in out, opt.dest


def test_the_reader_reads_every_option_and_only_those(monkeypatch: pytest.MonkeyPatch) -> None:
    from scaleguard.schedule import slurm

    monkeypatch.setattr(slurm, "missing_commands", lambda: [])  # --perf-slurm-* are read with it on
    asked: set[str] = set()

    def text(name: str) -> str | None:
        asked.add(name)
        return None

    def flag(name: str) -> bool:
        asked.add(name)
        return name == "slurm"

    def lines(name: str) -> list[str]:
        asked.add(name)
        return []

    PerfConfig.read(text, flag, lines)
    assert asked == set(options.BY_NAME)


def _flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cmd = sub.choices[command]
    return {s: a.help or "" for a in cmd._actions for s in a.option_strings}


@pytest.mark.parametrize("command", ["compare", "ingest", "ab"])
def test_the_cli_shares_the_tables_flags_and_words(command: str) -> None:
    flags = _flags(build_parser(), command)
    shared = [(opt, flag) for opt in options.OPTIONS for cmd, flag in opt.cli if cmd == command]
    assert shared
    for opt, flag in shared:
        assert flags[flag] == opt.help_with_default


def test_the_table_has_one_entry_per_name_and_cli_flag() -> None:
    names = [o.name for o in options.OPTIONS]
    assert len(names) == len(set(names))
    pairs = [pair for o in options.OPTIONS for pair in o.cli]
    assert len(pairs) == len(set(pairs))


def test_the_table_prints_and_writes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scaleguard.options"], capture_output=True, text=True, check=True
    ).stdout
    assert out == options.markdown_table()
    doc = tmp_path / "options.md"
    doc.write_text(f"# x\n{options.BEGIN}\nstale\n{options.END}\ntail\n")
    assert options.main(["--write", str(doc)]) == 0
    assert "stale" not in doc.read_text() and doc.read_text().endswith("tail\n")
    (tmp_path / "bad.md").write_text("no markers")
    with pytest.raises(ValueError, match="no block between"):
        options.main(["--write", str(tmp_path / "bad.md")])
