"""Where the profiled step's device time is counted (a diagnostic for the anatomy's GPU busy
time and its "kernels outside any op" row): one profiled step of ResNet-50 (bs 256, bf16,
channels_last, DDP at world size 1) and of the GPT-2-small decoder, with every device event
summed by kind, against the union of the kernels' intervals and the step's wall time."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP


def report(name: str, step) -> None:  # type: ignore[no-untyped-def]
    for _ in range(15):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / 10 * 1e3
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        step()
        torch.cuda.synchronize()
    sums: Counter[str] = Counter()
    names: Counter[str] = Counter()
    for e in prof.key_averages():
        dev = not str(e.device_type).endswith("CPU")
        ann = bool(getattr(e, "is_user_annotation", False))
        us = float(e.self_device_time_total)
        sums[f"{'device' if dev else 'cpu-op'} {'annotation' if ann else 'event'}"] += us / 1e3
        if dev:
            names[f"{'[ann] ' if ann else ''}{e.key[:70]}"] += us / 1e3
    intervals = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if not str(e.device_type).endswith("CPU") and not getattr(e, "is_user_annotation", False)
    )
    union, end = 0.0, -1.0
    for a, b in intervals:
        if b > end:
            union += b - max(a, end)
            end = b
    print(f"== {name}: step {wall:.2f} ms (unprofiled, mean of 10)")
    for k, v in sorted(sums.items()):
        print(f"   {k:24s} {v:9.2f} ms")
    print(f"   union of kernel intervals {union / 1e3:9.2f} ms ({len(intervals)} device events)")
    for k, v in names.most_common(8):
        print(f"   {v:8.2f} ms  {k}")
    sys.stdout.flush()


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(256, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device=dev)

    def resnet_step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    report("resnet50 ddp ws1 bf16 bs256", resnet_step)
    del ddp, model, opt

    from scaleguard.workloads.builtins import get_model_def, synthetic_batches

    wl = get_model_def("gpt2_small")
    gpt = DDP(wl.build().to(dev), device_ids=[0])
    gopt = wl.optimizer(gpt.parameters())
    batches = synthetic_batches(wl, 32, dev, 0, channels_last=False)

    def gpt_step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = wl.loss(gpt, next(batches))
        loss.backward()
        gopt.step()
        gopt.zero_grad(set_to_none=True)

    report("gpt2_small ddp ws1 bf16 bs32", gpt_step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
