"""Records that cross a process or file boundary, and the one way they are written to disk.

Ranks write a ``RankResult`` or a ``RankFailure`` to their own file; the parent folds the
ranks into one ``CaseResult``. All are frozen, JSON-serialisable, and carry a schema version.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from scaleguard.case import CaseSpec
from scaleguard.stats import StepSummary, slowest_rank_steps

SCHEMA_VERSION = 1


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never a torn one.

    Temp file in the same directory (``os.replace`` is atomic only within a filesystem), fsync
    of the data, replace, then fsync of the directory so the rename itself survives a crash.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _check_version(kind: str, data: dict[str, Any]) -> None:
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{kind} schema_version {version!r}; this scaleguard reads {SCHEMA_VERSION}")


@dataclass(frozen=True)
class RankResult:
    """What one rank measured, written by the rank to ``rank<k>.result.json``."""

    case_id: str
    rank: int
    step_s: tuple[float, ...]
    warmup_step_s: tuple[float, ...]
    steady: bool
    final_loss: float
    peak_mem_bytes: int
    mem_kind: str  # "cuda_max_allocated" or "host_max_rss"
    device_name: str
    runtime: dict[str, str | None]  # torch/cuda/cudnn/nccl as the rank saw them
    settings: dict[str, Any]  # speed knobs as applied inside the rank
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        _check_version("RankResult", data)
        fields = dict(data)
        fields["step_s"] = tuple(fields["step_s"])
        fields["warmup_step_s"] = tuple(fields["warmup_step_s"])
        return cls(**fields)


@dataclass(frozen=True)
class RankFailure:
    """Why one rank failed, written by the rank to ``rank<k>.error.json`` before it exits."""

    case_id: str
    rank: int
    phase: str
    exc_type: str
    message: str
    traceback: str
    unix_time: float
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankFailure:
        _check_version("RankFailure", data)
        return cls(**data)


@dataclass(frozen=True)
class CaseResult:
    """One case as the suite reports it: the slowest rank per step, and what follows."""

    spec: CaseSpec
    step_s: tuple[float, ...]  # slowest rank per measured step
    summary: StepSummary
    samples_per_s: float
    peak_mem_bytes: tuple[int, ...]  # per rank
    mem_kind: str
    warmup_steps: int
    steady: bool
    device_name: str
    runtime: dict[str, str | None]
    settings: dict[str, Any]
    speedup: float | None = None  # samples/s over world size 1 of the same group
    scaling_efficiency: float | None = None
    notes: tuple[str, ...] = field(default=())
    machine_state: dict[str, Any] = field(default_factory=dict)  # NVML before/after, if any
    throttled: bool = False
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_ranks(cls, spec: CaseSpec, ranks: list[RankResult]) -> CaseResult:
        ranks = sorted(ranks, key=lambda r: r.rank)
        step_s = slowest_rank_steps([r.step_s for r in ranks])
        summary = StepSummary.of(step_s)
        notes = []
        if not all(r.steady for r in ranks):
            notes.append(
                f"warmup reached its cap of {spec.settings.warmup_max} steps before the step time settled"
            )
        return cls(
            spec=spec,
            step_s=step_s,
            summary=summary,
            samples_per_s=spec.global_batch / summary.median_s,
            peak_mem_bytes=tuple(r.peak_mem_bytes for r in ranks),
            mem_kind=ranks[0].mem_kind,
            warmup_steps=max(len(r.warmup_step_s) for r in ranks),
            steady=all(r.steady for r in ranks),
            device_name=ranks[0].device_name,
            runtime=ranks[0].runtime,
            settings=ranks[0].settings,
            notes=tuple(notes),
        )

    def with_reference(self, reference: CaseResult | None) -> CaseResult:
        """Speedup and scaling efficiency against the world-size-1 case of the same group.

        Strong scaling: efficiency = speedup / world size. Weak scaling: the global batch grows
        with world size, so the same samples/s ratio over world size reads the same way.
        """
        if reference is None or reference.spec.group_id != self.spec.group_id:
            return self
        speedup = self.samples_per_s / reference.samples_per_s
        return replace(self, speedup=speedup, scaling_efficiency=speedup / self.spec.world_size)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        _check_version("CaseResult", data)
        fields = dict(data)
        fields["spec"] = CaseSpec.from_dict(fields["spec"])
        fields["summary"] = StepSummary.from_dict(fields["summary"])
        fields["step_s"] = tuple(fields["step_s"])
        fields["peak_mem_bytes"] = tuple(fields["peak_mem_bytes"])
        fields["notes"] = tuple(fields["notes"])
        return cls(**fields)
