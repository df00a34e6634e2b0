"""Rank side: process group, device, speed settings, model wrapping, then the one timing loop.

``serve`` (a rank of a ``launcher.RankPool``) and ``run_job`` (one run of one case; torchrun
calls it directly) are top-level so the spawn start method can pickle them. A rank reports
through the files the parent named for it (``RankFiles``: result, error, status); the pipe of
a pool carries only the next job and "done", so a rank that dies or hangs never blocks the
parent, which watches the process as well as the pipe, with a deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import itertools
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaleguard.case import PROJECTED_MODES, CaseSpec
from scaleguard.evidence.anatomy import PHASES
from scaleguard.evidence.files import atomic_write_json, atomic_write_text
from scaleguard.evidence.records import RankFailure, RankPhase, RankResult
from scaleguard.evidence.steady import WarmupPolicy
from scaleguard.machine.env import cpu_model, runtime_versions
from scaleguard.machine.placement import bound_cpus, slurm_placement
from scaleguard.ranks import overlap, profiling, timing
from scaleguard.ranks.collective import build_allreduce_step
from scaleguard.ranks.faults import FaultSpec
from scaleguard.ranks.profiling import PhasedStep
from scaleguard.workloads.builtins import Batch, synthetic_batches
from scaleguard.workloads.contract import Workload
from scaleguard.workloads.flops import count_step_flops, counted
from scaleguard.workloads.registry import resolve

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankFiles:
    """Where one rank of one run writes; named by the parent (``launcher``), which reads them."""

    status: str  # last known activity, for the parent's timeout message
    result: str  # RankResult
    error: str  # RankFailure
    trace: str | None = None  # the anatomy's Chrome trace (rank 0)

    @classmethod
    def in_dir(cls, run_dir: Path, rank: int) -> RankFiles:
        return cls(
            status=str(run_dir / f"rank{rank}.status"),
            result=str(run_dir / f"rank{rank}.result.json"),
            error=str(run_dir / f"rank{rank}.error.json"),
            trace=str(run_dir / "trace.rank0.json") if rank == 0 else None,
        )


@dataclass(frozen=True)
class Job:
    """One run of one case, as the parent hands it to every rank that runs it."""

    spec: CaseSpec
    files: tuple[RankFiles, ...]  # by rank
    fault: str = ""  # SCALEGUARD_INJECT_FAULT as the parent saw it when it handed out the run
    index: int = 0  # runs these processes made before this one (0: fresh processes)


@dataclass(frozen=True)
class Membership:
    """Who this process is in its process group, and how it joins it."""

    rank: int
    world_size: int
    local_rank: int
    store_path: str | None  # a pool's FileStore file (a plain path: no URI that spaces, ``%``
    # or ``#`` could break); None: env:// under torchrun


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this rank when its parent dies: no orphans, even after
    ``kill -9`` of pytest. Linux only; elsewhere the parent's reaping is all there is."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)


class _Status:
    """Last known activity of this rank, for the parent's timeout message."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.phase = RankPhase.START.value
        self.stamps: dict[str, float] = {}  # when each phase began (unix): where start-up goes

    def set(self, phase: RankPhase, detail: str = "") -> None:
        self.phase = f"{phase.value} {detail}" if detail else phase.value
        self.stamps.setdefault(phase.value, time.time())
        atomic_write_text(self.path, f"{self.phase} (at {time.strftime('%H:%M:%S')})\n")


def _apply_settings(spec: CaseSpec) -> dict[str, Any]:
    """Speed knobs, set inside the rank (a spawned child inherits none of the parent's)."""
    s = spec.settings
    # a rank bound to fewer CPUs than the plan assumed (Slurm's -c with task/affinity) runs as
    # many threads as it has CPUs: more would time-share them and read as a slowdown
    threads = min(s.threads_per_rank, len(bound_cpus()))
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(max(1, min(4, threads)))
    except RuntimeError:
        pass  # already fixed once parallel work ran; recorded below as it really is
    torch.backends.cudnn.benchmark = s.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = s.allow_tf32
    torch.backends.cudnn.allow_tf32 = s.allow_tf32
    torch.manual_seed(s.seed)
    return {
        "threads_per_rank": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "channels_last": s.channels_last,
        "channels_last_weights": s.channels_last and spec.mode != "fsdp",
        "seed": s.seed,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }


def device_index(local_rank: int, visible: int, shared_gpu: bool) -> int:
    """Which visible CUDA device a rank takes. Every rank of a node sees the node's GPUs (a
    local pool, srun --gpus-per-node): cuda:LOCAL_RANK. A rank that sees exactly one (srun
    --gpus-per-task=1, --gpu-bind, a site's per-task binding): that one, cuda:0."""
    if shared_gpu or visible == 1:
        return local_rank % max(visible, 1)
    return local_rank


def _device_for(spec: CaseSpec, local_rank: int) -> torch.device:
    if spec.device == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    index = device_index(local_rank, count, spec.settings.shared_gpu)
    if count < (spec.world_size if spec.mode == "dp" else index + 1):
        raise RuntimeError(
            f"{spec.case_id}: rank needs cuda:{index}, but only {count} CUDA devices are visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def _wrap(model: nn.Module, spec: CaseSpec, device: torch.device, workload: Workload) -> nn.Module:
    """The only place modes differ: how the model is parallelised."""
    if spec.mode == "single":
        return model
    if spec.mode == "dp":
        return nn.DataParallel(model, device_ids=list(range(spec.world_size)))
    if spec.mode in ("ddp", "compile"):
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        # compile: torch.compile of the DDP module (its optimizer splits graphs at buckets);
        # compiling happens in the first steps: warmup, reported as "first step", never measured
        return torch.compile(ddp) if spec.mode == "compile" else ddp  # type: ignore[return-value]
    if spec.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in workload.fsdp_units(model):  # the workload says what its blocks are
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"unknown mode {spec.mode!r}")


def _batches(
    workload: Workload, spec: CaseSpec, device: torch.device, rank: int, channels_last: bool
) -> Iterator[Batch]:
    seed = spec.settings.seed + rank  # each rank its own data, like a real sampler gives
    if spec.inputs == "loader":
        world = spec.world_size if spec.is_distributed else 1
        return workload.loader_batches(
            spec.per_rank_batch,
            device,
            rank,
            world,
            seed,
            spec.settings.loader_workers,
            spec.settings.data_root,
        )
    return synthetic_batches(workload, spec.per_rank_batch, device, seed, channels_last=channels_last)


def build_train_step(
    spec: CaseSpec,
    device: torch.device,
    rank: int,
    instrument: Callable[[nn.Module], None] = lambda model: None,
) -> PhasedStep:
    """One full training step as a zero-argument closure returning the detached loss
    (``.step``), and the same step phase by phase for the anatomy (``.phases``). Everything
    model-specific comes from the case's workload; nothing here branches on which one."""
    workload = resolve(spec.model, spec.workload)
    torch.manual_seed(spec.settings.seed)  # identical initial weights on every rank
    model = workload.build().to(device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    channels_last = spec.settings.channels_last and workload.channels_last
    dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device.type, dtype=dtype, enabled=spec.precision == "bf16")

    batches = _batches(workload, spec, device, rank, channels_last)
    flops = _step_flops(workload, spec, model, device, autocast)
    # FSDP2 shards only contiguous parameters: conv weights stay NCHW there (inputs are still
    # channels_last, and cuDNN converts), so FSDP conv cases run instead of failing
    if channels_last and spec.mode != "fsdp":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    model = _wrap(model, spec, device, workload)
    instrument(model)  # the fault seam (faults.FaultSpec.instrument_model); nothing by default
    optimizer = workload.optimizer(model.parameters())
    # synthetic batches are laid out once when built; loader batches arrive NCHW every step,
    # and converting them is part of the input pipeline being measured
    convert = channels_last and spec.inputs == "loader"

    no_sync = _no_sync(model)

    def step(
        lap: Callable[[], None] | None = None, grad_sync: bool = True, take: int | None = None
    ) -> torch.Tensor:
        """One training step; returns the detached loss. The measured steps call it bare (no
        ``lap``: nothing synchronises, a few ``None`` checks cost well under a microsecond);
        the anatomy passes ``lap``, its phase boundary, and ``grad_sync=False`` for DDP's
        ``no_sync``, which spans forward and backward since DDP decides in forward whether the
        backward all-reduces. One body for both: the anatomy explains the step that is timed."""
        batch = next(batches)
        if take is not None:  # the first ``take`` samples: compute at a smaller per-rank batch
            batch = tuple(t[:take] if t.dim() > 0 else t for t in batch)
        if convert:
            batch = tuple(
                t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in batch
            )
        if lap:
            lap()
        with contextlib.nullcontext() if grad_sync or no_sync is None else no_sync():
            with autocast():
                loss = workload.loss(model, batch)
            if lap:
                lap()
            loss.backward()
        if lap:
            lap()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def phases(grad_sync: bool, take: int | None = None) -> dict[str, float]:
        # the device drained at every boundary: never a measured step (the boundaries cost
        # overlap), only compared with itself
        marks = [_drained(device)]

        def lap() -> None:
            marks.append(_drained(device))

        step(lap, grad_sync, take)
        lap()
        return {n: b - a for n, (a, b) in zip(PHASES, itertools.pairwise(marks), strict=True)}

    return PhasedStep(
        step, phases, can_skip_sync=no_sync is not None, grad_bytes=grad_bytes, flops_per_step=flops,
        model=model,
    )  # fmt: skip


def _step_flops(
    workload: Workload,
    spec: CaseSpec,
    model: nn.Module,
    device: torch.device,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> float:
    """FLOPs of one step, once per workload and batch: what the step computes, not how it is
    laid out. Counted on the meta device — a second model built there, no memory, no kernel —
    because a count on the rank's device is not free: its forward and backward leave large
    free blocks in the caching allocator, and cuDNN's autotune (``cudnn.benchmark``) only tries
    algorithms whose workspace fits the largest cached free block. Measured on the H200: with an
    on-device count before the first step, ``resnet50_cifar-ddp-ws1-fp32-strong`` picked
    workspace-hungry algorithms (peak 1.3 -> 11.0 GB, step 29.0 -> 15.8 ms) — a measurement of our
    count, not of what a user's loop runs — and the counts' own autotune of NCHW shapes cost
    ~160 s a night. A workload that cannot build or run on meta is counted on the device instead
    (its own batch, RNG restored, eval mode, gradients dropped), and the cached blocks are given
    back. Nothing is built when this process has counted the key already (a pooled rank)."""
    formula = workload.flops_per_sample()
    if formula:
        return formula * spec.per_rank_batch
    key = (spec.workload or spec.model, spec.per_rank_batch, spec.precision, device.type)
    known = counted(key)
    if known is not None:
        return known
    try:
        batch = workload.synthetic_batch(
            spec.per_rank_batch, torch.Generator().manual_seed(spec.settings.seed)
        )
    except NotImplementedError:
        return 0.0  # a loader-only workload without synthetic batches: no count, no MFU
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        try:
            meta_batch = tuple(t.to("meta") for t in batch)
            return count_step_flops(key, _on_meta(workload), workload.loss, meta_batch)
        except Exception:  # noqa: BLE001 - a build or loss that needs real data: count on the device
            pass
        model.eval()
        try:
            return count_step_flops(
                key, model, workload.loss, tuple(t.to(device) for t in batch), autocast(), device.type
            )
        finally:
            model.train()
            model.zero_grad(set_to_none=True)  # also when the count raised half-way
            if device.type == "cuda":
                torch.cuda.empty_cache()


def _on_meta(workload: Workload) -> nn.Module:
    with torch.device("meta"):
        return workload.build().to("meta")


def _drained(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _no_sync(model: nn.Module) -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
    """DDP's ``no_sync``; None where there is no gradient all-reduce to skip (single,
    DataParallel), no such switch (FSDP2), or where flipping it would recompile (a compiled
    model guards on DDP's sync flag: tens of seconds per run on the H200)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.no_sync
    return None


def _build_step(
    spec: CaseSpec, device: torch.device, rank: int, fault: FaultSpec | None
) -> tuple[Callable[[], torch.Tensor], PhasedStep | None]:
    """The case's step (a training step, or a bare collective, which has no anatomy); faults
    act through their seams."""
    workload = resolve(spec.model, spec.workload)
    phased = None
    if workload.is_collective:
        step = build_allreduce_step(spec, workload, device)  # no model: nothing to instrument
    else:
        # a fault for one rank instruments that rank's model only (a straggler, not a slow job)
        mine = fault is not None and fault.rank in (None, rank)
        phased = build_train_step(
            spec, device, rank, fault.instrument_model if fault and mine else lambda m: None
        )
        step = phased.step
    return (step if fault is None else fault.wrap_step(step, rank, device)), phased


def _anatomy(
    spec: CaseSpec, phased: PhasedStep | None, device: torch.device, files: RankFiles
) -> dict[str, Any]:
    """The step anatomy after the measured steps (``--perf-profile-steps``; 0: none)."""
    if phased is None or spec.settings.profile_steps <= 0:
        return {}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    trace = Path(files.trace) if files.trace else None
    return profiling.measure(phased, spec.settings.profile_steps, activities, trace).to_dict()


def _with_anatomy(
    result: RankResult,
    spec: CaseSpec,
    phased: PhasedStep | None,
    device: torch.device,
    rank: int,
    files: RankFiles,
    status: _Status,
    fault: FaultSpec | None,
) -> RankResult:
    """The measured result with the step anatomy added. The anatomy is a diagnosis of steps
    already measured: a failure in it costs the anatomy, never the run. So the measured result
    is written first, marked lost; a rank that dies in the anatomy (the profiler is native code
    beside gloo's threads) leaves that file, and the parent keeps the run (``launcher``)."""
    projected = (
        phased is not None
        and spec.mode in PROJECTED_MODES
        and (phased.can_skip_sync or spec.mode == "fsdp")  # FSDP has no all-reduce to skip
        and (spec.world_size > 1 or bool(spec.settings.batches_to_project()))
    )
    if phased is None or (spec.settings.profile_steps <= 0 and not projected):
        return result
    status.set(RankPhase.ANATOMY)
    provisional = replace(
        result, phase_unix=dict(status.stamps), anatomy_lost=f"rank {rank} stopped during the step anatomy"
    )
    atomic_write_json(Path(files.result), provisional.to_dict())
    try:
        if fault is not None and fault.applies(rank, "anatomy", 0):
            fault.fire(device)
        delay = fault.collective_delay_s() if fault is not None else 0.0
        scaling = overlap.measure(phased, device, spec, delay) if projected else {}
        return replace(result, scaling=scaling, anatomy=_anatomy(spec, phased, device, files))
    except Exception as exc:  # noqa: BLE001 - any failure here is the diagnosis's, not the run's
        return replace(result, anatomy_lost=f"rank {rank}: {type(exc).__name__}: {exc}"[:500])


def _reset_peak_memory(device: torch.device) -> None:
    """Peak memory is of this run's steps, even in a process that ran other cases before."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # Linux >= 4.0: "5" resets the peak resident set
        Path("/proc/self/clear_refs").write_text("5")


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    try:  # the peak resident set since _reset_peak_memory (KiB)
        status = Path("/proc/self/status").read_text()
        kib = int(status.split("VmHWM:", 1)[1].split()[0])
    except (OSError, IndexError, ValueError):  # no procfs: the process's lifetime peak (KiB on Linux)
        kib = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return kib * 1024, "host_max_rss"


def serve(member: Membership, parent_pid: int, jobs: Connection) -> None:
    """A rank of a pool (``launcher.RankPool``): runs the jobs the parent sends, one at a time,
    and answers each with its index, until the parent sends None or goes away. The process
    group is joined by the first distributed job and kept: later jobs skip process start,
    imports and process-group init, and build everything else fresh. A failed job exits the
    process (``run_job``): the parent then tears the whole pool down."""
    _die_with_parent(parent_pid)
    os.setpgid(0, 0)  # own group: the parent can kill this rank with its loader workers
    while True:
        try:
            job = jobs.recv()
        except (EOFError, OSError):
            break  # the parent closed the pipe: nothing more to run
        if job is None:
            break
        run_job(job, member)
        jobs.send(job.index)
        _release(job.spec)
    finish()


def finish() -> None:
    """Leave the process group (after the last job)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def run_job(job: Job, member: Membership, case_out: str | None = None, run_id: str = "") -> None:
    """One run of one case in this rank. Writes the result file, or the error file and exits
    the process at once (a process group whose peers are gone can block in teardown).

    Args:
        case_out: torchrun: rank 0 gathers every rank's result over the process group (ranks
            may sit on other nodes) and writes the folded run (``evidence.runs.run_file``) here.
        run_id: torchrun: the job's id, written into the record for ``ingest``.
    """
    spec, files = job.spec, job.files[member.rank]
    status = _Status(files.status)
    try:
        status.set(RankPhase.CONFIGURE)
        fault = FaultSpec.parse(job.fault) if job.fault else None
        settings = _apply_settings(spec)
        device = _device_for(spec, member.local_rank)
        if device.type != "cuda":
            # a CUDA build of torch on a machine without a GPU: Kineto's device probe would print
            # "gpuGetDeviceCount failed" and trace markers into every CPU run's output. Set
            # here, before gloo or the profiler start threads: setenv beside a thread reading
            # the environment is undefined behaviour in glibc
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        else:
            # Kineto leaves CUPTI attached after a profile unless told to tear it down, and an
            # attached CUPTI taxes every kernel launch for the rest of the process: on the H200
            # a launch-bound resnet50 bs-64 step went 22.5 -> 32-34 ms after one profiled step,
            # and pooled cases after a case's step anatomy ran +24 % to +76 % slow. Measured
            # steps must not pay for an earlier case's diagnosis (benchmarks/profiler_residue.py)
            os.environ.setdefault("TEARDOWN_CUPTI", "1")
        if spec.is_distributed and not dist.is_initialized():
            status.set(RankPhase.PROCESS_GROUP)
            _join(member, spec, device)
        status.set(RankPhase.BUILD)
        if fault is not None and fault.applies(member.rank, "setup", 0):
            fault.fire(device)
        step, phased = _build_step(spec, device, member.rank, fault)
        measured = _measure(spec, step, device, member.rank, fault, status)  # resets the peak
        peak, mem_kind = _peak_memory(device)  # of the measured steps: before the anatomy's
        result = RankResult(
            case_id=spec.case_id,
            rank=member.rank,
            step_s=measured.step_s,
            warmup_step_s=measured.warmup_step_s,
            steady=measured.steady,
            final_loss=measured.final_loss,
            peak_mem_bytes=peak,
            mem_kind=mem_kind,
            device_name=(torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()),
            runtime=runtime_versions(),
            settings=settings,
            measure_start_unix=measured.start_unix,
            measure_end_unix=measured.end_unix,
            phase_unix=dict(status.stamps),
            pid=os.getpid(),
            process_runs_before=job.index,
            flops_per_step=phased.flops_per_step if phased is not None else 0.0,
            placement=_placement(device),
        )
        result = _with_anatomy(result, spec, phased, device, member.rank, files, status, fault)
        status.set(RankPhase.WRITING)
        result = replace(result, phase_unix=dict(status.stamps))
        atomic_write_json(Path(files.result), result.to_dict())
        if result.anatomy_lost and spec.is_distributed and case_out is None:
            # a peer died in the anatomy: this process group is unusable and tearing it down
            # can block; the result is written, and the parent retires the pool
            status.set(RankPhase.DONE)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if case_out is not None:
            status.set(RankPhase.GATHERING)
            _write_case(spec, result, Path(case_out), run_id)
        status.set(RankPhase.DONE)
    except BaseException as exc:  # noqa: BLE001 - every failure, Ctrl-C too, is reported
        failure = RankFailure(
            case_id=spec.case_id,
            rank=member.rank,
            phase=status.phase,
            exc_type=type(exc).__name__,
            message=str(exc),
            traceback=traceback.format_exc(),
            unix_time=time.time(),
        )
        atomic_write_json(Path(files.error), failure.to_dict())
        sys.stderr.write(f"[scaleguard rank {member.rank}] {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(1)


def _placement(device: torch.device) -> dict[str, Any]:
    """This rank's node, bound CPUs, threads, and its device with its UUID (a GPU that two runs
    both called cuda:0 may be two different GPUs)."""
    facts = slurm_placement()
    facts["threads"] = torch.get_num_threads()
    if device.type == "cuda":
        facts["device"] = str(device)
        facts["gpu_uuid"] = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    return facts


def _join(member: Membership, spec: CaseSpec, device: torch.device) -> None:
    """Join the process group of ``member.world_size`` ranks (once per process)."""
    if member.store_path is not None and sys.platform.startswith("linux"):
        # single node: gloo's connections stay on loopback unless the user says otherwise
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    rendezvous: dict[str, Any] = (
        {"init_method": "env://"}
        if member.store_path is None
        else {"store": dist.FileStore(member.store_path, member.world_size)}  # type: ignore[attr-defined]
    )
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); gloo carries CUDA tensors
    nccl = spec.device == "cuda" and not spec.settings.shared_gpu
    dist.init_process_group(
        "nccl" if nccl else "gloo",
        rank=member.rank,
        world_size=member.world_size,
        timeout=datetime.timedelta(seconds=120),
        device_id=device if nccl else None,
        **rendezvous,
    )


def _measure(
    spec: CaseSpec,
    step: Callable[[], torch.Tensor],
    device: torch.device,
    rank: int,
    fault: FaultSpec | None,
    status: _Status,
) -> timing.MeasuredSteps:
    def before_step(phase: str, index: int) -> None:
        if phase == "warmup":
            status.set(RankPhase.WARMUP, f"step {index}")
        if fault is not None and fault.applies(rank, phase, index):
            fault.fire(device)

    def before_measure() -> None:
        status.set(
            RankPhase.MEASURE,
            f"{spec.settings.steps} steps (no per-step status, to keep the timed loop clean)",
        )
        # the peak of the measured steps, not of warmup: cuDNN's autotune (first steps) tries
        # algorithms with whatever workspace is free, and its trials' peak differs between
        # processes. Seen on two H100s: resnet50 ddp fp32 bs 64 peaked 10.6 GB in all 3 runs of
        # one machine against 5.8-5.9 GB on two others, its steps alike (29.9-35.2 vs ~30 ms):
        # a 10 % memory gate called it REGRESSED
        _reset_peak_memory(device)

    clock: timing.StepClock = timing.CudaEventClock() if device.type == "cuda" else timing.PerfCounterClock()
    return timing.measure(
        step,
        clock,
        WarmupPolicy.of(spec.settings),
        timing.Sampling(
            spec.settings.steps,
            spec.settings.max_steps,
            spec.settings.max_measure_s,
            spec.settings.target_median_ci,
        ),
        agree_max=_agree_max(spec, device),
        before_step=before_step,
        before_measure=before_measure,
    )


def _release(spec: CaseSpec) -> None:
    """Free what the last job built before the next one is measured in this process."""
    if spec.mode == "compile":
        torch._dynamo.reset()  # compiled graphs and guards of a model that is gone
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if sys.platform.startswith("linux"):
        # glibc keeps freed heap pages resident: without this, the next case's peak RSS would
        # carry this one's (measured: +8-10 % on the CPU transformer after a resnet18 case)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def _write_case(spec: CaseSpec, mine: RankResult, out: Path, run_id: str) -> None:
    """Rank 0 writes the whole run (all ranks folded), for ``scaleguard ingest``."""
    from scaleguard.evidence.runs import RunRecord, run_file

    ranks = [mine.to_dict()]
    if spec.is_distributed:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine.to_dict())
        ranks = gathered
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    run = replace(RunRecord.from_ranks(spec, [RankResult.from_dict(r) for r in ranks]), session=run_id)
    atomic_write_json(out / f"{spec.case_id}.case.json", run_file(spec, run))


def _agree_max(spec: CaseSpec, device: torch.device) -> Callable[[float], float]:
    """Max over ranks of a float (identity without a process group)."""
    if not spec.is_distributed:
        return lambda x: x

    def agree(value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    return agree
