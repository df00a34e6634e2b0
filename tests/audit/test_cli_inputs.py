"""Hostile and careless inputs to the CLI's readers and writers: baselines, saved runs, torchrun
records, rank files, locks, report paths, interpreters (found by the second bad-input audit,
issue 22; each test is one finding as it was reproduced).

The CLI's contract for every input: exit 0 (OK), 1 (REGRESSED) or 2 (bad input or usage), a
sentence naming the file and the field, never a traceback, never a hang, memory bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scaleguard.cli import main as cli_main
from scaleguard.evidence import baseline
from scaleguard.evidence.files import FileFormatError, read_document
from scaleguard.ranks import launcher, protocol, worker
from scaleguard.schedule import ab, torchrun_entry
from tests.unit.test_ingest import write_run
from tests.unit.test_verdicts import case, run, runs_of, spread_runs

KEY = "cpu-test-1t"


def _baseline(path: Path, key: str = KEY, torch: str = "2.11.0") -> Path:
    baseline.update(path, key, {}, [case(spread_runs(4, 0.1, 0.004, seed=1), ws=1, torch=torch)])
    return path


def _saved_run(path: Path, key: str | None = KEY, mutate=None, scaleguard: dict | None = None) -> Path:
    """A saved ``--benchmark-save`` file with one scaleguard case, as the suite writes it."""
    entry = case(spread_runs(3, 0.1, 0.004, seed=3), ws=1).to_dict()
    info = {k: entry[k] for k in ("case_id", "group_id", "world_size", "config", "versions", "runs")}
    if mutate:
        mutate(info)
    ours = {"hardware_key": key} if scaleguard is None else scaleguard
    path.write_text(json.dumps({"machine_info": {"scaleguard": ours}, "benchmarks": [{"extra_info": info}]}))
    return path


def _run_cli(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in its own process: a hang is a timeout, memory is the child's peak RSS."""
    return subprocess.run(
        [sys.executable, "-m", "scaleguard.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _exit2(capsys: pytest.CaptureFixture[str], *args: str, needle: str = "") -> str:
    code = cli_main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and needle in err, err
    return err


# row 1
def test_unhashable_config_value_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _baseline(tmp_path / "b.json")
    new = _saved_run(tmp_path / "s.json", mutate=lambda i: i["config"].update(device=["cpu"]))
    _exit2(capsys, "compare", str(old), str(new), needle="'device' is list")


# row 2
def test_markup_in_ids_and_versions_is_printed_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def bracketed(info: dict) -> None:
        info["case_id"] = info["group_id"] = "[/]"
        info["versions"]["torch"] = "[/x]"

    new = _saved_run(tmp_path / "s.json", mutate=bracketed)
    md = tmp_path / "r.md"
    assert cli_main(["compare", str(_baseline(tmp_path / "b.json")), str(new), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "[/]" in out and "[/x]" in out
    record = write_run(tmp_path / "tr")
    data = json.loads(record.read_text())
    data["run"]["device_name"] = "[/]"
    record.write_text(json.dumps(data))
    assert cli_main(["ingest", str(record), "--baselines", str(tmp_path / "nb"), "--update-baselines"]) == 0
    assert "[/]" in capsys.readouterr().out


# row 3
def test_schema1_peak_memory_and_gpu_count_of_the_wrong_type_are_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _baseline(tmp_path / "b.json")

    def schema1(info: dict) -> None:
        del info["runs"]
        info.update(step_s=[0.1, 0.1, 0.1], samples_per_s=80.0, peak_mem_bytes=["x"])

    new = _saved_run(tmp_path / "s1.json", mutate=schema1)
    _exit2(capsys, "compare", str(old), str(new), needle="peak_mem_bytes")
    gpu = _saved_run(
        tmp_path / "s2.json",
        scaleguard={"device": "cpu", "cpu_model": "x", "threads_per_rank": 1, "gpu_count": "two"},
    )
    _exit2(capsys, "compare", str(old), str(gpu), "--allow-cross-hardware", needle="gpu_count")


# row 4
@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("spec", "global_batch"), "8", "global_batch"),
        (("spec", "global_batch"), 10**400, "global_batch"),
        (("spec", "global_batch"), 0, "global_batch"),
        (("spec", "model"), 5, "model"),
        (("spec", "settings", "threads_per_rank"), "x", "threads_per_rank"),
        (("spec", "world_size"), -3, "world_size"),
    ],
)
def test_torchrun_record_with_a_bad_case_description_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: tuple[str, ...], value: object, needle: str
) -> None:
    record = write_run(tmp_path)
    data = json.loads(record.read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    record.write_text(json.dumps(data))
    _exit2(
        capsys, "ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines", needle=needle
    )


# row 5
def test_report_paths_are_checked_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _baseline(tmp_path / "b.json")
    new = _saved_run(tmp_path / "s.json")
    (tmp_path / "adir").mkdir()
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    _exit2(capsys, "compare", str(old), str(new), "--markdown", str(tmp_path / "adir"), needle="directory")
    _exit2(capsys, "compare", str(old), str(new), "--markdown", str(blocker / "r.md"), needle="cannot create")
    _exit2(capsys, "compare", str(old), str(new), "--plot", str(tmp_path / "p.xyz"), needle=".png")
    huge = json.loads(old.read_text())
    for entry in huge["cases"].values():
        for version in entry.values():
            version["runs"][0]["step_s"] = [1e308, 1e308, 1e308]
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    _exit2(capsys, "compare", str(tmp_path / "huge.json"), str(new), "--plot", str(tmp_path / "p.png"))
    assert not (tmp_path / "p.png").exists()


# row 6
def test_lock_path_that_is_a_directory_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = write_run(tmp_path / "tr")
    directory = tmp_path / "b"
    key = "cpu-k-1t"
    (directory / f".{key}.json.lock").mkdir(parents=True)
    _exit2(capsys, "ingest", str(record), "--baselines", str(directory), "--hardware-key", key,
           "--update-baselines", needle="lock file")  # fmt: skip


def test_the_lock_is_opened_read_only_so_another_users_0644_lock_still_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int] = []
    real_open = os.open

    def spy(path: object, flags: int, *args: object) -> int:
        if str(path).endswith(".lock"):
            opened.append(flags)
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    with baseline.locked(tmp_path / "cpu-k-1t.json", timeout_s=5):
        pass
    assert opened and all(f & (os.O_WRONLY | os.O_RDWR) == 0 and f & os.O_NOFOLLOW for f in opened)


# row 7
def test_a_device_and_a_fifo_are_refused_unread(tmp_path: Path) -> None:
    old = _baseline(tmp_path / "b.json")
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for bad in (zero, fifo):
        done = _run_cli("compare", str(old), str(bad), timeout=60)
        assert done.returncode == 2, done.stderr
        assert "not a regular file" in done.stderr and "Traceback" not in done.stderr


# row 8
def test_many_small_objects_are_refused_with_bounded_memory(tmp_path: Path) -> None:
    old = _baseline(tmp_path / "b.json")
    bomb = tmp_path / "bomb.json"
    with bomb.open("w") as fh:
        fh.write('{"benchmarks": [')
        fh.write("{}," * 15_600_000)
        fh.write('{}], "machine_info": {}}')
    assert 40 * 2**20 < bomb.stat().st_size < 64 * 2**20
    code = (
        "import resource, sys; from scaleguard.cli import main; c = main(sys.argv[1:]); "
        "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(c)"
    )

    def peak_kib(path: Path) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "-c", code, "compare", str(old), str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        return int(done.stderr.split("maxrss_kib")[1].split()[0]), done.stderr

    (tmp_path / "empty.json").write_text("{}")
    base_kib, _ = peak_kib(tmp_path / "empty.json")
    bomb_kib, err = peak_kib(bomb)
    assert "objects and lists" in err, err
    # read and its braces counted, never parsed (1.23 GB before): the bytes and one copy
    assert bomb_kib - base_kib < 3 * bomb.stat().st_size / 1024, (base_kib, bomb_kib)


# row 9
def test_nothing_is_written_that_the_reader_would_refuse(tmp_path: Path, capsys) -> None:
    record = write_run(tmp_path / "tr")
    data = json.loads(record.read_text())
    data["step_s"] = [1e308] * 4
    record.write_text(json.dumps(data))
    _exit2(capsys, "ingest", str(record), "--baselines", str(tmp_path / "b"), "--update-baselines")
    assert not (tmp_path / "b" / f"{KEY}.json").exists()
    path = tmp_path / "direct.json"
    entry = case([replace(run(0.1), step_s=(1e308, 1e308))], ws=1)
    with pytest.raises(baseline.BaselineError, match="would not read back"):
        baseline.update(path, KEY, {}, [entry])
    assert not path.exists()


# row 10
def test_an_absent_baseline_torch_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = write_run(tmp_path / "tr")
    directory = tmp_path / "b"
    assert cli_main(["ingest", str(record), "--baselines", str(directory), "--update-baselines"]) == 0
    capsys.readouterr()
    err = _exit2(capsys, "ingest", str(record), "--baselines", str(directory), "--baseline-torch", "9.9")
    assert "torch versions present: t" in err


# row 12
def test_a_saved_run_without_a_hardware_key_is_refused_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _baseline(tmp_path / "b.json")
    new = _saved_run(tmp_path / "s.json", scaleguard={})
    _exit2(capsys, "compare", str(old), str(new), needle="no hardware key")
    assert cli_main(["compare", str(old), str(new), "--allow-cross-hardware"]) == 0


# row 13 (the suite's half is in tests/plugin/test_audit_plugin.py)
def test_ingest_refuses_a_baseline_named_for_other_hardware(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = write_run(tmp_path / "tr")
    directory = tmp_path / "b"
    directory.mkdir()
    _baseline(tmp_path / "elsewhere.json", key="cuda-other-x8")
    (directory / "cpu-k-1t.json").write_bytes((tmp_path / "elsewhere.json").read_bytes())
    _exit2(capsys, "ingest", str(record), "--baselines", str(directory), "--hardware-key", "cpu-k-1t",
           needle="cuda-other-x8")  # fmt: skip


# row 14
@pytest.mark.parametrize("field", ["final_loss", "warmup_step_s", "phase_unix"])
def test_rank_files_go_through_the_validating_reader(tmp_path: Path, field: str) -> None:
    from tests.conftest import tiny_spec

    spec = tiny_spec(world_size=1)
    files = worker.RankFiles.in_dir(tmp_path, 0)
    good = {
        "case_id": spec.case_id, "rank": 0, "step_s": [0.1, 0.1], "warmup_step_s": [0.2], "steady": True,
        "final_loss": 1.0, "peak_mem_bytes": 1, "mem_kind": "host_max_rss", "device_name": "cpu",
        "runtime": {}, "settings": {}, "phase_unix": {"configure": 1.0},
    }  # fmt: skip
    token = {"final_loss": "NaN", "warmup_step_s": "[Infinity]", "phase_unix": '{"configure": NaN}'}[field]
    text = json.dumps({**good, field: "@@"}).replace('"@@"', token)
    Path(files.result).write_text(text)
    with pytest.raises(protocol.CaseFailedError, match=r"NaN|Infinity"):
        launcher._collect(spec, tmp_path)
    Path(files.result).write_text(json.dumps(good))
    assert launcher._collect(spec, tmp_path)[0].final_loss == 1.0
    Path(files.error).write_text('{"case_id": "x", "rank": 0, "phase": "p", "exc_type": "E", '
                                 '"message": "m", "traceback": "t", "unix_time": NaN}')  # fmt: skip
    assert launcher._read_failure(tmp_path, 0) is None  # refused, so the rank's exit is reported


# row 15a
def test_a_symlink_at_the_lock_path_is_refused_and_its_target_not_created(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    lock = tmp_path / ".cpu-k-1t.json.lock"
    lock.symlink_to(target)
    with pytest.raises(baseline.BaselineError, match="symbolic link"):
        baseline.update(tmp_path / "cpu-k-1t.json", "cpu-k-1t", {}, [case(runs_of([0.1, 0.1]), ws=1)])
    assert not target.exists() and not (tmp_path / "cpu-k-1t.json").exists()


# row 15b
@pytest.mark.parametrize("key", ["../x", "a/b", ".hidden", "UPPER", ""])
def test_ingest_hardware_key_must_be_a_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    record = write_run(tmp_path / "tr")
    directory = tmp_path / "b"
    _exit2(capsys, "ingest", str(record), "--baselines", str(directory), "--hardware-key", key,
           "--update-baselines", needle="hardware key")  # fmt: skip
    assert not (tmp_path / "x.json").exists()


# row 15c
def test_an_interpreter_on_path_is_resolved_to_a_path() -> None:
    name = Path(sys.executable).name
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    resolved = ab.resolve_interpreter("A", name)
    assert os.path.isabs(resolved) and os.path.samefile(resolved, sys.executable)
    with pytest.raises(ab.ABInputError, match="neither a path nor a command"):
        ab.resolve_interpreter("B", "no-such-python-3.99")


# row 15d
def test_a_sides_environment_is_the_one_it_is_probed_with(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import torch\ntorch.__version__ = '9.9.9+from-b-env'\n")
    plain = ab.probe("A", sys.executable)
    side_b = ab.probe("B", sys.executable, [("PYTHONPATH", str(tmp_path))])
    assert side_b.versions["torch"] == "9.9.9+from-b-env" != plain.versions["torch"]
    with pytest.raises(ab.ABInputError, match="KEY=VALUE"):
        ab.parse_env(["=x"], "--b-env")


# row 15e
@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda t: t.replace('"run_id":', '"run_id": "dup", "run_id":', 1), "appears twice"),
        (lambda t: t.replace('"quarantine":', '"quarantined":', 1), "unknown field 'quarantined'"),
        (lambda t: '"world_size": -3'.join(t.rsplit('"world_size": 1', 1)), "world_size"),
    ],
)
def test_duplicate_unknown_and_out_of_range_fields_are_refused(tmp_path: Path, damage, needle: str) -> None:
    path = _baseline(tmp_path / f"{KEY}.json")
    path.write_text(damage(path.read_text()))
    with pytest.raises(baseline.BaselineError, match=needle):
        baseline.load(path)


def test_a_newline_in_a_case_id_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def newline(info: dict) -> None:
        info["case_id"] = "m\n| injected | row |"

    new = _saved_run(tmp_path / "s.json", mutate=newline)
    _exit2(capsys, "compare", str(_baseline(tmp_path / "b.json")), str(new), needle="case_id")


@pytest.mark.parametrize("threads", ["-5", "0"])
def test_hardware_key_refuses_non_positive_threads(capsys: pytest.CaptureFixture[str], threads: str) -> None:
    _exit2(capsys, "hardware-key", "--device", "cpu", "--threads-per-rank", threads, needle="positive")


def test_the_reader_refuses_a_file_past_the_cap_after_reading_the_cap_plus_one(tmp_path: Path) -> None:
    from scaleguard.evidence import files

    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(files.MAX_FILE_BYTES + 10)
    with pytest.raises(FileFormatError, match="limit"):
        read_document(big, "x", "fix")


def test_the_torchrun_record_is_read_by_the_one_reader(tmp_path: Path) -> None:
    record = write_run(tmp_path)
    spec, _ = torchrun_entry.read_finished_record(record)
    assert spec.world_size == 1
