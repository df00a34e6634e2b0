"""Cross-check: time the GPT-2-small training step with a plain hand-written loop in one process
(nanoGPT's ``bench.py`` way), and compare with what the suite saved for the same step.

    python benchmarks/handwritten_decoder.py [--suite-json .benchmarks/.../0001_nightly.json]

Hand loop: one process, no scaleguard code: the model is written out here again (GPT-2 small:
12 pre-norm blocks, d 768, 12 heads, sequence 1024, vocabulary 50,304, tied head,
``scaled_dot_product_attention`` causal), bf16 autocast, TF32 on, AdamW(lr 3e-4, betas 0.9/0.95,
weight decay 0.1), one synthetic batch of token ids resident on the GPU, batch 32 (the suite's
strong batch at one device). It times ``--steps`` steps between two CUDA events after
``--warmup`` steps, ``--repeats`` times, and reports the median. Compared with the suite's
``gpt2_small-single-ws1-bf16-strong`` mean step (total time over steps: the like figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

CASE_ID = "gpt2_small-single-ws1-bf16-strong"
VOCAB, SEQ, D, HEADS, LAYERS, BATCH = 50304, 1024, 768, 12, 12, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def hand_tokens_per_s(warmup: int, steps: int, repeats: int) -> float:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Gpt().to(device)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=device)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    rates = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        rates.append(BATCH * SEQ * steps / (start.elapsed_time(end) / 1e3))
    return statistics.median(rates)


def suite_tokens_per_s(path: Path) -> dict[str, float] | None:
    for bench in json.loads(path.read_text())["benchmarks"]:
        info = bench["extra_info"]
        if info["case_id"] == CASE_ID:
            tokens = info["global_batch"] * SEQ
            return {"median": tokens / bench["stats"]["median"], "mean": tokens / bench["stats"]["mean"]}
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite-json", type=Path, help="a --benchmark-save JSON of the suite")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    hand = hand_tokens_per_s(args.warmup, args.steps, args.repeats)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"hand-written loop, GPT-2 small bs {BATCH} x {SEQ} bf16: {hand:,.0f} tokens/s")
    suite = suite_tokens_per_s(args.suite_json) if args.suite_json and args.suite_json.is_file() else None
    if suite:
        delta = (suite["mean"] - hand) / hand
        print(
            f"suite {CASE_ID}: {suite['median']:,.0f} tokens/s (median step), {suite['mean']:,.0f} (mean step); "
            f"mean vs hand {delta:+.2%} ({'within' if abs(delta) <= 0.01 else 'OUTSIDE'} 1 %)"
        )
    elif args.suite_json:
        print(f"{CASE_ID} is not in {args.suite_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
