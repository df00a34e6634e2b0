"""The frozen, picklable description of one benchmark case and its stable id."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal

from scaleguard.evidence.files import Fields
from scaleguard.schema import READABLE_VERSIONS, SCHEMA_VERSION

Mode = Literal["single", "dp", "ddp", "fsdp", "compile"]
Precision = Literal["fp32", "bf16"]
Scaling = Literal["strong", "weak"]
Inputs = Literal["synthetic", "loader"]
Device = Literal["cpu", "cuda"]
Profile = Literal["smoke", "full"]

MODES: tuple[Mode, ...] = ("single", "dp", "ddp", "fsdp", "compile")
DISTRIBUTED_MODES = ("ddp", "fsdp", "compile")  # one process per rank
PROJECTED_MODES = ("ddp", "fsdp")  # modes whose scaling evidence.projection projects from ws1
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16")
SCALINGS: tuple[Scaling, ...] = ("strong", "weak")
INPUTS: tuple[Inputs, ...] = ("synthetic", "loader")
DEVICES: tuple[Device, ...] = ("cpu", "cuda")
PROFILES: tuple[Profile, ...] = ("smoke", "full")
# a model name becomes part of case ids, test ids, file names and markdown rows
MODEL_NAME = re.compile(r"[A-Za-z0-9_.]{1,64}")
MAX_BATCH = 2**31
# a deliberate fault in every run of a case (ranks.faults reads it; --perf-inject-faults allows it)
FAULT_ENV = "SCALEGUARD_INJECT_FAULT"
FAULT_KINDS = ("raise", "sigkill", "hang", "exit0", "nan", "oom", "commdelay", "slow")


def fault_fields(text: str) -> dict[str, Any]:
    """The fields of a ``FAULT_ENV`` value (``kind,key=value,...``; ``ranks.faults.FaultSpec``
    holds them), or ValueError saying what is wrong. Torch-free: read at configure."""
    kind, *pairs = [p.strip() for p in text.split(",") if p.strip()] or [""]
    if kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
    values: dict[str, str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        values[key] = value
    unknown = set(values) - {"rank", "phase", "step", "ms", "pct", "at", "on"}
    if unknown:
        raise ValueError(f"{FAULT_ENV}: unknown keys {sorted(unknown)}")

    def number(key: str, kind: type, default: float) -> Any:
        try:
            return kind(values[key]) if key in values else default
        except ValueError:
            raise ValueError(f"{FAULT_ENV}: {key}={values[key][:20]!r} is not a number") from None

    def choice(key: str, allowed: tuple[str, ...]) -> str:
        value = values.get(key, allowed[0])
        if value not in allowed:
            raise ValueError(f"{FAULT_ENV}: {key}={value!r}; choose from {', '.join(allowed)}")
        return value

    return {
        "kind": kind,
        "rank": number("rank", int, 0) if "rank" in values else None,
        "phase": values.get("phase", "measure"),
        "step": number("step", int, 0),
        "ms": number("ms", float, 0.0),
        "pct": number("pct", float, 0.0),
        "at": choice("at", ("step", "backward")),
        "on": choice("on", ("device", "host")),
    }


# a workload is named by an import path, ``package.module:attribute`` (``#i``: the i-th of a list)
WORKLOAD_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*(#\d{1,4})?")


@dataclass(frozen=True)
class RunSettings:
    """Knobs that change speed; applied inside every rank and recorded with the result."""

    steps: int  # measured steps at least
    warmup_min: int
    warmup_max: int
    warmup_tolerance: float  # relative change of the running median that counts as "steady"
    threads_per_rank: int
    cudnn_benchmark: bool = True
    allow_tf32: bool = True
    channels_last: bool = False
    seed: int = 0
    loader_workers: int = 2
    data_root: str | None = None
    # adaptive sampling: after ``steps``, keep measuring in chunks until the median is pinned
    # (95 % CI half-width at most ``target_median_ci`` of it), at most ``max_steps`` steps and
    # ``max_measure_s`` seconds. 0 turns it off (exactly ``steps``).
    max_steps: int = 0
    max_measure_s: float = 0.0
    target_median_ci: float = 0.0
    # step anatomy (scaleguard.evidence.anatomy): phased steps after the measured ones; 0 turns it off
    profile_steps: int = 3
    # test mode (--perf-share-gpu): ranks share the visible GPUs round-robin over gloo, so the
    # multi-rank CUDA path runs on a one-GPU machine; never a scaling figure, never recorded
    shared_gpu: bool = False
    # nodes the case's ranks span (--perf-slurm); a two-node case is another configuration than
    # a one-node case of the same world size, and is never compared with it
    nodes: int = 1
    # world size 1 of a DDP group with larger world sizes planned to run: their per-rank batches
    # ("16,8"), at which it measures its compute for their projection (ranks.overlap); empty:
    # nothing to project (a one-GPU night), so nothing is measured
    projection_batches: str = ""

    def batches_to_project(self) -> tuple[int, ...]:
        return tuple(int(b) for b in self.projection_batches.split(",") if b.isdigit() and 0 < int(b) < 10**7)

    @classmethod
    def from_fields(cls, f: Fields) -> RunSettings:
        f.known(frozenset(x.name for x in dataclasses.fields(cls)))
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            optional = spec.default is not dataclasses.MISSING
            if spec.type == "int":
                value: Any = f.integer(spec.name, 0, 10**9, optional=optional)
            elif spec.type == "float":
                value = f.number(spec.name, 0.0, 1e9, optional=optional)
            elif spec.type == "bool":
                value = f.flag(spec.name, bool(spec.default)) if spec.name in f.data else None
            else:  # "str | None", "str"
                value = f.text(spec.name, optional=True)
                if value is not None and len(value) > 200:
                    raise f.fail(spec.name, "is longer than 200 characters")
            if value is not None:
                values[spec.name] = value
        settings = cls(**values)
        if settings.threads_per_rank < 1 or settings.steps < 1:
            raise f.fail("threads_per_rank", "and steps must be at least 1")
        return settings


@dataclass(frozen=True)
class CaseSpec:
    """One cell of the matrix: what to train, how to parallelise it, and how to time it.

    ``world_size`` is the number of devices the case uses: processes for ``ddp``/``fsdp``/``compile``,
    GPUs driven by one process for ``dp``; always 1 for ``single``.
    """

    model: str
    mode: Mode
    world_size: int
    precision: Precision
    scaling: Scaling
    inputs: Inputs
    device: Device
    profile: Profile
    global_batch: int
    settings: RunSettings
    schema_version: int = SCHEMA_VERSION
    # where the rank imports the workload from ("package.module:attr", "#i" for the i-th of a
    # list); empty for a built-in, found by ``model``
    workload: str = ""

    @property
    def case_id(self) -> str:
        """Readable id that stays stable across releases: pytest-benchmark matches runs by it."""
        parts = [self.model, self.mode, f"ws{self.world_size}", self.precision, self.scaling]
        if self.inputs != "synthetic":
            parts.append(self.inputs)
        return "-".join(parts)

    @property
    def group_id(self) -> str:
        """Cases that differ only in world size: the rows of one scaling table."""
        parts = [self.model, self.mode, self.precision, self.scaling]
        if self.inputs != "synthetic":
            parts.append(self.inputs)
        return "-".join(parts)

    @property
    def nprocs(self) -> int:
        """Processes to spawn: one per rank for ddp/fsdp, one driving all devices otherwise."""
        return self.world_size if self.mode in DISTRIBUTED_MODES else 1

    @property
    def per_rank_batch(self) -> int:
        """Samples one process feeds per step (DataParallel splits this further itself)."""
        return self.global_batch // self.nprocs

    @property
    def is_distributed(self) -> bool:
        return self.mode in DISTRIBUTED_MODES

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseSpec:
        return cls.from_fields(Fields.of(data, "case description", "a scaleguard bug: report it"))

    @classmethod
    def from_fields(cls, f: Fields) -> CaseSpec:
        """Every field checked for type and range: a record names the case it measured, and a
        wrong type here would surface as a traceback in whatever reads it next."""
        f.known(frozenset(x.name for x in dataclasses.fields(cls)))
        version = f.integer("schema_version", 0, 2**31)
        if version not in READABLE_VERSIONS:
            raise f.fail("schema_version", f"is {version!r}, not one of {READABLE_VERSIONS}")

        def choice(key: str, allowed: tuple[str, ...]) -> Any:
            value = f.string(key)
            if value not in allowed:
                raise f.fail(key, f"is {value[:40]!r}, not one of {', '.join(allowed)}")
            return value

        model = f.string("model")
        if not MODEL_NAME.fullmatch(model):
            raise f.fail("model", f"is {model[:40]!r}: model names are letters, digits, '_' and '.'")
        spec = cls(
            model=model,
            mode=choice("mode", MODES),
            world_size=int(f.integer("world_size", 1, 1_000_000) or 1),
            precision=choice("precision", PRECISIONS),
            scaling=choice("scaling", SCALINGS),
            inputs=choice("inputs", INPUTS),
            device=choice("device", DEVICES),
            profile=choice("profile", PROFILES),
            global_batch=int(f.integer("global_batch", 1, MAX_BATCH) or 1),
            settings=RunSettings.from_fields(f.obj("settings")),
            workload=f.text("workload", optional=True) or "",
        )
        if spec.workload and not WORKLOAD_REF.fullmatch(spec.workload):
            raise f.fail(
                "workload", f"is {spec.workload[:60]!r}, not an import path package.module:attribute"
            )
        if spec.mode == "single" and spec.world_size != 1:
            raise f.fail("world_size", f"is {spec.world_size}; a single-device case has world size 1")
        return spec

    def batch_problem(self, collective: bool) -> str | None:
        """Why this case cannot run its batch (None: it can). A bare collective (``collective``:
        the workload says so) has a batch of 1 that is never split; a training case's global
        batch must split over its ranks. Asked where a case is run, not where a record is read."""
        if self.is_distributed and self.global_batch % self.nprocs and not collective:
            return f"global_batch {self.global_batch} does not split over {self.nprocs} ranks"
        return None
