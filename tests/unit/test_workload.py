"""The Workload contract: built-ins keep their case ids and baselines, FLOPs agree with the
published formulas, MFU needs a known peak."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from scaleguard.case import CaseSpec
from scaleguard.evidence.runs import config_of
from scaleguard.machine.env import GpuInventory
from scaleguard.schedule.matrix import MatrixOptions, plan
from scaleguard.workload import Registry, Workload, WorkloadError, check
from scaleguard.workloads.builtins import BUILTINS
from scaleguard.workloads.flops import _COUNTED, count_step_flops, peak_tflops

BASELINES = Path(__file__).parents[2] / "baselines"


@pytest.mark.parametrize(
    ("file", "gpus", "cores", "new_models"),
    [
        ("cpu-intel-r-xeon-r-processor-1t.json", GpuInventory(0, ()), 2, {"decoder_tiny"}),
        ("cpu-amd-epyc-1t.json", GpuInventory(0, ()), 2, set()),
        ("cuda-nvidia-h200-x1.json", GpuInventory(1, ("NVIDIA H200",)), 16, {"gpt2_small"}),
    ],
)
def test_built_in_case_ids_and_configs_still_match_the_committed_baselines(
    file: str, gpus: GpuInventory, cores: int, new_models: set[str]
) -> None:
    cases = json.loads((BASELINES / file).read_text())["cases"]
    runnable = [p.spec for p in plan(MatrixOptions(), gpus, cores) if p.skip_reason is None]
    old = [s for s in runnable if s.model not in new_models]
    assert old
    for spec in old:
        assert spec.case_id in cases, spec.case_id
        (entry,) = cases[spec.case_id].values()
        assert entry["config"] == config_of(spec.to_dict()), spec.case_id


def test_decoder_flops_agree_with_the_6n_plus_attention_formula() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    workload = BUILTINS["decoder_tiny"]
    model = workload.build()
    batch = workload.synthetic_batch(4, torch.Generator().manual_seed(0))
    _COUNTED.clear()
    flops = count_step_flops(("d", 4, "fp32", "cpu"), model, workload.loss, batch, contextlib.nullcontext())
    per_token = flops / (4 * workload.seq_len)
    formula = workload.formula_flops_per_token()
    # 6N counts biases and LayerNorm weights as matmul weights: 1.2 % of this tiny model's N
    assert per_token == pytest.approx(formula, rel=0.02)
    with sdpa_kernel(SDPBackend.MATH):  # the count is the same whichever attention kernel runs
        _COUNTED.clear()
        again = count_step_flops(
            ("d", 4, "fp32", "cpu"), model, workload.loss, batch, contextlib.nullcontext()
        )
    assert again == flops
    assert sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel() == workload.param_count()


def test_resnet50_counts_three_times_its_forward_flops() -> None:
    workload = BUILTINS["resnet50"]
    model = workload.build()
    batch = workload.synthetic_batch(1, torch.Generator().manual_seed(0))
    _COUNTED.clear()
    per_image = count_step_flops(
        ("r", 1, "fp32", "cpu"), model, workload.loss, batch, contextlib.nullcontext()
    )
    # commonly cited: 4.1 G multiply-adds (8.2 GFLOPs) forward, x3 for forward and backward
    assert per_image / 1e9 == pytest.approx(3 * 8.2, rel=0.02)


def test_mfu_needs_a_known_peak() -> None:
    assert peak_tflops("NVIDIA H200", "bf16") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0  # longest name first
    assert peak_tflops("AMD EPYC", "fp32") is None and peak_tflops("Quadro X", "bf16") is None
    assert peak_tflops("anything", "bf16", override=123.0) == 123.0


def test_a_workload_must_be_usable_before_any_rank_starts() -> None:
    class NoName(Workload):
        strong_global_batch = weak_per_rank_batch = 4

    class Fine(NoName):
        name = "fine"

    with pytest.raises(WorkloadError, match="name ''"):
        check(NoName, "x")
    assert check(Fine, "x").name == "fine"
    with pytest.raises(WorkloadError, match=r"not a scaleguard\.workload\.Workload"):
        check(object(), "x")
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        Registry().get("nope")


def _cpu_spec(model: str) -> CaseSpec:
    (case,) = [
        p.spec
        for p in plan(
            MatrixOptions(
                device="cpu",
                models=(model,),
                modes=("single",),
                world_sizes=(1,),
                scalings=("strong",),
                inputs=("synthetic",),
            ),
            GpuInventory(0, ()),
            2,
        )
        if p.skip_reason is None
    ][:1]
    return case


@pytest.mark.parametrize("name", ["resnet18_cifar", "decoder_tiny"])
def test_the_harness_counts_on_meta_what_a_real_forward_and_backward_computes(name: str) -> None:
    from scaleguard.ranks.worker import _step_flops

    spec = _cpu_spec(name)
    workload = BUILTINS[name]
    model = workload.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _COUNTED.clear()
    harness = _step_flops(workload, spec, model, torch.device("cpu"), contextlib.nullcontext)
    batch = workload.synthetic_batch(spec.per_rank_batch, torch.Generator().manual_seed(0))
    _COUNTED.clear()
    real = count_step_flops(("real", 0, "", "cpu"), workload.build(), workload.loss, batch, None, "cpu")
    assert harness == real > 0
    # the case's own model never ran: no gradients, no moved BatchNorm statistics
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


class _NeedsRealData(Workload):
    """A build that reads its tensors' values: it cannot run on the meta device."""

    name = "needs_real_data"
    sample = "rows"

    def build(self) -> torch.nn.Module:
        layer = torch.nn.Linear(16, 4)
        if float(layer.weight.detach().abs().sum()) < 0:  # .item() of a meta tensor raises
            raise AssertionError
        return layer

    def synthetic_batch(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return torch.randn(batch, 16, generator=generator), torch.randint(0, 4, (batch,), generator=generator)


def test_a_workload_that_cannot_run_on_meta_is_counted_on_its_device() -> None:
    from scaleguard.ranks.worker import _step_flops

    workload = _NeedsRealData()
    with pytest.raises(Exception):  # noqa: B017 - whatever meta raises, the harness falls back
        with torch.device("meta"):
            workload.build()
    spec = _cpu_spec("resnet18_cifar")
    model = workload.build()
    _COUNTED.clear()
    flops = _step_flops(workload, spec, model, torch.device("cpu"), contextlib.nullcontext)
    # forward 2·B·16·4, backward the weight gradient only (the input needs none)
    assert flops == 2 * spec.per_rank_batch * 16 * 4 * 2
    assert model.training and all(p.grad is None for p in model.parameters())


def test_a_pooled_rank_counts_a_key_once_and_builds_nothing_the_second_time() -> None:
    from scaleguard.ranks.worker import _step_flops

    spec = _cpu_spec("resnet18_cifar")
    workload = BUILTINS["resnet18_cifar"]
    _COUNTED.clear()
    first = _step_flops(workload, spec, workload.build(), torch.device("cpu"), contextlib.nullcontext)

    import copy

    def refuse(*args: object) -> object:
        raise AssertionError("built again (model or batch) for a key already counted")

    counted_already = copy.copy(workload)
    counted_already.build = refuse  # type: ignore[method-assign]
    counted_already.synthetic_batch = refuse  # type: ignore[method-assign]
    again = _step_flops(
        counted_already, spec, torch.nn.Linear(1, 1), torch.device("cpu"), contextlib.nullcontext
    )
    assert again == first > 0
