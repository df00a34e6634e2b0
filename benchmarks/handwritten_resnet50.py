"""Cross-check: time the ResNet-50 training step with a plain hand-written loop in one process,
and compare with what the suite saved for the same step.

    python benchmarks/handwritten_resnet50.py [--suite-json .benchmarks/.../0001_h200.json]

Hand loop: one process, no scaleguard code, the same settings the suite applies on CUDA
(cudnn.benchmark on, TF32 on, SGD lr=0.01 momentum=0.9, CrossEntropyLoss, random synthetic
batch resident on the GPU, channels_last for bf16). It times ``--steps`` steps between two CUDA
events after ``--warmup`` steps, ``--repeats`` times, and reports the median of the repeats.
Compared against the suite's cases ``resnet50-single-ws1-fp32-weak`` (64 per device) and
``resnet50-single-ws1-bf16-strong`` (global 256).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torchvision

CASES = {
    # name: (batch, bf16 autocast, channels_last, suite case id or None)
    # the blog-style fp32 loop (NCHW); the suite runs conv nets channels_last on CUDA, so its
    # fp32 case is compared with the channels_last row below, like with like
    "fp32-bs64": (64, False, False, None),
    "fp32-cl-bs64": (64, False, True, "resnet50-single-ws1-fp32-weak"),
    "bf16-cl-bs256": (256, True, True, "resnet50-single-ws1-bf16-strong"),
}


def hand_samples_per_s(
    batch: int, bf16: bool, channels_last: bool, warmup: int, steps: int, repeats: int
) -> float:
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = torchvision.models.resnet50(weights=None, num_classes=1000).to(device)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
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
        rates.append(batch * steps / (start.elapsed_time(end) / 1e3))
    return statistics.median(rates)


def suite_samples_per_s(path: Path) -> dict[str, dict[str, float]]:
    data = json.loads(path.read_text())
    found = {}
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        found[info["case_id"]] = {
            "median": info["global_batch"] / bench["stats"]["median"],
            "mean": info["global_batch"] / bench["stats"]["mean"],
        }
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite-json", type=Path, help="a --benchmark-save JSON of the suite")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    suite = suite_samples_per_s(args.suite_json) if args.suite_json else {}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(
        f"{'case':16} {'hand samples/s':>15} {'suite (median)':>15} {'suite (mean)':>13} {'delta (mean)':>13}"
    )
    worst = 0.0
    for name, (batch, bf16, channels_last, case_id) in CASES.items():
        hand = hand_samples_per_s(batch, bf16, channels_last, args.warmup, args.steps, args.repeats)
        torch.cuda.empty_cache()
        row = f"{name:16} {hand:15.1f}"
        if case_id in suite:
            med, mean = suite[case_id]["median"], suite[case_id]["mean"]
            # the hand loop divides total time by steps: the suite's mean is the like figure
            delta = (mean - hand) / hand
            worst = max(worst, abs(delta))
            row += f" {med:15.1f} {mean:13.1f} {delta:+13.2%}"
        print(row)
    if suite:
        print(f"largest |suite - hand| / hand: {worst:.2%} ({'within' if worst <= 0.02 else 'OUTSIDE'} 2 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
