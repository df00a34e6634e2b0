"""A team's own training step, guarded by scaleguard without a fork (README, "Guard your own
training step"). Copy this file next to your code, make ``build`` return your model and
``synthetic_batch`` a batch of the shapes you train on, then run::

    pytest perf/ --perf-workloads tinymlp:TinyMLP          # CPU (gloo) or GPU runner alike

The ranks import this module by that path themselves, so it must be importable where pytest
runs (this directory on ``PYTHONPATH``, or your package installed).
"""

from __future__ import annotations

import torch
from torch import nn

from scaleguard.workload import Workload


class ResidualMLP(nn.Module):
    def __init__(self, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class TinyMLP(Workload):
    name = "tinymlp"
    strong_global_batch = 64  # split over the ranks (strong scaling)
    weak_per_rank_batch = 32  # per rank (weak scaling)
    sample = "rows"
    modes = ("single", "ddp", "fsdp", "compile")
    precisions = ("fp32", "bf16")

    def build(self) -> nn.Module:
        return ResidualMLP(width=128, depth=4, classes=10)

    def synthetic_batch(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        features = torch.randn(batch, 128, generator=generator)
        return features, torch.randint(0, 10, (batch,), generator=generator)

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        features, labels = batch
        return nn.functional.cross_entropy(model(features), labels, label_smoothing=0.1)

    def optimizer(self, params: object) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=3e-4)  # type: ignore[arg-type]

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return list(model.blocks)  # each residual block its own FSDP2 unit
