from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from scaleguard import baseline
from scaleguard.baseline import BaselineError, BaselineFile, CaseRecord
from scaleguard.cli import main as cli_main
from scaleguard.compare import Status, Thresholds, judge, thresholds_for
from scaleguard.stats import StepSummary


def record(
    case_id: str = "m-ddp-ws2-fp32-strong",
    median: float = 0.1,
    spread: float = 0.002,
    eff: float | None = 0.9,
    mem: int = 2**30,
    torch: str = "2.11.0",
    ws: int = 2,
    seed: int = 0,
    recorded_at: str = "2026-01-01T00:00:00",
    **config: object,
) -> CaseRecord:
    rng = np.random.default_rng(seed)
    steps = tuple(float(x) for x in rng.normal(median, spread, 40))
    cfg = {"model": "m", "world_size": ws, "global_batch": 64} | config
    return CaseRecord(
        case_id=case_id,
        group_id="m-ddp-fp32-strong",
        world_size=ws,
        config=cfg,
        step_s=steps,
        summary=StepSummary.of(steps),
        samples_per_s=64 / median,
        speedup=None if eff is None else eff * ws,
        scaling_efficiency=eff,
        peak_mem_bytes=mem,
        versions={"torch": torch},
        recorded_at=recorded_at,
    )


def test_identical_distribution_is_ok() -> None:
    verdict = judge(record(seed=1), record(seed=2), Thresholds())
    assert verdict.status is Status.OK, verdict.story


def test_real_slowdown_is_regressed_with_the_story() -> None:
    verdict = judge(record(median=0.107, torch="2.12.0", seed=1), record(), Thresholds())
    assert verdict.status is Status.REGRESSED
    assert re.match(
        r"m-ddp-ws2-fp32-strong REGRESSED: step 10\d\.\d ms vs (99|100)\.\d ms \(\+\d\.\d%, p=", verdict.story
    )
    assert (
        "torch 2.11.0 -> 2.12.0" in verdict.story and verdict.p_value is not None and verdict.p_value < 1e-3
    )


def test_small_slowdown_under_threshold_is_ok_even_if_significant() -> None:
    assert judge(record(median=0.102, seed=1), record(), Thresholds()).status is Status.OK


def test_faster_is_improved() -> None:
    assert judge(record(median=0.09, seed=1), record(), Thresholds()).status is Status.IMPROVED


def test_too_noisy_to_judge_is_noisy() -> None:
    verdict = judge(record(spread=0.04, seed=1), record(spread=0.04), Thresholds())
    assert verdict.status is Status.NOISY and "cannot judge" in verdict.story


def test_wide_spread_is_noisy_even_for_a_large_shift_but_memory_still_counts() -> None:
    noisy_new, noisy_old = record(median=0.13, spread=0.01, seed=1), record(spread=0.01)
    verdict = judge(noisy_new, noisy_old, Thresholds())
    assert verdict.status is Status.NOISY and "IQR/median" in verdict.story
    bigger = CaseRecord(**{**noisy_new.__dict__, "peak_mem_bytes": 2 * 2**30})
    assert judge(bigger, noisy_old, Thresholds()).status is Status.REGRESSED


def test_efficiency_drop_with_ws1_unchanged_is_a_scaling_regression() -> None:
    verdict = judge(
        record(median=0.104, eff=0.84, seed=1), record(eff=0.91), Thresholds(), ws1_status=Status.OK
    )
    assert verdict.status is Status.REGRESSED and verdict.scaling_regression
    assert "efficiency 0.91 -> 0.84 (scaling regression: ws1 unchanged)" in verdict.story


def test_memory_growth_is_a_regression() -> None:
    verdict = judge(record(mem=int(1.2 * 2**30), seed=1), record(), Thresholds())
    assert verdict.status is Status.REGRESSED and "peak memory 1024 -> 1229 MiB" in verdict.story


def test_throttled_slowdown_is_never_regressed() -> None:
    slow = record(median=0.12, seed=1)
    slow = CaseRecord(**{**slow.__dict__, "throttled": True})
    assert judge(slow, record(), Thresholds()).status is Status.NOISY


def test_no_baseline_or_other_config_is_new_with_reason() -> None:
    assert judge(record(), None, Thresholds(), new_reason="because").story.endswith("NEW: because")
    verdict = judge(record(global_batch=128), record(), Thresholds())
    assert verdict.status is Status.NEW and "global_batch 64 -> 128" in verdict.story


def test_per_case_threshold_overrides() -> None:
    lines = ["*-ws2-* step=0.2", "m-ddp-ws2-fp32-strong efficiency=0.1"]
    chosen = thresholds_for("m-ddp-ws2-fp32-strong", Thresholds(), lines)
    assert chosen.efficiency == 0.1 and chosen.step == 0.05  # last matching line wins, from defaults
    assert thresholds_for("m-ddp-ws4-fp32-strong", Thresholds(), lines).step == 0.05
    with pytest.raises(ValueError, match="unknown threshold"):
        Thresholds.parse_overrides(Thresholds(), "speed=1")


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "cpu-x-1t.json"
    BaselineFile(path, "cpu-x-1t", {"device": "cpu"}).merged(
        [record(), record(torch="2.12.0", recorded_at="2026-02-01")]
    ).save()
    return path


def test_baseline_round_trip_merge_and_torch_pick(tmp_path: Path) -> None:
    path = _file(tmp_path)
    loaded = baseline.load(path)
    assert loaded is not None
    assert loaded.entry("m-ddp-ws2-fp32-strong", None).torch == "2.12.0"  # newest recorded
    assert loaded.entry("m-ddp-ws2-fp32-strong", "2.11.0").torch == "2.11.0"
    assert loaded.entry("m-ddp-ws2-fp32-strong", "1.0") is None
    merged = loaded.merged([record(case_id="other")])
    assert set(merged.cases) == {"m-ddp-ws2-fp32-strong", "other"}
    assert set(merged.cases["m-ddp-ws2-fp32-strong"]) == {"2.11.0", "2.12.0"}  # untouched


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: t[: len(t) // 2], "corrupt or truncated JSON"),
        (lambda t: "[1, 2]", "expected a JSON object"),
        (lambda t: t.replace('"schema_version": 1', '"schema_version": 7'), "newer scaleguard: upgrade"),
        (
            lambda t: t.replace('"schema_version": 1', '"schema_version": 0'),
            "re-record with --perf-update-baselines",
        ),
        (lambda t: t.replace('"step_s"', '"steps_s"'), "malformed entry"),
    ],
)
def test_bad_baseline_files_are_clear_errors_and_untouched(tmp_path: Path, damage, message: str) -> None:
    path = _file(tmp_path)
    path.write_text(damage(path.read_text()))
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=message) as info:
        baseline.load(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before


def test_missing_baseline_is_none(tmp_path: Path) -> None:
    assert baseline.load(tmp_path / "nope.json") is None


def test_cli_compare_writes_table_markdown_plot_and_gates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.json"
    BaselineFile(old, "k", {}).merged(
        [record(ws=1, case_id="m-ddp-ws1-fp32-strong", eff=None), record(eff=0.91)]
    ).save()
    new = tmp_path / "new.json"
    BaselineFile(new, "k", {}).merged(
        [
            record(ws=1, case_id="m-ddp-ws1-fp32-strong", eff=None, seed=3, torch="2.12.0"),
            record(median=0.12, eff=0.8, seed=4, torch="2.12.0"),
        ]
    ).save()
    md, png = tmp_path / "r.md", tmp_path / "r.png"
    code = cli_main(["compare", str(old), str(new), "--markdown", str(md), "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 1
    assert "REGRESSED" in out and "scaling regression: ws1 unchanged" in out
    assert "| m-ddp-ws2-fp32-strong |" in md.read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli_main(["compare", str(old), str(old)]) == 0
    (tmp_path / "bad.json").write_text("{")
    assert cli_main(["compare", str(old), str(tmp_path / "bad.json")]) == 2
