"""The built-in workloads (``scaleguard.workload.Workload``): conv nets, a text classifier, a
GPT-style decoder, and the all-reduce references. ``smoke`` sizes run on 2 CPU cores, ``full``
on GPUs. They use the same interface a team's own workload does: the harness never branches on
which one it runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch import nn

from scaleguard.workloads.contract import Batch, Workload

__all__ = ["BUILTINS", "DEFAULT_MODELS", "Batch", "ModelDef", "get_model_def", "synthetic_batches"]


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


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class DecoderBlock(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A GPT-2-style causal decoder (pre-norm blocks, SDPA, tied token embedding and head)."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class ImageClassifier(Workload):
    """torchvision ResNets on random images (synthetic) or FakeData / CIFAR-10 (loader)."""

    sample = "images"
    modes = ("single", "dp", "ddp", "fsdp", "compile")
    inputs = ("synthetic", "loader")
    channels_last = True

    def __init__(
        self,
        name: str,
        depth: int,
        num_classes: int,
        image_px: int,
        strong: int,
        weak: int,
        profiles: tuple[str, ...],
        scalings: tuple[str, ...] = ("strong", "weak"),
    ) -> None:
        self.name, self.depth, self.num_classes, self.image_px = name, depth, num_classes, image_px
        self.strong_global_batch, self.weak_per_rank_batch = strong, weak
        self.profiles, self.scalings = profiles, scalings

    def build(self) -> nn.Module:
        import torchvision  # deferred: importing torchvision costs a second per process

        factory = {18: torchvision.models.resnet18, 50: torchvision.models.resnet50}[self.depth]
        return factory(weights=None, num_classes=self.num_classes)

    def synthetic_batch(self, batch: int, generator: torch.Generator) -> Batch:
        inputs = torch.randn(batch, 3, self.image_px, self.image_px, generator=generator)
        return inputs, torch.randint(0, self.num_classes, (batch,), generator=generator)

    def optimizer(self, params: object) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)  # type: ignore[arg-type]

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if type(m).__name__ in ("BasicBlock", "Bottleneck")]

    def loader_batches(self, batch: int, device: torch.device, rank: int, world: int, seed: int,
                       workers: int, data_root: str | None) -> Iterator[Batch]:  # fmt: skip
        return loader_batches(self, batch, device, rank, world, seed, workers, data_root)


class _TokenWorkload(Workload):
    """Token-id workloads: one constructor for their vocabulary, sequence and transformer size."""

    sample = "sequences"

    def __init__(
        self,
        name: str,
        vocab: int,
        seq_len: int,
        d_model: int,
        heads: int,
        layers: int,
        strong: int,
        weak: int,
        profiles: tuple[str, ...],
        precisions: tuple[str, ...] = ("fp32", "bf16"),
        scalings: tuple[str, ...] = ("strong", "weak"),
    ) -> None:
        self.name, self.vocab, self.seq_len = name, vocab, seq_len
        self.dims = (d_model, heads, layers)
        self.tokens_per_sample = seq_len
        self.strong_global_batch, self.weak_per_rank_batch = strong, weak
        self.profiles, self.precisions, self.scalings = profiles, precisions, scalings


class TextWorkload(_TokenWorkload):
    """A transformer encoder classifying token sequences."""

    def build(self) -> nn.Module:
        d_model, heads, layers = self.dims
        return TextClassifier(self.vocab, self.seq_len, d_model, heads, layers, num_classes=2)

    def synthetic_batch(self, batch: int, generator: torch.Generator) -> Batch:
        tokens = torch.randint(0, self.vocab, (batch, self.seq_len), generator=generator)
        return tokens, torch.randint(0, 2, (batch,), generator=generator)

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)]


class DecoderWorkload(_TokenWorkload):
    """Next-token prediction with a GPT-style decoder on synthetic token ids (bf16 autocast)."""

    modes = ("single", "ddp", "fsdp", "compile")  # nobody trains a decoder with DataParallel

    def build(self) -> nn.Module:
        d_model, heads, layers = self.dims
        return GPT(self.vocab, self.seq_len, d_model, heads, layers)

    def synthetic_batch(self, batch: int, generator: torch.Generator) -> Batch:
        tokens = torch.randint(0, self.vocab, (batch, self.seq_len + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch[0])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())

    def optimizer(self, params: object) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)  # type: ignore[arg-type]

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.modules() if isinstance(m, DecoderBlock)]

    def param_count(self) -> int:
        """Parameters as nanoGPT counts them (tied head once, position embedding left out)."""
        d, _, layers = self.dims
        block = 12 * d * d + 13 * d  # qkv + proj + mlp weights and biases, two LayerNorms
        return self.vocab * d + layers * block + 2 * d

    def formula_flops_per_token(self) -> float:
        """nanoGPT / PaLM: 6 N + 12 L H Q T (H Q = d), forward and backward."""
        d, _, layers = self.dims
        return 6 * self.param_count() + 12 * layers * d * self.seq_len


class Collective(Workload):
    """One all-reduce of ``message_bytes`` per step (scaleguard.ranks.collective): no model. One
    all-reduce is the "sample", so samples/s reads as all-reduces per second."""

    modes = ("ddp",)
    scalings = ("strong",)
    strong_global_batch = 1
    weak_per_rank_batch = 1

    def __init__(self, name: str, profile: str, mib: int) -> None:
        self.name, self.message_bytes, self.profiles = name, mib * 2**20, (profile,)


ModelDef = Workload  # the name the rest of the harness used before workloads


BUILTINS: dict[str, Workload] = {
    w.name: w
    for w in (
        ImageClassifier("resnet50", 50, 1000, 224, strong=256, weak=64, profiles=("full",)),
        # a 32-px ResNet-50 is host-launch-bound at any batch: its weak cases would repeat what
        # its strong ones ask (its loader case is weak, per device)
        ImageClassifier(
            "resnet50_cifar", 50, 10, 32, strong=512, weak=128, profiles=("full",), scalings=("strong",)
        ),
        # a GPU transformer is trained in bf16; its fp32 (TF32) matmuls are the conv nets' question too
        TextWorkload(
            "transformer",
            30522,
            256,
            512,
            8,
            6,
            strong=128,
            weak=32,
            profiles=("full",),
            precisions=("bf16",),
        ),
        # GPT-2 small's shape (124 M parameters with the 50,304 vocabulary nanoGPT pads to)
        DecoderWorkload(
            "gpt2_small",
            50304,
            1024,
            768,
            12,
            12,
            strong=32,
            weak=8,
            profiles=("full",),
            precisions=("bf16",),
        ),
        ImageClassifier("resnet18_cifar", 18, 10, 32, strong=32, weak=16, profiles=("smoke",)),
        TextWorkload("transformer_tiny", 1000, 64, 64, 4, 2, strong=32, weak=16, profiles=("smoke",)),
        DecoderWorkload(
            "decoder_tiny",
            512,
            64,
            64,
            4,
            2,
            strong=16,
            weak=8,
            profiles=("smoke",),
            precisions=("fp32",),
            scalings=("strong",),  # on 2 CPU cores the weak cases would ask the same again
        ),
        # message sizes: gradient-bucket size (DDP's default bucket is 25 MiB) and a link-bound
        # size on GPUs; one mid size on CPU, where gloo over loopback is memory-bound
        Collective("allreduce_4m", "smoke", 4),
        Collective("allreduce_1m", "full", 1),
        Collective("allreduce_32m", "full", 32),
        Collective("allreduce_256m", "full", 256),
    )
}
MODELS = BUILTINS

DEFAULT_MODELS: dict[str, tuple[str, ...]] = {
    "smoke": ("resnet18_cifar", "transformer_tiny", "decoder_tiny", "allreduce_4m"),
    "full": ("resnet50", "resnet50_cifar", "transformer", "gpt2_small", "allreduce_1m", "allreduce_32m",
             "allreduce_256m"),
}  # fmt: skip


def get_model_def(name: str) -> Workload:
    """A built-in workload by name (a user's: ``scaleguard.workloads.registry.Registry``)."""
    try:
        return BUILTINS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(BUILTINS))}") from None


def synthetic_batches(
    workload: Workload,
    batch: int,
    device: torch.device,
    seed: int,
    distinct: int = 4,
    channels_last: bool = False,
) -> Iterator[Batch]:
    """Cycle over a few distinct resident batches: random data, never zeros, no copies per step
    (4-d inputs laid out channels_last here, once, when the model runs that way)."""
    generator = torch.Generator().manual_seed(seed)
    pool = [tuple(t.to(device) for t in workload.synthetic_batch(batch, generator)) for _ in range(distinct)]
    if channels_last:
        pool = [tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in b)
                for b in pool]  # fmt: skip
    return itertools.cycle(pool)


def loader_batches(
    model: ImageClassifier,
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
