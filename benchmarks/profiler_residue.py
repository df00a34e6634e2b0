"""Does running torch.profiler once leave a process slower? One process, resnet50 bs 64,
host-launch-bound: median step before the profiler, after a CPU-only profile, after a CUDA
profile (CUPTI), each over --steps steps (CUDA events around each step).

    python benchmarks/profiler_residue.py [--precision bf16] [--steps 100]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
import torchvision


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        with torch.autocast("cuda", torch.bfloat16, enabled=args.precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def median_ms(n: int) -> float:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        events[0].record()
        for i in range(n):
            step()
            events[i + 1].record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in itertools.pairwise(events))

    for _ in range(30):
        step()
    print(f"before any profiler: {median_ms(args.steps):.2f} ms")
    print(f"again:               {median_ms(args.steps):.2f} ms")
    acts = torch.profiler.ProfilerActivity
    for label, activities in (("CPU", [acts.CPU]), ("CPU+CUDA", [acts.CPU, acts.CUDA])):
        with torch.profiler.profile(activities=activities):
            step()
            torch.cuda.synchronize()
        median_ms(10)
        print(f"after a {label} profile: {median_ms(args.steps):.2f} ms")
        print(f"again:               {median_ms(args.steps):.2f} ms")


if __name__ == "__main__":
    main()
