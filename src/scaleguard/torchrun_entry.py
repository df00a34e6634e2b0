"""Run one case under ``torchrun`` (one or many nodes); rank 0 writes the case record.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 \\
        -m scaleguard.torchrun_entry --case resnet50-ddp-ws16-bf16-strong --out results/

then, on the node that holds ``results/``: ``scaleguard ingest results/*.case.json``. The case
is the same ``CaseSpec`` the pytest suite builds (same matrix, same id), so its numbers land in
the same records and baselines. torchrun's agent owns spawning and reaping here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scaleguard import worker
from scaleguard.case import MODES
from scaleguard.env import gpu_inventory
from scaleguard.matrix import MatrixOptions, plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaleguard.torchrun_entry")
    parser.add_argument("--case", required=True, help="case id, e.g. resnet50-ddp-ws16-bf16-strong")
    parser.add_argument("--out", required=True, type=Path, help="directory for the case record")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--profile", default="auto", choices=("auto", "smoke", "full"))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--threads-per-rank", type=int)
    args = parser.parse_args(argv)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except KeyError as exc:
        print(
            f"scaleguard.torchrun_entry: {exc} is not set: start this module with torchrun", file=sys.stderr
        )
        return 2
    threads = args.threads_per_rank or max(1, (os.cpu_count() or 1) // local_world)
    options = MatrixOptions(
        device=args.device,
        profile=args.profile,
        modes=MODES,
        models=(args.case.split("-", 1)[0],),
        world_sizes=(world,),
        steps=args.steps,
        warmup=args.warmup,
        threads_per_rank=threads,
    )
    gpus = gpu_inventory()
    # per node: the matrix checks devices against this node's GPUs, not the whole job's
    matches = [
        p
        for p in plan(options, gpus, (os.cpu_count() or 1) * world // local_world)
        if p.spec.case_id == args.case
    ]
    if not matches:
        print(f"scaleguard.torchrun_entry: no case {args.case!r} at world size {world}", file=sys.stderr)
        return 2
    spec = matches[0].spec
    if spec.device == "cuda" and local_world > gpus.count:
        print(
            f"{args.case}: needs {local_world} CUDA devices per node, {gpus.count} visible", file=sys.stderr
        )
        return 2
    if spec.nprocs != world:
        print(f"{args.case}: runs {spec.nprocs} processes, torchrun started {world}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / f"{spec.case_id}.ranks"
    run_dir.mkdir(exist_ok=True)
    worker.rank_main(
        rank, spec, "env://", str(run_dir), parent_pid=0, local_rank=local_rank, case_out=str(args.out)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
