"""Model and batch builders for each profile (``smoke`` runs on 2 CPU cores, ``full`` on GPUs)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ModelDef:
    """A model the suite knows: its input shape and the batch sizes of its two scaling modes."""

    name: str
    profile: Literal["smoke", "full"]
    kind: Literal["image", "tokens", "collective"]
    build: Callable[[], nn.Module]
    num_classes: int
    image_px: int = 0  # image models: square input side
    seq_len: int = 0  # token models: sequence length
    vocab: int = 0
    strong_global_batch: int = 0  # strong scaling: global batch split across ranks
    weak_per_rank_batch: int = 0  # weak scaling: batch per device
    message_bytes: int = 0  # collectives: bytes all-reduced per step (scaleguard.collective)
    # scalings with a question behind them: a 32-px ResNet-50 is host-launch-bound at any
    # batch, so its weak cases repeat what its strong ones ask
    scalings: tuple[str, ...] = ("strong", "weak")
    # precisions the default matrix measures (an explicit --perf-precisions overrides): a GPU
    # transformer is trained in bf16; its fp32 (TF32) matmuls are the conv nets' question too
    precisions: tuple[str, ...] = ("fp32", "bf16")

    @property
    def is_collective(self) -> bool:
        """Times a collective alone: ddp mode, world size >= 2, no batches, no weak scaling."""
        return self.kind == "collective"


class TextClassifier(nn.Module):
    """Transformer encoder over token ids, mean-pooled, then a linear head."""

    def __init__(
        self, vocab: int, seq_len: int, d_model: int, heads: int, layers: int, num_classes: int
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(1, seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, dropout=0.1, batch_first=True, norm_first=True
        )
        # enable_nested_tensor only matters with padding masks, which synthetic batches lack
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens) + self.pos)
        return self.head(self.norm(hidden.mean(dim=1)))


def _resnet(depth: int, num_classes: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision  # deferred: importing torchvision costs a second per process

        factory = {18: torchvision.models.resnet18, 50: torchvision.models.resnet50}[depth]
        return factory(weights=None, num_classes=num_classes)

    return build


def _no_model() -> nn.Module:
    raise TypeError("a collective case has no model (scaleguard.collective builds its step)")


def _allreduce(name: str, profile: Literal["smoke", "full"], mib: int) -> ModelDef:
    # one all-reduce is the "sample": samples/s reads as all-reduces per second
    return ModelDef(name, profile, "collective", _no_model, num_classes=0, strong_global_batch=1,
                    message_bytes=mib * 2**20)  # fmt: skip


def _text(vocab: int, seq_len: int, d_model: int, heads: int, layers: int) -> Callable[[], nn.Module]:
    return lambda: TextClassifier(vocab, seq_len, d_model, heads, layers, num_classes=2)


MODELS: dict[str, ModelDef] = {
    m.name: m
    for m in (
        ModelDef(
            "resnet50",
            "full",
            "image",
            _resnet(50, 1000),
            num_classes=1000,
            image_px=224,
            strong_global_batch=256,
            weak_per_rank_batch=64,
        ),
        ModelDef(
            "resnet50_cifar",
            "full",
            "image",
            _resnet(50, 10),
            num_classes=10,
            image_px=32,
            strong_global_batch=512,
            weak_per_rank_batch=128,
            scalings=("strong",),
        ),
        ModelDef(
            "transformer",
            "full",
            "tokens",
            _text(30522, 256, 512, 8, 6),
            num_classes=2,
            seq_len=256,
            vocab=30522,
            strong_global_batch=128,
            weak_per_rank_batch=32,
            precisions=("bf16",),
        ),
        ModelDef(
            "resnet18_cifar",
            "smoke",
            "image",
            _resnet(18, 10),
            num_classes=10,
            image_px=32,
            strong_global_batch=32,
            weak_per_rank_batch=16,
        ),
        ModelDef(
            "transformer_tiny",
            "smoke",
            "tokens",
            _text(1000, 64, 64, 4, 2),
            num_classes=2,
            seq_len=64,
            vocab=1000,
            strong_global_batch=32,
            weak_per_rank_batch=16,
        ),
        # message sizes: gradient-bucket size (DDP's default bucket is 25 MiB) and a link-bound
        # size on GPUs; one mid size on CPU, where gloo over loopback is memory-bound
        _allreduce("allreduce_4m", "smoke", 4),
        _allreduce("allreduce_1m", "full", 1),
        _allreduce("allreduce_32m", "full", 32),
        _allreduce("allreduce_256m", "full", 256),
    )
}

DEFAULT_MODELS: dict[str, tuple[str, ...]] = {
    "smoke": ("resnet18_cifar", "transformer_tiny", "allreduce_4m"),
    "full": ("resnet50", "resnet50_cifar", "transformer", "allreduce_1m", "allreduce_32m", "allreduce_256m"),
}


def get_model_def(name: str) -> ModelDef:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def synthetic_batch(model: ModelDef, batch: int, device: torch.device, generator: torch.Generator) -> Batch:
    """One random batch made on the host from a seeded generator, then moved to ``device``."""
    if model.kind == "image":
        inputs = torch.randn(batch, 3, model.image_px, model.image_px, generator=generator)
    else:
        inputs = torch.randint(0, model.vocab, (batch, model.seq_len), generator=generator)
    targets = torch.randint(0, model.num_classes, (batch,), generator=generator)
    return inputs.to(device), targets.to(device)


def synthetic_batches(
    model: ModelDef,
    batch: int,
    device: torch.device,
    seed: int,
    distinct: int = 4,
    channels_last: bool = False,
) -> Iterator[Batch]:
    """Cycle over a few distinct resident batches: random data, never zeros, no copies per step
    (image batches are laid out channels_last here, once, when the model runs that way)."""
    generator = torch.Generator().manual_seed(seed)
    pool = [synthetic_batch(model, batch, device, generator) for _ in range(distinct)]
    if channels_last and model.kind == "image":
        pool = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in pool]
    return itertools.cycle(pool)


def loader_batches(
    model: ModelDef,
    batch: int,
    device: torch.device,
    rank: int,
    world: int,
    seed: int,
    workers: int,
    data_root: str | None,
) -> Iterator[Batch]:
    """Batches through the real input pipeline: dataset -> DistributedSampler -> DataLoader.

    Uses a local CIFAR-10 under ``data_root`` when given (never downloads), else FakeData
    images decoded and converted per sample like a real dataset would be.
    """
    import torchvision
    from torch.utils.data import DataLoader, DistributedSampler

    if model.kind != "image":
        raise ValueError(f"the loader input pipeline exists for image models, not {model.name}")
    to_tensor = torchvision.transforms.ToTensor()
    dataset: torch.utils.data.Dataset[tuple[torch.Tensor, int]]
    if data_root is not None:
        if model.image_px != 32:
            raise ValueError(
                f"--perf-data-root holds CIFAR-10 (32 px); {model.name} takes {model.image_px} px"
            )
        dataset = torchvision.datasets.CIFAR10(data_root, train=True, download=False, transform=to_tensor)
    else:
        size = max(batch * world * 8, 512)
        dataset = torchvision.datasets.FakeData(
            size=size,
            image_size=(3, model.image_px, model.image_px),
            num_classes=model.num_classes,
            transform=to_tensor,
            random_offset=seed,
        )
    sampler: DistributedSampler[tuple[torch.Tensor, int]] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    loader = DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        persistent_workers=workers > 0,
    )

    def forever() -> Iterator[Batch]:
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            for inputs, targets in loader:
                yield (inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True))

    return forever()
