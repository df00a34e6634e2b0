"""Which cases exist on this machine: models x modes x world sizes x precision x scaling x inputs.

A case that cannot run here is still listed, with the reason, so pytest shows it as skipped
before any process is spawned.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scaleguard.case import INPUTS, MODES, PRECISIONS, PROJECTED_MODES, SCALINGS, CaseSpec, RunSettings
from scaleguard.devices import defaults_for

if TYPE_CHECKING:
    from scaleguard.machine.env import GpuInventory


@dataclass(frozen=True)
class MatrixOptions:
    """The user's ``--perf-*`` choices; ``None`` means "the default for this machine"."""

    device: str = "auto"  # auto | cpu | cuda
    profile: str = "auto"  # auto | smoke | full
    world_sizes: tuple[int, ...] | None = None
    modes: tuple[str, ...] = ("single", "dp", "ddp")
    models: tuple[str, ...] | None = None
    precisions: tuple[str, ...] | None = None
    scalings: tuple[str, ...] = SCALINGS
    inputs: tuple[str, ...] = INPUTS
    steps: int | None = None
    warmup: int | None = None
    threads_per_rank: int | None = None
    data_root: str | None = None
    loader_workers: int | None = None
    profile_steps: int | None = None
    shared_gpu: bool = False  # test mode: ranks share the GPUs (gloo); never a scaling figure
    workloads: tuple[str, ...] = ()  # --perf-workloads: import paths of the user's workloads


@dataclass(frozen=True)
class PlannedCase:
    spec: CaseSpec
    skip_reason: str | None = None


def parse_csv(text: str, allowed: tuple[str, ...] | None = None, what: str = "value") -> tuple[str, ...]:
    items = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not items:
        raise ValueError(f"empty {what} list")
    if allowed is not None:
        bad = [i for i in items if i not in allowed]
        if bad:
            raise ValueError(f"unknown {what} {bad}; choose from {', '.join(allowed)}")
    return items


def parse_world_sizes(text: str) -> tuple[int, ...]:
    sizes = []
    for item in parse_csv(text, what="world size"):
        # ASCII digits: isdigit() passes "²", which int() refuses naming no option
        if not re.fullmatch(r"[0-9]{1,6}", item) or int(item) < 1:
            raise ValueError(f"world sizes are positive integers, got {item[:20]!r}")
        sizes.append(int(item))
    return tuple(sorted(set(sizes)))


def default_world_sizes(device: str, gpus: int) -> tuple[int, ...]:
    """CPU: 1 and 2. CUDA: 1, 2, 4, ... up to the device count, and the count itself.
    At least 1 and 2, so a one-GPU runner shows what it could not measure."""
    if device == "cpu":
        return (1, 2)
    sizes = {1, 2, max(gpus, 1)}
    size = 4
    while size <= gpus:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


def resolve_device(requested: str, gpus: GpuInventory) -> str:
    if requested == "auto":
        return "cuda" if gpus.count > 0 else "cpu"
    if requested == "cuda" and gpus.count == 0:
        raise ValueError("--perf-device cuda: no CUDA device is visible to this process")
    return requested


def plan(options: MatrixOptions, gpus: GpuInventory, cpu_count: int) -> list[PlannedCase]:
    """Every case the options ask for, in run order (world size ascending within a group,
    so world size 1 is measured before the cases whose speedup it anchors)."""
    device = resolve_device(options.device, gpus)
    defaults = defaults_for(device)
    profile = options.profile if options.profile != "auto" else defaults.profile
    # the workloads (torch) only when a plan is made: the options and their parsers above are
    # read at every pytest start, `pytest --help` included, and must not import torch
    from scaleguard.workloads.builtins import DEFAULT_MODELS
    from scaleguard.workloads.registry import Registry

    registry = Registry(options.workloads)  # WorkloadError (a ValueError) names a bad one
    # a team that names its own workloads wants them measured; built-ins by --perf-models
    models = options.models or tuple(registry.user) or DEFAULT_MODELS[profile]
    world_sizes = options.world_sizes or default_world_sizes(device, gpus.count)
    precisions = options.precisions or defaults.precisions
    for name, allowed in (
        ("mode", MODES),
        ("precision", PRECISIONS),
        ("scaling", SCALINGS),
        ("inputs", INPUTS),
    ):
        chosen = {
            "mode": options.modes,
            "precision": precisions,
            "scaling": options.scalings,
            "inputs": options.inputs,
        }[name]
        bad = [c for c in chosen if c not in allowed]
        if bad:
            raise ValueError(f"unknown {name} {bad}; choose from {', '.join(allowed)}")
    # threads per rank define a configuration: they come from the world sizes that can run
    # here, never from one that is listed only to show it cannot (ws2 on a one-GPU runner)
    runnable = [ws for ws in world_sizes if device == "cpu" or options.shared_gpu or ws <= gpus.count] or [1]
    threads = options.threads_per_rank or max(1, cpu_count // max(runnable))
    steps = options.steps or defaults.steps
    warmup_min = options.warmup or defaults.warmup_min
    settings = RunSettings(
        steps=steps,
        warmup_min=warmup_min,
        warmup_max=max(warmup_min * 4, warmup_min + 10),
        warmup_tolerance=defaults.warmup_tolerance,
        max_steps=steps * 4,
        max_measure_s=20.0,
        target_median_ci=defaults.target_median_ci,
        threads_per_rank=threads,
        channels_last=defaults.channels_last,
        loader_workers=options.loader_workers
        if options.loader_workers is not None
        else defaults.loader_workers,
        data_root=options.data_root,
        profile_steps=3 if options.profile_steps is None else options.profile_steps,
        shared_gpu=options.shared_gpu and device == "cuda",
    )
    planned: list[PlannedCase] = []
    combos = itertools.product(
        models, options.modes, precisions, options.scalings, options.inputs, world_sizes
    )
    for model_name, mode, precision, scaling, inputs, ws in combos:
        mdef = registry.get(model_name)
        if mode not in mdef.modes or (inputs not in mdef.inputs):
            continue
        if inputs == "loader" and scaling != "weak":
            continue  # the input pipeline is measured per device: image models, weak scaling
        if mdef.is_collective and (mode != "ddp" or scaling != "strong" or inputs != "synthetic" or ws < 2):
            continue  # a collective: one message size, one process per rank, at least two ranks
        if mode == "single" and ws != 1:
            continue
        if options.precisions is None and precision not in mdef.precisions:
            continue  # the model's default precisions; an explicit list is taken as asked
        if mode == "dp" and ws == 1:
            continue  # DataParallel around one device is `single` plus a wrapper: no question
        if scaling not in mdef.scalings and inputs != "loader" and not mdef.is_collective:
            continue
        if inputs == "loader" and (mode != "ddp" or (device == "cuda" and precision != "bf16")):
            # the input pipeline's question (DataLoader + DistributedSampler keeping up) is
            # asked once per model: one process per device, at the precision that feeds fastest
            continue
        global_batch = mdef.strong_global_batch if scaling == "strong" else mdef.weak_per_rank_batch * ws
        # values were validated against the Literal choices above
        fields: dict[str, Any] = dict(
            model=model_name,
            mode=mode,
            world_size=ws,
            precision=precision,
            scaling=scaling,
            inputs=inputs,
            device=device,
            profile=profile,
            global_batch=global_batch,
            settings=settings,
            workload=registry.ref_of.get(model_name, ""),
        )
        spec = CaseSpec(**fields)
        planned.append(PlannedCase(spec, _skip_reason(spec, gpus, cpu_count)))
    return _with_projection_batches(planned)


def _with_projection_batches(planned: list[PlannedCase]) -> list[PlannedCase]:
    """World size 1 of each DDP or FSDP group learns the per-rank batches of the group's larger
    world sizes that can run here, to measure its compute at each for their projection; a group
    with none (a one-GPU night) measures nothing for it."""
    batches: dict[str, set[int]] = {}
    for p in planned:
        if p.spec.mode in PROJECTED_MODES and p.spec.world_size > 1 and p.skip_reason is None:
            batches.setdefault(p.spec.group_id, set()).add(p.spec.per_rank_batch)
    out = []
    for p in planned:
        wanted = batches.get(p.spec.group_id)
        if p.spec.mode in PROJECTED_MODES and p.spec.world_size == 1 and wanted:
            text = ",".join(str(b) for b in sorted(wanted, reverse=True))
            p = dataclasses.replace(
                p,
                spec=dataclasses.replace(
                    p.spec, settings=dataclasses.replace(p.spec.settings, projection_batches=text)
                ),
            )
        out.append(p)
    return out


def describe(planned: list[PlannedCase], gpus: GpuInventory) -> list[str]:
    """The session header: world sizes that run and those that cannot, with the reason."""
    if not planned:
        return []
    spec = planned[0].spec
    sizes = sorted({p.spec.world_size for p in planned})
    ran = sorted({p.spec.world_size for p in planned if p.skip_reason is None})
    lines = [
        f"scaleguard: {spec.device} ({gpus.count} GPU{'s' if gpus.count != 1 else ''} visible), "
        f"profile {spec.profile}, {spec.settings.threads_per_rank} threads per rank; "
        f"world sizes run: {', '.join(map(str, ran)) or 'none'}"
    ]
    for ws in sizes:
        if ws in ran:
            continue
        reasons = sorted({p.skip_reason for p in planned if p.spec.world_size == ws and p.skip_reason})
        lines.append(f"scaleguard: world size {ws} cannot run here: {reasons[0] if reasons else 'no case'}")
    return lines


def _skip_reason(spec: CaseSpec, gpus: GpuInventory, cpu_count: int) -> str | None:
    """Why ``spec`` cannot run here, decided before any process is spawned."""
    if spec.mode == "dp" and spec.device != "cuda":
        return "DataParallel needs CUDA devices (>= 2 to parallelise); this run is on cpu"
    if spec.settings.shared_gpu and spec.mode == "dp":
        return "--perf-share-gpu runs one process per rank; DataParallel needs a device per replica"
    if spec.device == "cuda" and spec.world_size > gpus.count and not spec.settings.shared_gpu:
        # NCCL with two ranks on one GPU fails with "Duplicate GPU detected": never try
        return f"needs {spec.world_size} CUDA devices, {gpus.count} visible"
    if spec.device == "cpu" and spec.world_size * spec.settings.threads_per_rank > cpu_count:
        return (
            f"needs {spec.world_size} ranks x {spec.settings.threads_per_rank} threads, "
            f"{cpu_count} CPU cores: it would measure oversubscription, not scaling"
        )
    from scaleguard.workloads.builtins import BUILTINS

    mdef = BUILTINS.get(spec.model)
    if (mdef is None or not mdef.is_collective) and (
        spec.global_batch % spec.nprocs or (spec.mode == "dp" and spec.global_batch % spec.world_size)
    ):
        return f"global batch {spec.global_batch} does not split evenly over {spec.world_size} devices"
    if spec.inputs == "loader" and spec.settings.data_root and mdef is not None and mdef.image_px != 32:
        return f"--perf-data-root holds CIFAR-10 (32 px); {spec.model} takes {mdef.image_px} px"
    return None
