"""``scaleguard compare`` / ``hardware-key`` as CI calls them: exit 0 / 1 (REGRESSED) / 2 (bad
input), never a traceback for a bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main
from scaleguard.evidence import baseline
from tests.unit.test_verdicts import case, run, runs_of, spread_runs


def write(path: Path, key: str, entries: list) -> Path:
    baseline.update(path, key, {}, entries)
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    old = write(
        tmp_path / "old.json",
        "k",
        [case(spread_runs(6, 0.1, 0.004, seed=1), ws=1),
         case([r.__class__(**{**r.__dict__, "scaling_efficiency": 0.91}) for r in spread_runs(6, 0.1, 0.004, seed=2)])],
    )  # fmt: skip
    new = write(
        tmp_path / "new.json",
        "k",
        [case(spread_runs(3, 0.1, 0.004, seed=3), ws=1, torch="2.12.0"),
         case([run(0.13, index=i, seed=i, eff=0.7) for i in range(3)], torch="2.12.0")],
    )  # fmt: skip
    return old, new


def test_compare_writes_table_markdown_plot_and_gates(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = files
    md, png = tmp_path / "r.md", tmp_path / "r.png"
    code = cli_main(["compare", str(old), str(new), "--markdown", str(md), "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "REGRESSED" in out
        and "scaling regression: ws1 unchanged" in out
        and "3 runs vs 6 baseline runs" in out
    )
    assert "| m-ddp-ws2-fp32-strong |" in md.read_text() and "6/3" in md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli_main(["compare", str(old), str(old)]) == 0


@pytest.mark.parametrize(
    "content",
    [b"{", b"\xff\xfe\x00", b'{"schema_version": 2, "cases": null}', b'{"schema_version": 9}', b"[]", b""],
)
def test_bad_input_is_exit_2_with_the_file_named(
    files: tuple[Path, Path], tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert cli_main(["compare", str(files[0]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err


def test_missing_file_and_bad_thresholds_are_exit_2(files: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = files
    assert cli_main(["compare", str(old), str(tmp_path / "nope.json")]) == 2
    for value in ("nan", "-1", "0", "inf"):
        assert cli_main(["compare", str(old), str(new), "--threshold-step", value]) == 2


def test_saved_run_with_wrong_typed_runs_is_exit_2(files: tuple[Path, Path], tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    saved.write_text(
        json.dumps(
            {
                "machine_info": {"scaleguard": {"hardware_key": "k"}},
                "benchmarks": [{"extra_info": {"case_id": "m", "group_id": "g", "world_size": 1,
                                               "config": {}, "runs": [{"step_s": "abc"}]}}],
            }
        )
    )  # fmt: skip
    assert cli_main(["compare", str(files[0]), str(saved)]) == 2


def test_different_hardware_is_refused_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write(tmp_path / "a.json", "cpu-a-1t", [case(runs_of([0.1, 0.1]))])
    b = write(tmp_path / "b.json", "cuda-b-x1", [case(runs_of([0.1, 0.1]))])
    assert cli_main(["compare", str(a), str(b)]) == 2
    assert "not comparable" in capsys.readouterr().err
    assert cli_main(["compare", str(a), str(b), "--allow-cross-hardware"]) == 0
    assert "comparing across hardware" in capsys.readouterr().out


def test_hardware_key_prints_this_machines_file_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["hardware-key", "--device", "cpu", "--threads-per-rank", "1"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("cpu-") and key.endswith("-1t")
