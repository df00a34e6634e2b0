"""Environment fingerprint: what makes two runs' numbers comparable or not.

Everything here runs in the pytest process and must not initialise CUDA there (a CUDA context
in the parent wastes memory on GPU 0 and breaks fork-based tools); GPU facts come from
``nvidia-smi``, and the ranks report what only a CUDA context can tell.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

# torch is imported inside the functions that ask it: this module's types and key helpers are
# used by the CLI and the plugin at start-up, which must not pay torch's import (1-2 s)
from scaleguard.schema import SCHEMA_VERSION


@dataclass(frozen=True)
class GpuInventory:
    """CUDA devices visible to this process, probed without a CUDA context."""

    count: int
    names: tuple[str, ...]


def _nvidia_smi_names() -> tuple[str, ...] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    names = tuple(line.strip() for line in out.splitlines() if line.strip())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        # indices only; UUID lists are rare on runners and keep the full list
        picks = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        if picks:
            names = tuple(names[i] for i in picks if i < len(names))
    return names


@functools.cache
def gpu_inventory() -> GpuInventory:
    """Visible CUDA devices. ``torch.cuda.device_count`` asks NVML and creates no context."""
    import torch

    if not torch.cuda.is_available():
        return GpuInventory(0, ())
    count = torch.cuda.device_count()
    names = _nvidia_smi_names() or ()
    if len(names) != count:
        names = ("unknown-gpu",) * count
    return GpuInventory(count, names)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def slug(text: str) -> str:
    """Lower-case, dash-separated, filesystem-safe."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def runtime_versions(with_names: bool = False) -> dict[str, Any]:
    """torch/CUDA/cuDNN/NCCL versions (and GPU names) as this process sees them.

    May initialise CUDA: call it in ranks or in the probe child, never in the pytest process.
    """
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {
        "torch": torch.__version__,
        # the build: nightlies and local builds share a version string, never a sha
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
    }
    if torch.cuda.is_available():
        if torch.backends.cudnn.is_available():
            info["cudnn"] = str(torch.backends.cudnn.version())
        if dist.is_available() and dist.is_nccl_available():
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        if with_names:
            info["names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


_PROBE = (
    "import json; from scaleguard.machine.env import runtime_versions; "
    "print(json.dumps(runtime_versions(True)))"
)


@functools.cache
def cuda_runtime() -> dict[str, Any]:
    """CUDA, cuDNN and NCCL versions and GPU names, asked of a short-lived child process:
    the libraries' own version calls may initialise CUDA, which the pytest process must not."""
    import torch

    if gpu_inventory().count == 0:
        return {"cuda": None, "cudnn": None, "nccl": None, "names": []}
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        return {
            "cuda": torch.version.cuda,
            "cudnn": None,
            "nccl": None,
            "names": [],
            "error": f"CUDA probe failed: {exc}",
        }


def nccl_version() -> str | None:
    version = cuda_runtime().get("nccl")
    return None if version is None else str(version)


@dataclass(frozen=True)
class HostFingerprint:
    """Facts about this machine and its software that decide whether numbers compare."""

    torch: str
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    gpu_name: str | None
    gpu_count: int
    cpu_model: str
    cpu_count: int
    hostname: str
    python: str
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def host_fingerprint() -> HostFingerprint:
    import torch

    gpus = gpu_inventory()
    runtime = cuda_runtime()
    names = list(runtime.get("names") or gpus.names)
    return HostFingerprint(
        torch=torch.__version__,
        cuda=runtime.get("cuda"),
        cudnn=runtime.get("cudnn"),
        nccl=runtime.get("nccl"),
        gpu_name=names[0] if names else None,
        gpu_count=gpus.count,
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 1,
        hostname=platform.node(),
        python=platform.python_version(),
    )


@dataclass(frozen=True)
class DistributedCapabilities:
    """Whether this torch can run the suite, and with which backends."""

    distributed: bool
    gloo: bool
    nccl: bool
    nccl_version: str | None
    cuda_devices: int
    start_method: str

    def problems(self, device: str) -> list[str]:
        """What stops the suite from running on ``device``; empty when it can run."""
        found = []
        if not self.distributed:
            found.append("torch.distributed is not available in this torch build")
        if device == "cpu" and not self.gloo:
            found.append("the gloo backend is missing: CPU cases cannot run")
        if device == "cuda" and not self.nccl:
            found.append("the NCCL backend is missing: CUDA multi-GPU cases cannot run")
        if device == "cuda" and self.cuda_devices == 0:
            found.append("--perf-device cuda asked, but no CUDA device is visible")
        if self.start_method != "spawn" and "spawn" not in multiprocessing.get_all_start_methods():
            found.append("the spawn start method is unavailable")
        return found


def distributed_capabilities() -> DistributedCapabilities:
    import torch
    import torch.distributed as dist

    available = dist.is_available()
    return DistributedCapabilities(
        distributed=available,
        gloo=available and dist.is_gloo_available(),
        nccl=available and dist.is_nccl_available() and torch.cuda.is_available(),
        nccl_version=nccl_version(),
        cuda_devices=gpu_inventory().count,
        start_method="spawn",
    )
