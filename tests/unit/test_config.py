"""The one reader of a session's choices: ``PerfConfig.read``, used by the plugin and by
``cli.py`` alike."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from scaleguard import cli
from scaleguard.config import ConfigError, PerfConfig
from scaleguard.evidence.verdict import Thresholds, ThresholdSettings


def read(texts: dict[str, str] | None = None, flags: tuple[str, ...] = (), **lines: list[str]) -> PerfConfig:
    texts = texts or {}
    return PerfConfig.read(
        texts.get, lambda name: name in flags, lambda name: lines.get(name.replace("-", "_"), [])
    )


def test_nothing_given_is_the_default_and_the_config_is_frozen() -> None:
    config = read()
    assert config == PerfConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.repeats = 3  # type: ignore[misc]


def test_every_kind_of_value_is_read_once_into_its_type() -> None:
    config = read(
        {
            "world-sizes": "1,2",
            "modes": "ddp,fsdp",
            "steps": "20",
            "repeats": "3",
            "confirm": "0",
            "timeout": "12.5",
            "threshold-step": "0.05",
            "peak-tflops": "989",
            "baselines": "/tmp/b",
            "accept-reason": "new cuDNN",
            "ab-pairs": "0",
        },
        flags=("update-baselines", "no-load-check", "no-history"),
        accept=["resnet50-*"],
        case_thresholds=["resnet50-* step=0.08", ""],
    )
    assert config.matrix.world_sizes == (1, 2) and config.matrix.modes == ("ddp", "fsdp")
    assert config.matrix.steps == 20 and config.repeats == 3 and config.confirm == 0
    assert config.timeout_s == 12.5 and config.peak_tflops == 989.0
    assert config.baselines == Path("/tmp/b") and config.accept == ("resnet50-*",)
    assert not config.load_check and not config.record_history and config.ab_pairs is None
    assert config.thresholds.step == 0.05 and config.thresholds.efficiency is None
    # resolved per device only when the device is known; a case rule wins for its cases
    assert config.thresholds.for_device("cuda").step == 0.05
    assert config.thresholds.for_device("cpu").efficiency == Thresholds.for_device("cpu").efficiency
    assert config.thresholds.for_case("resnet50-ddp-ws1-bf16-strong", "cuda").step == 0.08
    assert config.thresholds.for_case("gpt2-ddp-ws1-bf16-strong", "cuda").step == 0.05
    assert config.thresholds.for_device("cpu", paired=True).step == 0.05


@pytest.mark.parametrize(
    ("texts", "flags", "lines", "message"),
    [
        ({"steps": "0"}, (), {}, "--perf-steps takes an integer in [1, "),
        ({"repeats": "x"}, (), {}, "--perf-repeats takes an integer in [1, 100]"),
        ({"modes": "ddp,nope"}, (), {}, "nope"),
        ({"world-sizes": "0"}, (), {}, "world size"),
        ({"timeout": "inf"}, (), {}, "--perf-timeout must be finite, positive seconds"),
        ({"peak-tflops": "-1"}, (), {}, "--perf-peak-tflops takes TFLOPS"),
        ({"threshold-step": "nan"}, (), {}, "threshold step=nan must be a number in"),
        ({"threshold-memory": "0.1 min_spread=1"}, (), {}, "is not a number"),
        ({}, (), {"case_thresholds": ["step=0.1"]}, "has no case-id glob"),
        ({}, ("update-baselines",), {"accept": ["x*"]}, "needs --perf-accept-reason"),
        ({"accept-reason": "why"}, (), {"accept": ["x*"]}, "only has a meaning with --perf-update-baselines"),
        ({}, ("update-baselines", "share-gpu"), {}, "--perf-share-gpu is a test mode"),
        ({"ab-b": "/usr/bin/python3"}, ("update-baselines",), {}, "record baselines in a plain session"),
        ({}, (), {"ab_env_b": ["1X=2"]}, "--perf-ab-env-b takes KEY=VALUE"),
        ({"data-root": "/nonexistent"}, (), {}, "no CIFAR-10 there"),
    ],
)
def test_an_unusable_value_is_one_error_naming_it(
    texts: dict[str, str], flags: tuple[str, ...], lines: dict[str, list[str]], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        read(texts, flags, **lines)
    assert message in str(caught.value)


def test_the_cli_reads_its_thresholds_through_the_same_reader() -> None:
    args = argparse.Namespace(threshold_step="0.05", threshold_efficiency=None, threshold_memory="0.2")
    assert cli.config_from(args).thresholds == ThresholdSettings(step=0.05, memory=0.2)
    assert cli.config_from(args).thresholds.for_device("cpu") == read(
        {"threshold-step": "0.05", "threshold-memory": "0.2"}
    ).thresholds.for_device("cpu")
    with pytest.raises(cli.UsageProblem, match=r"threshold step=2\.0 must be a number in"):
        cli.config_from(argparse.Namespace(threshold_step="2"))


@pytest.mark.parametrize(
    ("texts", "says"),
    [
        ({"world-sizes": ""}, "empty world size list"),
        ({"modes": ""}, "empty"),
        ({"world-sizes": "1,²"}, "world sizes are positive integers"),
        ({"steps": "²"}, "--perf-steps takes an integer"),
        ({"steps": "1_0"}, "--perf-steps takes an integer"),
        ({"slurm-nodes": "1_0"}, "--perf-slurm-nodes takes a comma list"),
        ({"slurm-nodes": "0"}, "node counts are 1..4096"),  # without --perf-slurm: still read
        ({"slurm-mem": "lots"}, "--perf-slurm-mem takes a size"),
        ({"slurm-gpu-bind": "rack"}, "--perf-slurm-gpu-bind .* takes one of node, task"),
    ],
)
def test_a_value_is_read_by_one_rule_whatever_else_is_set(texts: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        read(texts)


def test_a_threshold_or_pattern_is_checked_where_no_run_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from scaleguard.history import database as history

    db = tmp_path / "h.sqlite"
    with history.History(db):
        pass
    assert cli.main(["history", "--history", str(db), "--threshold-step", "abc"]) == 2
    assert "not a number" in capsys.readouterr().err
    assert cli.main(["hardware-key", "--threads-per-rank", str(10**14)]) == 2
    assert "--threads-per-rank takes a positive integer up to 4096" in capsys.readouterr().err


def test_an_unwritable_default_history_leaves_the_session_without_one_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from scaleguard import plugin

    said: list[str] = []
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not mode & os.W_OK)  # a read-only checkout
    config = plugin._default_history_or_none(PerfConfig(), tmp_path, said.append)
    assert not config.record_history and "this session keeps no history" in said[0]
    monkeypatch.undo()
    assert plugin._default_history_or_none(PerfConfig(), tmp_path, said.append).record_history
    assert len(said) == 1


def test_a_server_history_is_a_server_and_its_password_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scaleguard.history.target import ServerDsn

    monkeypatch.chdir(tmp_path)
    dsn = "postgresql://sg:PASSWORD@127.0.0.1:1/sg"
    target = read({"history": dsn}).history
    assert isinstance(target, ServerDsn) and str(target) == "postgresql://sg:***@127.0.0.1:1/sg"
    assert "PASSWORD" not in repr(target) + f"{target}"
    with pytest.raises(ConfigError, match=r"mysql://sg:\*\*\*@h/sg: a history lives in a file"):
        read({"history": "mysql://sg:PASSWORD@h/sg"})
    with pytest.raises(ConfigError, match=r"port is not a number"):
        read({"history": "postgresql://sg:PASSWORD@h:x/sg"})
    monkeypatch.setenv("SCALEGUARD_HISTORY", dsn)  # a CI secret, when no option names one
    assert read({}).history == target and read({"history": "h.sqlite"}).history == Path("h.sqlite")
    monkeypatch.delenv("SCALEGUARD_HISTORY")
    for argv in (
        ["history", "--history", dsn],
        ["export", "--format", "otava", "--out", "o", "--history", dsn],
        ["history", "--history", "postgresql://sg@127.0.0.1:1/sg?password=PASSWORD"],
    ):
        assert cli.main(argv) == 2  # nothing listens on port 1
        said = capsys.readouterr()
        assert "cannot connect" in said.err and "PASSWORD" not in said.out + said.err, said.err
    assert not list(tmp_path.rglob("*"))  # no SQLite file made at a path holding the password
