"""The Slurm layer's pure parts: srun's words read as states, the plan across nodes, the key,
and the options refused before anything is queued. (The real cluster: tests/cluster.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from scaleguard.config import ConfigError, PerfConfig
from scaleguard.schedule import slurm
from scaleguard.schedule.matrix import MatrixOptions

KILLED = """srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=13.0
slurmstepd-n1: error: *** STEP 13.0 ON n1 CANCELLED AT 2026-12-05T06:54:28 ***
srun: error: n1: task 0: Terminated
"""
TIME_LIMIT = (
    "slurmstepd-n1: error: *** STEP 2.3 ON n1 CANCELLED AT 2026-12-05T06:42:42 DUE TO TIME LIMIT ***\n"
)


@pytest.mark.parametrize(
    ("output", "code", "state"),
    [
        ("", 0, "COMPLETED"),
        (KILLED, 143, "FAILED"),
        (TIME_LIMIT, 143, "TIMEOUT"),
        ("*** JOB 9 ON n1 CANCELLED AT x DUE TO NODE FAILURE ***", 1, "NODE_FAIL"),
        ("*** STEP 9.1 ON n1 CANCELLED AT x DUE TO PREEMPTION ***", 1, "PREEMPTED"),
        ("srun: error: Slurm job 3 has expired", 1, "ALLOCATION_ENDED"),
        ("srun: error: n1: task 0: Exited with exit code 3", 3, "FAILED"),
        ("something else", 1, "FAILED"),
    ],
)
def test_srun_output_reads_as_the_steps_state(output: str, code: int, state: str) -> None:
    assert slurm.step_state(output, code) == state


def test_the_first_task_error_names_the_rank_that_died_not_its_peers() -> None:
    assert slurm.first_task_error(KILLED) == "task 1 on n2: Killed"
    assert slurm.first_task_error("srun: error: n1: task 0: Terminated\n") is None


def test_nccls_transport_is_read_from_its_log() -> None:
    assert slurm.nccl_transport("node1:12:12 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB") == "IB"
    assert slurm.nccl_transport("NCCL INFO NET/Socket : Using [0]eth0") == "Socket"
    assert slurm.nccl_transport("no nccl here") is None


FACTS = slurm.NodeFacts(cpus=16, gpu_type=None, nodes_up=4)


def test_the_plan_spans_nodes_and_marks_each_case_with_them() -> None:
    opts = slurm.SlurmOptions(nodes=(1, 2, 4), ranks_per_node=2)
    matrix = MatrixOptions(device="cpu", models=("transformer_tiny",), modes=("single", "ddp"),
                           scalings=("strong",), inputs=("synthetic",))  # fmt: skip
    planned = slurm.plan_on_cluster(matrix, opts, FACTS)
    by_id = {p.spec.case_id: p for p in planned}
    assert sorted({p.spec.world_size for p in planned}) == [1, 2, 4, 8]
    assert by_id["transformer_tiny-ddp-ws8-fp32-strong"].spec.settings.nodes == 4
    assert by_id["transformer_tiny-ddp-ws2-fp32-strong"].spec.settings.nodes == 1
    assert by_id["transformer_tiny-single-ws1-fp32-strong"].spec.settings.nodes == 1
    assert all(p.skip_reason is None for p in planned)
    assert {p.spec.settings.threads_per_rank for p in planned} == {8}  # 16 CPUs / 2 ranks per node


def test_what_cannot_run_on_the_cluster_says_why() -> None:
    opts = slurm.SlurmOptions(nodes=(1, 8), ranks_per_node=2)
    matrix = MatrixOptions(device="cpu", models=("transformer_tiny",), modes=("ddp",),
                           scalings=("strong",), inputs=("synthetic",))  # fmt: skip
    planned = {p.spec.world_size: p for p in slurm.plan_on_cluster(matrix, opts, FACTS)}
    assert planned[16].skip_reason == "needs 8 nodes; the partition has 4 up"


def test_a_clusters_key_is_never_a_single_machines() -> None:
    opts = slurm.SlurmOptions(ranks_per_node=8)
    facts = slurm.NodeFacts(cpus=96, gpu_type="h100", nodes_up=2)
    assert slurm.cluster_hardware_key("cuda", facts, opts, "Intel Xeon", 12) == "slurm-cuda-h100-x8-8pn"
    assert slurm.cluster_hardware_key("cpu", FACTS, slurm.SlurmOptions(), "AMD EPYC", 1) == (
        "slurm-cpu-amd-epyc-1t-1pn"
    )


def _read(values: dict[str, str], flags: set[str]) -> PerfConfig:
    return PerfConfig.read(lambda n: values.get(n), lambda n: n in flags, lambda n: ())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"slurm-nodes": "1,x"}, "--perf-slurm-nodes takes a comma list"),
        ({"slurm-nodes": "0"}, "node counts are 1..4096"),
        ({"slurm-ranks-per-node": "0"}, r"--perf-slurm-ranks-per-node takes an integer in \[1, 1024\]"),
        ({"slurm-pending-timeout": "-1"}, "must be positive seconds"),
        ({"slurm-args": "'unclosed"}, "not a shell-quoted string"),
        ({"device": "cuda"}, "needs --perf-slurm-ranks-per-node N"),
    ],
)
def test_bad_slurm_options_are_refused_before_anything_is_queued(
    values: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "missing_commands", lambda: [])
    with pytest.raises(ConfigError, match=message):
        _read(values, {"slurm"})


def test_no_slurm_client_is_a_usage_error_naming_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "missing_commands", lambda: ["salloc", "srun"])
    with pytest.raises(ConfigError, match="Slurm's salloc, srun not found on PATH"):
        _read({}, {"slurm"})


def test_slurm_options_are_read_into_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm, "missing_commands", lambda: [])
    config = _read(
        {"slurm-nodes": "4,2", "slurm-ranks-per-node": "8", "slurm-args": "--qos=perf --constraint='h100 x'"},
        {"slurm", "slurm-skip-pending"},
    )
    assert config.slurm == slurm.SlurmOptions(
        nodes=(2, 4), ranks_per_node=8, extra_args=("--qos=perf", "--constraint=h100 x"), skip_pending=True
    )
    assert _read({}, set()).slurm is None


def test_a_shared_dir_that_is_a_file_is_refused_at_configure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm, "missing_commands", lambda: [])
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ConfigError, match="--perf-slurm-dir"):
        _read({"slurm-dir": str(target)}, {"slurm"})


def test_a_wrapping_jobs_slurm_variables_do_not_reach_salloc_or_srun() -> None:
    env = {"SLURM_CONF": "/etc/slurm.conf", "SLURM_NTASKS": "1", "SLURM_CPUS_PER_TASK": "2", "PATH": "/bin"}
    assert slurm.clean_env(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"}


def test_sruns_log_is_read_from_both_ends_only(tmp_path: Path) -> None:
    log = tmp_path / "srun.log"
    middle = b"NCCL INFO noise\n" * 200_000  # 3.2 MB
    log.write_bytes(b"NCCL INFO NET/IB : Using mlx5_0\n" + middle + b"srun: error: n2: task 1: Killed\n")
    text = slurm.read_log(log)
    assert len(text) < 600_000
    assert slurm.nccl_transport(text) == "IB"
    assert slurm.first_task_error(text) == "task 1 on n2: Killed"
    assert "bytes of srun's log not read" in text


def test_a_failures_srun_lines_are_inert_on_the_terminal() -> None:
    outcome = slurm.StepOutcome("1.0", 1, "FAILED", 1.0, "rank says \x1b[2Jhi\nscaleguard: forged\r\n", False)
    tail = outcome.tail()
    assert "\x1b" not in tail and "\r" not in tail and "\\x1b[2Jhi" in tail
