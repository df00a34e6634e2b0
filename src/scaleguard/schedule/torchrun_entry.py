"""Run one case under ``torchrun`` (one or many nodes); rank 0 writes the case record.

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 \\
        -m scaleguard.schedule.torchrun_entry --case resnet50-ddp-ws16-bf16-strong --out results/

then, on the node that holds ``results/``: ``scaleguard ingest results/*.case.json``. The case
is the same ``CaseSpec`` the pytest suite builds (same matrix, same id), so its numbers land in
the same records and baselines. torchrun's agent owns spawning and reaping here.

Rank 0 removes the case's old record before it starts and writes ``<case>.run.json`` (the run
id, state "running"); the record carries the same run id, and the marker turns "done" only
after the record is written. ``ingest`` refuses a record whose marker is missing, names another
run, or is not "done": a stale record of an earlier job, or one from a job that failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from scaleguard.case import MODES, CaseSpec
from scaleguard.evidence.files import Fields, FileFormatError, atomic_write_json, read_document
from scaleguard.evidence.runs import RunRecord, read_run_file
from scaleguard.machine.env import GpuInventory, gpu_inventory
from scaleguard.ranks import worker
from scaleguard.schedule.matrix import MatrixOptions, plan
from scaleguard.schema import SCHEMA_VERSION


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaleguard.schedule.torchrun_entry")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--case", help="case id, e.g. resnet50-ddp-ws16-bf16-strong")
    which.add_argument(
        "--spec",
        type=Path,
        help="the case as a JSON file (the session's own CaseSpec, as --perf-slurm writes it)",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the case record")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--profile", default="auto", choices=("auto", "smoke", "full"))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--threads-per-rank", type=int)
    parser.add_argument("--workloads", default="", help="your workloads, as --perf-workloads takes them")
    args = parser.parse_args(argv)
    _from_slurm(os.environ)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except KeyError as exc:
        print(
            f"scaleguard.schedule.torchrun_entry: {exc} is not set: start this module with torchrun or srun",
            file=sys.stderr,
        )
        return 2
    except ValueError:
        said = ", ".join(
            f"{k}={os.environ.get(k, '')[:40]!r}"
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        )
        print(
            f"scaleguard.schedule.torchrun_entry: the rank variables must be integers, got {said}: "
            "start this module with torchrun or srun",
            file=sys.stderr,
        )
        return 2
    if args.spec is not None:
        try:
            spec = CaseSpec.from_fields(
                Fields.of(
                    read_document(args.spec, "case file", _SPEC_FIX), f"case file {args.spec}", _SPEC_FIX
                )
            )
        except FileFormatError as exc:
            print(f"scaleguard.schedule.torchrun_entry: {exc}", file=sys.stderr)
            return 2
        from scaleguard.workloads.builtins import BUILTINS

        mdef = None if spec.workload else BUILTINS.get(spec.model)
        problem = spec.batch_problem(collective=mdef is not None and mdef.is_collective)
        if problem is not None:
            print(
                f"scaleguard.schedule.torchrun_entry: case file {args.spec}: {problem}; {_SPEC_FIX}",
                file=sys.stderr,
            )
            return 2
        gpus = gpu_inventory()
    else:
        planned_spec = _plan_case(args, world, local_world)
        if isinstance(planned_spec, int):
            return planned_spec
        spec, gpus = planned_spec
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
    # rank 0 alone writes the marker and the record, so only its id matters
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SCALEGUARD_RUN_ID", "torchrun")
    if rank == 0:
        run_id = _start_marker(args.out, spec.case_id, run_id)
    from scaleguard.ranks import faults

    job = worker.Job(
        spec, tuple(worker.RankFiles.in_dir(run_dir, r) for r in range(world)), faults.requested()
    )
    worker.run_job(
        job, worker.Membership(rank, world, local_rank, None), case_out=str(args.out), run_id=run_id
    )
    if rank == 0:
        _write_marker(args.out, spec.case_id, run_id, "done")
    # no process-group teardown: the work is done and written, and the caller exits at once
    # (a finished rank aborted in gloo's teardown at exit, "terminate called without an active
    # exception", and srun's --kill-on-bad-exit then failed a complete run)
    return 0


_SPEC_FIX = "the session writes it: run the case again from pytest --perf-slurm"


def _from_slurm(env: dict[str, str] | os._Environ[str]) -> None:
    """Under ``srun`` (one task per rank): torch's RANK/WORLD_SIZE/LOCAL_RANK from Slurm's. Slurm's
    win over a RANK already set (one exported in the login shell would make every task rank 0),
    except under torchrun, whose workers carry TORCHELASTIC_RUN_ID and their own ranks."""
    if "SLURM_PROCID" not in env or "TORCHELASTIC_RUN_ID" in env:
        return
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1"))
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    # SLURM_TASKS_PER_NODE is "2(x3),1": this node's share is what srun placed here
    per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_STEP_TASKS_PER_NODE", "")
    env["LOCAL_WORLD_SIZE"] = per_node.split("(")[0].split(",")[0] or env["WORLD_SIZE"]


def _plan_case(args: argparse.Namespace, world: int, local_world: int) -> tuple[CaseSpec, GpuInventory] | int:
    """The case named by ``--case``, planned here as the suite would plan it."""
    threads = args.threads_per_rank or max(1, (os.cpu_count() or 1) // local_world)
    options = MatrixOptions(
        device=args.device,
        profile=args.profile,
        modes=MODES,
        models=(args.case.split("-", 1)[0],),
        workloads=tuple(p for p in args.workloads.split(",") if p),
        world_sizes=(world,),
        steps=args.steps,
        warmup=args.warmup,
        threads_per_rank=threads,
    )
    gpus = gpu_inventory()
    # per node: the matrix checks devices against this node's GPUs, not the whole job's
    try:
        planned = plan(options, gpus, (os.cpu_count() or 1) * world // local_world)
    except ValueError as exc:  # a workload that does not import, an unknown model
        print(f"scaleguard.schedule.torchrun_entry: {exc}", file=sys.stderr)
        return 2
    matches = [p for p in planned if p.spec.case_id == args.case]
    if not matches:
        print(
            f"scaleguard.schedule.torchrun_entry: no case {args.case!r} at world size {world}",
            file=sys.stderr,
        )
        return 2
    return matches[0].spec, gpus


def record_path(out: Path, case_id: str) -> Path:
    return out / f"{case_id}.case.json"


def marker_path(out: Path, case_id: str) -> Path:
    return out / f"{case_id}.run.json"


def _write_marker(out: Path, case_id: str, run_id: str, state: str) -> None:
    atomic_write_json(
        marker_path(out, case_id),
        {"schema_version": SCHEMA_VERSION, "case_id": case_id, "run_id": run_id, "state": state,
         "unix_time": time.time()},
    )  # fmt: skip


def _start_marker(out: Path, case_id: str, job_id: str) -> str:
    """Remove the stale record, then mark this run as running; returns its unique id."""
    run_id = f"{job_id}-{uuid.uuid4().hex[:8]}"
    record_path(out, case_id).unlink(missing_ok=True)
    _write_marker(out, case_id, run_id, "running")
    return run_id


def read_finished_record(path: Path) -> tuple[CaseSpec, RunRecord]:
    """The case and run of a record that its own, finished run wrote; anything else is a clear
    error. The run's ``session`` is the job's run id (``SCALEGUARD_RUN_ID`` plus a suffix)."""
    fix = "run the case again with torchrun ... -m scaleguard.schedule.torchrun_entry"
    data = read_document(path, "torchrun record", fix)
    spec, run = read_run_file(data, f"torchrun record {path}", fix)
    marker = marker_path(path.parent, spec.case_id)
    try:
        state = Fields.of(read_document(marker, "run marker", fix), f"run marker {marker}", fix)
    except FileFormatError as exc:
        raise FileFormatError(f"{path}: its run marker is unusable ({exc}); not ingested") from None
    if state.text("run_id", optional=True) != run.session or not run.session:
        raise FileFormatError(
            f"{path}: stale record: it belongs to run {run.session or '(none)'}, but the last run of "
            f"{spec.case_id} in {path.parent} was {state.text('run_id', optional=True)}; {fix}"
        )
    if state.text("state", optional=True) != "done":
        raise FileFormatError(
            f"{path}: run {run.session} did not finish (marker state "
            f"{json.dumps(state.data.get('state'))}): a failed run is never judged; {fix}"
        )
    return spec, run


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's teardown of torch's threads (see main)
