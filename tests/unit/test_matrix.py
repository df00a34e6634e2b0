from __future__ import annotations

from pathlib import Path

import pytest

from scaleguard.case import CaseSpec
from scaleguard.machine.env import GpuInventory
from scaleguard.ranks.faults import FaultSpec
from scaleguard.schedule.matrix import MatrixOptions, default_world_sizes, describe, parse_world_sizes, plan

NO_GPU = GpuInventory(0, ())
ONE_GPU = GpuInventory(1, ("NVIDIA H200",))


def ids(planned: list) -> list[str]:
    return [p.spec.case_id for p in planned]


def test_cpu_defaults_smoke_profile_and_skip_reasons() -> None:
    planned = plan(MatrixOptions(), NO_GPU, cpu_count=2)
    assert {p.spec.profile for p in planned} == {"smoke"}
    assert "resnet18_cifar-ddp-ws2-fp32-strong" in ids(planned)
    assert "transformer_tiny-single-ws1-fp32-weak" in ids(planned)
    dp = [p for p in planned if p.spec.mode == "dp"]
    assert dp and all("DataParallel" in (p.skip_reason or "") for p in dp)
    runnable = [p for p in planned if p.skip_reason is None]
    assert {p.spec.mode for p in runnable} == {"single", "ddp"}
    assert {p.spec.world_size for p in runnable} == {1, 2}
    assert all(p.spec.settings.threads_per_rank == 1 for p in planned)


def test_loader_cases_only_for_image_models_and_weak_scaling() -> None:
    planned = plan(MatrixOptions(), NO_GPU, cpu_count=2)
    loaders = [p.spec for p in planned if p.spec.inputs == "loader"]
    assert loaders and all(s.model == "resnet18_cifar" and s.scaling == "weak" for s in loaders)


def test_world_size_one_runs_before_its_group() -> None:
    planned = plan(MatrixOptions(modes=("ddp",)), NO_GPU, cpu_count=2)
    seen: dict[str, int] = {}
    for p in planned:
        if p.spec.world_size > 1 and not p.spec.model.startswith("allreduce"):  # collectives: no ws1
            assert p.spec.group_id in seen, "ws1 must come first: it anchors the speedup"
        seen.setdefault(p.spec.group_id, p.spec.world_size)


def test_nccl_cases_beyond_visible_gpus_skip_before_spawning() -> None:
    planned = plan(MatrixOptions(world_sizes=(1, 2, 4)), ONE_GPU, cpu_count=16)
    by_id = {p.spec.case_id: p for p in planned}
    assert by_id["resnet50-ddp-ws4-bf16-strong"].skip_reason == "needs 4 CUDA devices, 1 visible"
    assert by_id["resnet50-ddp-ws1-bf16-strong"].skip_reason is None
    assert by_id["resnet50-dp-ws2-fp32-weak"].skip_reason == "needs 2 CUDA devices, 1 visible"
    assert by_id["resnet50-ddp-ws1-bf16-strong"].spec.settings.channels_last


def test_cpu_oversubscription_is_skipped() -> None:
    planned = plan(MatrixOptions(world_sizes=(1, 4), threads_per_rank=1), NO_GPU, cpu_count=2)
    ws4 = [p for p in planned if p.spec.world_size == 4 and p.spec.mode == "ddp"]
    assert ws4 and all("oversubscription" in (p.skip_reason or "") for p in ws4)


def test_cuda_default_world_sizes() -> None:
    assert default_world_sizes("cuda", 1) == (1, 2)
    assert default_world_sizes("cuda", 6) == (1, 2, 4, 6)
    assert default_world_sizes("cuda", 8) == (1, 2, 4, 8)
    assert default_world_sizes("cpu", 0) == (1, 2)


@pytest.mark.parametrize("text", ["", "0", "a,2", "-1"])
def test_bad_world_sizes_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_world_sizes(text)


def test_unknown_model_and_mode_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet51'"):
        plan(MatrixOptions(models=("resnet51",)), NO_GPU, cpu_count=2)
    with pytest.raises(ValueError, match="unknown mode"):
        plan(MatrixOptions(modes=("zero",)), NO_GPU, cpu_count=2)
    with pytest.raises(ValueError, match="no CUDA device"):
        plan(MatrixOptions(device="cuda"), NO_GPU, cpu_count=2)


def test_case_id_is_stable_and_spec_round_trips() -> None:
    spec = plan(
        MatrixOptions(models=("resnet50",), modes=("ddp",), world_sizes=(4,)), GpuInventory(4, ("x",) * 4), 64
    )[0].spec
    assert spec.case_id == "resnet50-ddp-ws4-fp32-strong"
    assert spec.per_rank_batch == 64 and spec.global_batch == 256
    assert CaseSpec.from_dict(spec.to_dict()) == spec


def test_fault_spec_parsing() -> None:
    fault = FaultSpec.parse("raise,rank=1,phase=warmup,step=2")
    assert fault.applies(1, "warmup", 2) and not fault.applies(0, "warmup", 2)
    assert FaultSpec.parse("commdelay,ms=5").ms == 5.0
    with pytest.raises(ValueError, match="unknown fault"):
        FaultSpec.parse("explode")
    host = FaultSpec.parse("slow,ms=3,on=host")
    assert host.on == "host" and FaultSpec.parse("slow,ms=3").on == "device"
    with pytest.raises(ValueError, match="on='gpu'"):
        FaultSpec.parse("slow,ms=3,on=gpu")


def test_allreduce_reference_is_one_ddp_case_per_world_size_above_one() -> None:
    planned = plan(MatrixOptions(), NO_GPU, cpu_count=2)
    collective = [p for p in planned if p.spec.model.startswith("allreduce")]
    assert ids(collective) == ["allreduce_4m-ddp-ws2-fp32-strong"]
    assert collective[0].skip_reason is None  # a batch of 1 all-reduce need not split over ranks
    gpus = plan(MatrixOptions(), GpuInventory(8, ("NVIDIA H200",) * 8), cpu_count=64)
    sizes = {p.spec.world_size for p in gpus if p.spec.model == "allreduce_256m"}
    assert sizes == {2, 4, 8}
    one_gpu = [p for p in plan(MatrixOptions(), ONE_GPU, cpu_count=16) if p.spec.model == "allreduce_1m"]
    assert one_gpu and all("needs 2 CUDA devices" in (p.skip_reason or "") for p in one_gpu)


def test_bus_bandwidth_follows_nccl_tests() -> None:
    from scaleguard.evidence.metrics import bus_bandwidth

    assert bus_bandwidth(2**30, 0.5, 2) == (2**31, 2**31)  # n=2: busbw = algbw
    algbw, busbw = bus_bandwidth(2**30, 0.5, 8)
    assert busbw == pytest.approx(algbw * 1.75)
    with pytest.raises(ValueError):
        bus_bandwidth(2**20, 0.0, 2)


def test_no_overlap_bound_from_gradient_bytes_and_bus_bandwidth() -> None:
    from scaleguard.evidence.metrics import no_overlap_bound

    # 1 GB of gradients at 1 GB/s busbw over 2 ranks: 1 s of all-reduce; a 1 s ideal step
    comm, bound = no_overlap_bound(10**9, 1e9, 2, per_rank_batch=16, ws1_samples_per_s=16.0)
    assert comm == pytest.approx(1.0) and bound == pytest.approx(0.5)
    comm8, _ = no_overlap_bound(10**9, 1e9, 8, per_rank_batch=16, ws1_samples_per_s=16.0)
    assert comm8 == pytest.approx(1.75)  # 2(n-1)/n of the buffer crosses each link


def test_one_gpu_runner_threads_come_from_the_world_sizes_that_run() -> None:
    one = GpuInventory(1, ("NVIDIA H200",))
    planned = plan(MatrixOptions(), one, cpu_count=16)  # default world sizes 1, 2: 2 cannot run
    assert {p.spec.settings.threads_per_rank for p in planned} == {16}
    header = describe(planned, one)
    assert "16 threads per rank; world sizes run: 1" in header[0]
    assert header[1] == "scaleguard: world size 2 cannot run here: needs 2 CUDA devices, 1 visible"


def test_every_case_asks_its_own_question() -> None:
    eight = GpuInventory(8, ("NVIDIA H200",) * 8)
    planned = plan(MatrixOptions(), eight, cpu_count=128)
    specs = [p.spec for p in planned]
    assert not [s for s in specs if s.mode == "dp" and s.world_size == 1]  # single plus a wrapper
    loaders = [s for s in specs if s.inputs == "loader"]
    assert loaders and {(s.mode, s.precision, s.scaling) for s in loaders} == {("ddp", "bf16", "weak")}
    assert not [
        s for s in specs if s.model == "resnet50_cifar" and s.scaling == "weak" and s.inputs != "loader"
    ]
    assert len({s.case_id for s in specs}) == len(specs)


def test_a_collective_case_keeps_its_batch_of_one_a_training_case_must_split_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The matrix plans allreduce_4m ws2 with a global batch of 1 (one all-reduce is its sample);
    the step's reader on a cluster node refused that file (seen on the local Slurm)."""
    import json
    from dataclasses import replace

    from scaleguard.case import CaseSpec
    from scaleguard.schedule import torchrun_entry
    from tests.conftest import tiny_spec

    collective = replace(tiny_spec(model="allreduce_4m", world_size=2), global_batch=1)
    assert CaseSpec.from_dict(collective.to_dict()) == collective
    assert collective.batch_problem(collective=True) is None
    training = replace(tiny_spec(world_size=2), global_batch=1)
    assert training.batch_problem(collective=False) == "global_batch 1 does not split over 2 ranks"
    # where a case is run from its file, a training case that cannot split is refused, said
    path = tmp_path / "case.json"
    path.write_text(json.dumps(training.to_dict()))
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    assert torchrun_entry.main(["--spec", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "global_batch 1 does not split over 2 ranks" in capsys.readouterr().err
