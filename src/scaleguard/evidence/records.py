"""What each rank writes: ``RankResult`` (its measured steps) and ``RankFailure`` (why it
stopped), and where a run's wall time went (``phase_breakdown``). The parent folds a run's rank
results into its one ``RunRecord`` (``evidence.runs``).

Both are read through the one validating reader in ``files`` (their fields declare their
readers); its names are imported from there, never through here (one import path each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from scaleguard.evidence.files import (
    Fields,
    read_flag,
    read_floats,
    read_ident,
    read_int,
    read_number,
    read_object,
    read_samples,
    read_scalars,
    read_text,
    read_version,
    read_versions,
    record_from_fields,
    record_to_dict,
    stored,
)
from scaleguard.schema import SCHEMA_VERSION

_RANK_FIX = "a scaleguard bug: report it with this file"


class RankPhase(str, Enum):
    """What a rank is doing, in order: the rank writes it to its status file (with a detail,
    "warmup step 3") and stamps when each began (``RankResult.phase_unix``); the parent reads
    the status of a hung rank, spares a rank lost in the anatomy, and splits the run's wall time
    by the stamps (``phase_breakdown``)."""

    START = "start"
    CONFIGURE = "configure"
    PROCESS_GROUP = "init_process_group"
    BUILD = "build model and batches"
    WARMUP = "warmup"
    MEASURE = "measuring"
    ANATOMY = "step anatomy"
    WRITING = "writing result"
    GATHERING = "gathering results on rank 0"
    DONE = "done"


@dataclass(frozen=True)
class RankResult:
    """What one rank measured, written by the rank to ``rank<k>.result.json``; the parent folds
    the ranks of a run into one ``RunRecord`` (``evidence.runs``)."""

    case_id: str = stored(read_ident)
    rank: int = stored(read_int(0, 1_000_000))
    step_s: tuple[float, ...] = stored(read_samples(1))
    warmup_step_s: tuple[float, ...] = stored(read_samples(0))
    steady: bool = stored(read_flag)
    final_loss: float = stored(read_number(-math.inf, math.inf))
    peak_mem_bytes: int = stored(read_int())
    mem_kind: str = stored(read_text)  # "cuda_max_allocated" or "host_max_rss"
    device_name: str = stored(read_text)
    runtime: dict[str, str | None] = stored(read_versions)  # torch/cuda/cudnn/nccl as the rank saw them
    settings: dict[str, Any] = stored(read_scalars)  # speed knobs as applied inside the rank
    # wall clock around the measured steps: GPU readings are filtered to this window
    measure_start_unix: float = stored(read_number(), default=0.0)
    measure_end_unix: float = stored(read_number(), default=0.0)
    phase_unix: dict[str, float] = stored(
        read_floats(0.0, 1e11), default_factory=dict
    )  # when each phase began
    anatomy: dict[str, Any] = stored(
        read_object, default_factory=dict
    )  # evidence.anatomy.Anatomy, as written
    anatomy_lost: str = stored(read_text, default="")  # why this rank has no anatomy though one was asked for
    pid: int = stored(read_int(), default=0)  # the rank's process: two runs of one case never share one
    process_runs_before: int = stored(read_int(), default=0)  # runs this process made before (0: fresh)
    flops_per_step: float = stored(read_number(0.0, 1e21), default=0.0)  # this process's training FLOPs
    # where it ran: node, bound CPUs, visible devices (UUIDs on GPU), what the Slurm step gave it
    placement: dict[str, Any] = stored(read_object, default_factory=dict)
    # a DDP run's projection inputs (ranks.overlap; evidence.projection.ScalingInputs, as written)
    scaling: dict[str, Any] = stored(read_object, default_factory=dict)
    schema_version: int = stored(read_version, default=SCHEMA_VERSION)

    def to_dict(self) -> dict[str, Any]:
        return record_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "rank result") -> RankResult:
        return record_from_fields(cls, Fields.of(data, where, _RANK_FIX))


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed, written by the rank to ``rank<k>.error.json`` before it exits."""

    case_id: str = stored(read_ident)
    rank: int = stored(read_int(0, 1_000_000))
    phase: str = stored(read_text)
    exc_type: str = stored(read_text)
    message: str = stored(read_text)
    traceback: str = stored(read_text)
    unix_time: float = stored(read_number())
    schema_version: int = stored(read_version, default=SCHEMA_VERSION)

    def to_dict(self) -> dict[str, Any]:
        return record_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "rank error") -> RankFailure:
        return record_from_fields(cls, Fields.of(data, where, _RANK_FIX))


_PHASES = frozenset(p.value for p in RankPhase)


def phase_breakdown(
    rank0: RankResult, spawned_unix: float, ended_unix: float, warmup_step_s: Sequence[float]
) -> dict[str, float]:
    """Seconds per phase of one run, from the parent's spawn to the ranks' exit (rank 0's
    clock; it waits for its peers at every collective). Missing stamps count as zero."""
    stamps = {RankPhase(k): v for k, v in rank0.phase_unix.items() if k in _PHASES}
    configure = stamps.get(RankPhase.CONFIGURE, spawned_unix)
    pg = stamps.get(RankPhase.PROCESS_GROUP, stamps.get(RankPhase.BUILD, configure))
    build = stamps.get(RankPhase.BUILD, pg)
    warm = stamps.get(RankPhase.WARMUP, rank0.measure_start_unix or build)
    first = float(warmup_step_s[0]) if warmup_step_s else 0.0
    anatomy_at = stamps.get(RankPhase.ANATOMY, rank0.measure_end_unix)
    writing = stamps.get(RankPhase.WRITING)
    phases = {
        "process start and imports": configure - spawned_unix,
        "settings and device init": pg - configure,
        "process group init": build - pg,
        "model and batches": warm - build,
        "first step": first,
        "warmup": rank0.measure_start_unix - warm - first,
        "measured steps": rank0.measure_end_unix - rank0.measure_start_unix,
        "step anatomy": (writing or anatomy_at) - anatomy_at,
        "result and teardown": ended_unix - (writing or rank0.measure_end_unix),
    }
    return {k: round(max(0.0, v), 4) for k, v in phases.items()}
