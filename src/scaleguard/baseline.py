"""Baselines on disk: one versioned JSON file per hardware fingerprint, entries per case and torch.

File ``baselines/<hardware key>.json``::

    {"schema_version": 1, "hardware_key": "cuda-nvidia-h200-x1", "hardware": {...},
     "cases": {"<case id>": {"<torch version>": {<CaseRecord>}, ...}, ...}}

The hardware key holds what makes numbers incomparable: the device model and count for CUDA
(NCCL), the CPU model and threads per rank for CPU (gloo). Files are parsed as JSON data only,
and written atomically; a file that cannot be read is reported and never rewritten.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scaleguard.env import HostFingerprint, slug
from scaleguard.records import CaseResult, atomic_write_json
from scaleguard.stats import StepSummary

SCHEMA_VERSION = 1


class BaselineError(RuntimeError):
    """A baseline file exists but cannot be used; the message names the file and the fix."""


def hardware_key(
    device: str, gpu_name: str | None, gpu_count: int, cpu_model: str, threads_per_rank: int
) -> str:
    """``cuda-<gpu model>-x<count>`` or ``cpu-<cpu model>-<threads per rank>t``."""
    if device == "cuda":
        return f"cuda-{slug(gpu_name or 'unknown-gpu')}-x{gpu_count}"
    return f"cpu-{slug(cpu_model)}-{threads_per_rank}t"


def host_hardware_key(host: HostFingerprint, device: str, threads_per_rank: int) -> str:
    return hardware_key(device, host.gpu_name, host.gpu_count, host.cpu_model, threads_per_rank)


@dataclass(frozen=True)
class CaseRecord:
    """One case's measurement in comparable form: from a live run, a baseline or a saved run."""

    case_id: str
    group_id: str
    world_size: int
    config: dict[str, Any]  # what must match for two records to be compared
    step_s: tuple[float, ...]  # raw slowest-rank step times, for the statistical test
    summary: StepSummary
    samples_per_s: float
    speedup: float | None
    scaling_efficiency: float | None
    peak_mem_bytes: int
    versions: dict[str, str | None]  # torch/cuda/cudnn/nccl
    recorded_at: str = ""
    commit: str | None = None
    throttled: bool = False
    schema_version: int = SCHEMA_VERSION

    @property
    def torch(self) -> str:
        return self.versions.get("torch") or "unknown"

    @classmethod
    def from_result(cls, result: CaseResult, commit: str | None = None) -> CaseRecord:
        spec = result.spec
        return cls(
            case_id=spec.case_id,
            group_id=spec.group_id,
            world_size=spec.world_size,
            config=config_of(spec.to_dict()),
            step_s=result.step_s,
            summary=result.summary,
            samples_per_s=result.samples_per_s,
            speedup=result.speedup,
            scaling_efficiency=result.scaling_efficiency,
            peak_mem_bytes=max(result.peak_mem_bytes),
            versions=dict(result.runtime),
            recorded_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            commit=commit,
            throttled=result.throttled,
        )

    @classmethod
    def from_benchmark(
        cls, bench: dict[str, Any], machine_info: dict[str, Any], commit: str | None
    ) -> CaseRecord:
        """From one entry of a pytest-benchmark ``--benchmark-save`` JSON written by scaleguard."""
        info = bench["extra_info"]
        samples = tuple(info.get("step_s") or bench["stats"].get("data") or ())
        if not samples:
            raise BaselineError(f"{bench.get('name')}: no per-step samples saved")
        return cls(
            case_id=info["case_id"],
            group_id=info["group_id"],
            world_size=info["world_size"],
            config=info["config"],
            step_s=samples,
            summary=StepSummary.of(samples),
            samples_per_s=info["samples_per_s"],
            speedup=info.get("speedup"),
            scaling_efficiency=info.get("scaling_efficiency"),
            peak_mem_bytes=max(info["peak_mem_bytes"]),
            versions=dict(info.get("runtime") or {"torch": machine_info.get("torch_version")}),
            recorded_at=str(machine_info.get("datetime", "")),
            commit=commit,
            throttled=bool(info.get("throttled", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseRecord:
        fields = dict(data)
        fields["step_s"] = tuple(fields["step_s"])
        fields["summary"] = StepSummary.from_dict(fields["summary"])
        return cls(**fields)


def config_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The parts of a case that change what is measured (not how long it is measured)."""
    settings = spec["settings"]
    return {
        "model": spec["model"],
        "mode": spec["mode"],
        "world_size": spec["world_size"],
        "precision": spec["precision"],
        "scaling": spec["scaling"],
        "inputs": spec["inputs"],
        "device": spec["device"],
        "profile": spec["profile"],
        "global_batch": spec["global_batch"],
        "threads_per_rank": settings["threads_per_rank"],
        "channels_last": settings["channels_last"],
        "cudnn_benchmark": settings["cudnn_benchmark"],
        "allow_tf32": settings["allow_tf32"],
    }


@dataclass
class BaselineFile:
    path: Path
    hardware_key: str
    hardware: dict[str, Any]
    cases: dict[str, dict[str, CaseRecord]] = field(default_factory=dict)

    def entry(self, case_id: str, torch_version: str | None) -> CaseRecord | None:
        """The record for ``case_id``: of ``torch_version`` if given, else the newest recorded."""
        by_torch = self.cases.get(case_id, {})
        if torch_version is not None:
            return by_torch.get(torch_version)
        if not by_torch:
            return None
        return max(by_torch.values(), key=lambda r: r.recorded_at)

    def merged(self, records: list[CaseRecord]) -> BaselineFile:
        """A copy with ``records`` added or replaced (per case and torch); others untouched."""
        cases = {cid: dict(by_torch) for cid, by_torch in self.cases.items()}
        for record in records:
            cases.setdefault(record.case_id, {})[record.torch] = record
        return BaselineFile(self.path, self.hardware_key, self.hardware, cases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "hardware_key": self.hardware_key,
            "hardware": self.hardware,
            "cases": {
                cid: {tv: rec.to_dict() for tv, rec in sorted(by_torch.items())}
                for cid, by_torch in sorted(self.cases.items())
            },
        }

    def save(self) -> None:
        atomic_write_json(self.path, self.to_dict())


def load(path: Path) -> BaselineFile | None:
    """Read a baseline file; ``None`` when there is none.

    Raises:
        BaselineError: the file is unreadable, not JSON, of another schema, or malformed.
    """
    if not path.exists():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"baseline {path}: cannot be read: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"baseline {path}: corrupt or truncated JSON ({exc.msg} at line {exc.lineno}, column "
            f"{exc.colno}). The file was left as it is; restore it from git "
            f"(git checkout -- {path}) or move it aside to record a new one."
        ) from exc
    if not isinstance(data, dict):
        raise BaselineError(f"baseline {path}: expected a JSON object, found {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        hint = (
            "it was written by a newer scaleguard: upgrade scaleguard (pip install -U scaleguard)"
            if newer
            else "move it aside and re-record with --perf-update-baselines"
        )
        raise BaselineError(
            f"baseline {path}: schema_version {version!r}, but this scaleguard reads {SCHEMA_VERSION}; {hint}"
        )
    try:
        cases = {
            cid: {tv: CaseRecord.from_dict(rec) for tv, rec in by_torch.items()}
            for cid, by_torch in data["cases"].items()
        }
        return BaselineFile(path, str(data["hardware_key"]), dict(data["hardware"]), cases)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(
            f"baseline {path}: malformed entry ({type(exc).__name__}: {exc}); the file was left as it is"
        ) from exc


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return out.stdout.strip() or None
