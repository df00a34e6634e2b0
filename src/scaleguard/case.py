"""The frozen, picklable description of one benchmark case and its stable id."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from scaleguard.schema import READABLE_VERSIONS, SCHEMA_VERSION

Mode = Literal["single", "dp", "ddp", "fsdp", "compile"]
Precision = Literal["fp32", "bf16"]
Scaling = Literal["strong", "weak"]
Inputs = Literal["synthetic", "loader"]
Device = Literal["cpu", "cuda"]
Profile = Literal["smoke", "full"]

MODES: tuple[Mode, ...] = ("single", "dp", "ddp", "fsdp", "compile")
DISTRIBUTED_MODES = ("ddp", "fsdp", "compile")  # one process per rank
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16")
SCALINGS: tuple[Scaling, ...] = ("strong", "weak")
INPUTS: tuple[Inputs, ...] = ("synthetic", "loader")


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
    # step anatomy (scaleguard.anatomy): phased steps after the measured ones; 0 turns it off
    profile_steps: int = 3


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
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"CaseSpec schema_version {version!r} is not one of {READABLE_VERSIONS}")
        fields = dict(data)
        fields["settings"] = RunSettings(**fields["settings"])
        fields["schema_version"] = SCHEMA_VERSION
        return cls(**fields)
