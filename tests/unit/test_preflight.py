"""The pre-flight's judgement of an allocation from its nodes' reports (the real step: tests/cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from scaleguard.machine.placement import compact_cpus, slurm_placement
from scaleguard.schedule import preflight


def report(node: str, **changes: Any) -> preflight.NodeReport:
    data: dict[str, Any] = {
        "node": node, "hostname": f"host-{node}", "python_version": "3.11.7", "scaleguard": "0.1.0", "torch": "2.11.0",
        "cpu_model": "Intel Xeon 8480", "placement": {"cuda_visible_devices": "0,1,2,3,4,5,6,7", "cpus": "0-95"},
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{node}-{i}"} for i in range(8)],
        "foreign_cores": 0.01, "machine": {"score": 1.0},
    }  # fmt: skip
    data.update(changes)
    return preflight.NodeReport.from_dict(data, "gpu:h100:8(IDX:0-7)", f"{node}.json")


def test_a_uniform_allocation_gives_the_compute_nodes_key_and_one_line() -> None:
    checked = preflight.check([report("n1"), report("n2")], "cuda", 8)
    assert checked.gpu_name == "NVIDIA H100 80GB HBM3" and checked.cpu_model == "Intel Xeon 8480"
    assert checked.warnings == ()
    assert checked.lines()[0].startswith("pre-flight on 2 node(s) n1,n2: python 3.11.7")
    assert "8x NVIDIA H100 80GB HBM3" in checked.lines()[0]


def test_a_mixed_allocation_is_refused_naming_each_node_and_its_gpus() -> None:
    a100 = [{"name": "NVIDIA A100-SXM4-80GB", "uuid": "x"}] * 8
    with pytest.raises(
        preflight.PreflightError, match=r"GPUs differ.*n1,n2: 8x NVIDIA H100.*n3: 8x NVIDIA A100"
    ):
        preflight.check([report("n1"), report("n2"), report("n3", gpus=a100)], "cuda", 8)


def test_without_torchs_view_the_gres_type_tells_nodes_apart() -> None:
    one = preflight.NodeReport.from_dict(
        {"node": "n4", "python_version": "3", "scaleguard": "0", "torch": "2", "cpu_model": "c",
         "placement": {"cuda_visible_devices": "0,1"}}, "gpu:fake:2(IDX:0-1)", "n4.json")  # fmt: skip
    other = preflight.NodeReport.from_dict(
        {"node": "n5", "python_version": "3", "scaleguard": "0", "torch": "2", "cpu_model": "c",
         "placement": {"cuda_visible_devices": "0,1"}}, "gpu:fake2:2(IDX:0-1)", "n5.json")  # fmt: skip
    with pytest.raises(preflight.PreflightError, match="n4: gpu:fake:2; n5: gpu:fake2:2"):
        preflight.check([one, other], "cpu", 2)
    assert preflight.check([one], "cpu", 2).gpu_name == "fake"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"torch": "2.10.0"}, "torch versions differ"),
        ({"python_version": "3.12.1"}, "Python versions differ"),
        ({"torch": None, "torch_error": "ImportError: libcudart.so.12"}, "n2: ImportError: libcudart"),
        ({"placement": {"cuda_visible_devices": "0"}}, "n2 was given 1 GPU"),
        ({"gpus": []}, "n2: torch sees 0 CUDA device"),
    ],
)
def test_a_node_that_cannot_run_the_session_is_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(preflight.PreflightError, match=message):
        preflight.check([report("n1"), report("n2", **changes)], "cuda", 8)


def test_a_slow_node_and_a_busy_node_are_named_without_refusing() -> None:
    checked = preflight.check(
        [report("n1"), report("n2", machine={"score": 0.6}), report("n3", foreign_cores=3.5), report("n4")],
        "cuda",
        8,
    )
    said = "\n".join(checked.warnings)
    assert "node n2 is slow: machine-speed probe 0.60 against 1.00" in said
    assert "node n3 is busy: 3.50 cores" in said
    assert "n1" not in said and "n4" not in said
    assert checked.slowest_machine() == {"score": 0.6}


def test_cpu_lists_read_as_slurm_writes_them() -> None:
    assert compact_cpus([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert compact_cpus([]) == ""


def test_a_ranks_placement_is_what_slurm_gave_its_task() -> None:
    env = {"SLURMD_NODENAME": "n2", "CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1",
           "SLURM_CPUS_PER_TASK": "12", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3"}  # fmt: skip
    facts = slurm_placement(env)
    assert facts["node"] == "n2" and facts["cuda_visible_devices"] == "1" and facts["cpus_per_task"] == "12"
    assert (facts["job"], facts["step"]) == ("7", "3")
    assert "mem_per_cpu_mb" not in facts


def test_nodes_of_one_host_are_not_called_slow_for_probing_side_by_side() -> None:
    same = [report(n, hostname="vm", machine={"score": s}) for n, s in (("n1", 0.9), ("n2", 0.5))]
    checked = preflight.check(same, "cuda", 8)
    assert checked.one_host and "2 nodes share 1 host(s) (vm)" in checked.warnings[0]
    assert not any("is slow" in w for w in checked.warnings)
    assert checked.slowest_machine() == {"score": 0.9}


def test_what_a_node_wrote_is_inert_on_the_terminal() -> None:
    forged = report("n2", cpu_model="Xeon\x1b[2J\nscaleguard: forged", torch="2.11.0\r")
    checked = preflight.check(
        [report("n1", cpu_model=forged.cpu_model, torch=forged.torch), forged], "cuda", 8
    )
    said = "\n".join(checked.lines())
    assert "\x1b" not in said and "\r" not in said and "\\x1b[2J" in said
