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
    key = slurm.cluster_hardware_key("cuda", "NVIDIA H100 80GB HBM3", opts, "Intel Xeon", 12)
    assert key == "slurm-cuda-nvidia-h100-80gb-hbm3-x8-8pn"
    assert slurm.cluster_hardware_key("cpu", None, slurm.SlurmOptions(), "AMD EPYC", 1) == (
        "slurm-cpu-amd-epyc-1t-1pn"
    )


@pytest.mark.parametrize(
    ("gres", "asked", "gpu_type"),
    [
        (["gpu:h100:8", "gpu:h100:8"], None, "h100"),
        (["gpu:8(S:0-1)"], None, "gpu"),  # untyped: recognised, named by the pre-flight
        (["gpu:a100:8", "gpu:h100:8"], None, "mixed"),  # never the last one listed
        (["gpu:a100:8", "gpu:h100:8"], "h100", "h100"),
        (["(null)"], None, None),
    ],
)
def test_sinfos_gpu_types_are_read_whole_not_the_last_one(
    gres: list[str], asked: str | None, gpu_type: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    rows = "\n".join(f"8|{g}|n{i}|idle" for i, g in enumerate(gres))
    monkeypatch.setattr(
        slurm, "_run", lambda cmd, timeout_s=30.0: subprocess.CompletedProcess(cmd, 0, rows, "")
    )
    assert slurm.node_facts(slurm.SlurmOptions(gpu_type=asked)).gpu_type == gpu_type


def test_the_allocation_and_each_step_ask_for_gpus_cpus_memory_and_the_whole_node() -> None:
    facts = slurm.NodeFacts(cpus=96, gpu_type="h100", nodes_up=2)
    node = slurm.SlurmOptions(ranks_per_node=8).resources("cuda", facts)
    assert node.salloc_args() == [
        "--ntasks-per-node=8", "--cpus-per-task=12", "--mem=0", "--gpus-per-node=8", "--exclusive"
    ]  # fmt: skip
    assert node.step_args() == ["--cpus-per-task=12", "--mem=0", "--gpus-per-node=8"]
    task = slurm.SlurmOptions(
        ranks_per_node=8, gpu_bind="task", gpu_type="h100", cpus_per_task=10, mem="500G", exclusive=False
    ).resources("cuda", facts)
    assert task.salloc_args() == [
        "--ntasks-per-node=8", "--cpus-per-task=10", "--mem=500G", "--gpus-per-node=h100:8"
    ]  # fmt: skip
    assert task.step_args() == ["--cpus-per-task=10", "--mem=500G", "--gpus-per-task=h100:1"]
    # the pre-flight: one task per node, given the whole node
    assert task.step_args(whole_node=True) == ["--cpus-per-task=80", "--mem=500G", "--gpus-per-node=h100:8"]
    cpu = slurm.SlurmOptions(ranks_per_node=2).resources("cpu", FACTS)
    assert cpu.salloc_args() == ["--ntasks-per-node=2", "--cpus-per-task=8", "--mem=0", "--exclusive"]
    assert "gres/gpu" not in cpu.tres() and "gres/gpu:h100=8" in task.tres()


def test_a_rank_takes_its_own_device_in_both_binding_styles() -> None:
    from scaleguard.ranks.worker import device_index

    assert [device_index(r, 8, False) for r in range(8)] == list(range(8))  # the node's 8 GPUs seen
    assert [device_index(r, 1, False) for r in range(8)] == [0] * 8  # one GPU per task
    assert [device_index(r, 2, True) for r in range(4)] == [0, 1, 0, 1]  # --perf-share-gpu


def test_the_gres_slurm_allocated_is_read_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    shown = (
        "JobId=7 JobName=x\n   Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:fake:2(IDX:0-1)\n"
        "   Nodes=n5 CPU_IDs=0-1 Mem=0 GRES=gpu:fake2:2(IDX:0-1)\n"
    )

    def run(cmd: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        if cmd[:3] == ["scontrol", "show", "hostnames"]:
            names = {"n[1-2]": "n1\nn2", "n5": "n5"}[cmd[3]]
            return subprocess.CompletedProcess(cmd, 0, names, "")
        return subprocess.CompletedProcess(cmd, 0, shown, "")

    monkeypatch.setattr(slurm, "_run", run)
    assert slurm.allocated_gres("7") == {
        "n1": "gpu:fake:2(IDX:0-1)", "n2": "gpu:fake:2(IDX:0-1)", "n5": "gpu:fake2:2(IDX:0-1)"
    }  # fmt: skip


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
        ({"slurm-gpus-per-node": "h100:x"}, "takes N or TYPE:N"),
        ({"slurm-gpus-per-node": "a;b:2"}, "takes N or TYPE:N"),
        ({"device": "cuda", "slurm-ranks-per-node": "8", "slurm-gpus-per-node": "4"}, "need 8 GPUs per node"),
        ({"slurm-gpu-bind": "socket"}, "takes one of node, task"),
        (
            {"slurm-ranks-per-node": "2", "slurm-gpus-per-node": "4", "slurm-gpu-bind": "task"},
            "does not match",
        ),
        ({"slurm-mem": "lots"}, "takes a size as Slurm writes it"),
        ({"slurm-srun-args": "'unclosed"}, "--perf-slurm-srun-args is not a shell-quoted string"),
        ({"slurm-iface": "eth0; rm -rf /"}, "takes an interface name"),
        ({"slurm-cpus-per-task": "0"}, r"--perf-slurm-cpus-per-task takes an integer in \[1, 4096\]"),
        ({"slurm-retries": "11"}, r"--perf-slurm-retries takes an integer in \[0, 10\]"),
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
    site = PerfConfig.read(
        lambda n: {
            "slurm-gpus-per-node": "h100:8",
            "slurm-ranks-per-node": "8",
            "slurm-gpu-bind": "task",
            "slurm-cpus-per-task": "12",
            "slurm-mem": "500G",
            "slurm-iface": "ib0",
            "slurm-python": "/usr/bin/python",
            "slurm-retries": "0",
            "slurm-srun-args": "--container-image=nvcr.io#nvidia/pytorch:25.01-py3 --mpi=pmix",
        }.get(n),
        lambda n: n in {"slurm", "slurm-no-exclusive"},
        lambda n: ["NCCL_IB_HCA=mlx5", "A=b=c"] if n == "slurm-export" else [],
    ).slurm
    assert site is not None
    assert (site.gpu_type, site.gpus_per_node, site.gpu_bind, site.cpus_per_task, site.mem) == (
        "h100",
        8,
        "task",
        12,
        "500G",
    )
    assert (site.exclusive, site.iface, site.python, site.retries) == (False, "ib0", "/usr/bin/python", 0)
    assert site.srun_args == ("--container-image=nvcr.io#nvidia/pytorch:25.01-py3", "--mpi=pmix")
    assert site.export == (("NCCL_IB_HCA", "mlx5"), ("A", "b=c"))


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


def test_a_stray_rank_in_the_login_shell_never_reaches_a_step_and_slurms_rank_wins() -> None:
    from scaleguard.schedule.slurm import clean_env
    from scaleguard.schedule.torchrun_entry import _from_slurm

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "SLURM_NTASKS": "8", "SLURM_CONF": "/etc/s.conf",
           "PATH": "/bin"}  # fmt: skip
    assert clean_env(env) == {"SLURM_CONF": "/etc/s.conf", "PATH": "/bin"}
    # inside the step: Slurm's task id wins over a RANK that got there anyway
    task = {"RANK": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
            "SLURM_NTASKS_PER_NODE": "4"}  # fmt: skip
    _from_slurm(task)
    assert (task["RANK"], task["WORLD_SIZE"], task["LOCAL_RANK"], task["LOCAL_WORLD_SIZE"]) == (
        "5",
        "8",
        "1",
        "4",
    )
    # under torchrun inside a Slurm job, torchrun's own ranks stand
    elastic = {"RANK": "3", "SLURM_PROCID": "0", "TORCHELASTIC_RUN_ID": "x"}
    _from_slurm(elastic)
    assert elastic["RANK"] == "3"


def test_a_rank_variable_that_is_not_an_integer_is_said_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from scaleguard.schedule import torchrun_entry

    for key in ("SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert torchrun_entry.main(["--spec", str(tmp_path / "case.json"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the rank variables must be integers, got RANK='one'" in err and "Traceback" not in err
