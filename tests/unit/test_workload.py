"""The Workload contract: built-ins keep their case ids and baselines, FLOPs agree with the
published formulas, MFU needs a known peak."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from scaleguard.env import GpuInventory
from scaleguard.evidence import config_of
from scaleguard.flops import _COUNTED, count_step_flops, peak_tflops
from scaleguard.matrix import MatrixOptions, plan
from scaleguard.models import BUILTINS
from scaleguard.workload import Registry, Workload, WorkloadError, check

BASELINES = Path(__file__).parents[2] / "baselines"


@pytest.mark.parametrize(
    ("file", "gpus", "cores", "new_models"),
    [
        ("cpu-intel-r-xeon-r-processor-1t.json", GpuInventory(0, ()), 2, {"decoder_tiny"}),
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
