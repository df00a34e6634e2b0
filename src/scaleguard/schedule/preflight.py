"""The pre-flight of a Slurm allocation: one short step, one task per node, before any case runs.

Each node writes what it sees into the shared directory (``<node>.json``): the interpreter,
scaleguard's and torch's versions, the GPUs it was given (Slurm's ``CUDA_VISIBLE_DEVICES`` and,
where torch sees them, their names and UUIDs), its CPUs (model and the ones this task is bound
to), the CPU load of processes that are not this job's, and the machine-speed probe. The login
node reads every report back: a report that does not arrive means the directory is not shared.

From the reports come the session's hardware key (the compute nodes', never the login node's),
the refusal of a mixed allocation (nodes with other GPUs, CPUs or software, each named) and the
warnings for a slow or busy node. The node side imports no more than it needs: torch is imported
to read its version and the GPUs, never to run anything.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
SLOW_NODE = 0.85  # a node whose probe score is below 85 % of the nodes' median is named
BUSY_NODE_CORES = 0.5  # foreign load on a node that is named
PROBE_TIMEOUT_S = 20.0


def _foreign_cores(job: str | None, seconds: float = 1.0) -> float | None:
    """CPU used on this node by processes that are not this job's, over ``seconds``."""
    from scaleguard.machine.foreign_load import _TICKS, read_proc

    first = read_proc()
    time.sleep(seconds)
    second = read_proc()
    if first is None or second is None:
        return None
    busy = 0.0
    for pid, ticks in second.cpu_ticks.items():
        delta = ticks - first.cpu_ticks.get(pid, ticks)
        if delta <= 0 or pid == os.getpid():
            continue
        if job and _of_job(pid, job):
            continue
        busy += delta / _TICKS
    return busy / max(second.unix_time - first.unix_time, 1e-3)


def _of_job(pid: int, job: str) -> bool:
    """Whether a process belongs to Slurm job ``job`` (its environment, read bounded)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read(1 << 20)
    except OSError:
        return False
    return f"SLURM_JOB_ID={job}".encode() in environ.split(b"\0")


def node_report() -> dict[str, Any]:
    """What this node sees (runs on the node, inside the pre-flight step)."""
    import platform

    from scaleguard.machine.env import cpu_model
    from scaleguard.machine.placement import slurm_placement

    report: dict[str, Any] = {
        "schema_version": SCHEMA,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "hostname": socket.gethostname(),
        "python": sys.executable,
        "python_version": platform.python_version(),
        "scaleguard": _version(),
        "cpu_model": cpu_model(),
        "placement": slurm_placement(),
        "unix_time": time.time(),
    }
    try:
        import torch

        report["torch"] = torch.__version__
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        report["gpus"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "uuid": str(getattr(torch.cuda.get_device_properties(i), "uuid", "")),
            }
            for i in range(count)
        ]
    except Exception as exc:  # noqa: BLE001 - a node whose torch does not import is named, not a traceback
        report["torch"] = None
        report["torch_error"] = f"{type(exc).__name__}: {exc}"[:500]
        report["gpus"] = []
    report["foreign_cores"] = _foreign_cores(os.environ.get("SLURM_JOB_ID"))
    from scaleguard.machine.probe import run_probe

    speed = run_probe(timeout_s=PROBE_TIMEOUT_S, rounds=1)
    report["machine"] = speed.to_dict() if speed is not None else {}
    return report


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scaleguard")
    except PackageNotFoundError:  # run from a source tree (PYTHONPATH=src)
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scaleguard.schedule.preflight")
    parser.add_argument("--out", required=True, type=Path, help="the shared directory for <node>.json")
    args = parser.parse_args(argv)
    from scaleguard.evidence.files import atomic_write_json

    report = node_report()
    args.out.mkdir(parents=True, exist_ok=True)
    # the node's name as Slurm gave it; never a path of its own
    atomic_write_json(args.out / f"{Path(str(report['node'])).name or 'node'}.json", report)
    return 0


# -- the login node's side -------------------------------------------------------------------


class PreflightError(RuntimeError):
    """The allocation cannot run the session as asked: the message names the nodes and why."""


@dataclass(frozen=True)
class NodeReport:
    node: str
    hostname: str  # several Slurm nodes on one host (a test cluster) probe side by side
    python_version: str
    scaleguard: str
    torch: str | None
    torch_error: str
    cpu_model: str
    gpus: tuple[str, ...]  # torch's names of the GPUs this node's task saw
    gpu_uuids: tuple[str, ...]
    cuda_visible_devices: str | None
    gres: str | None  # the GRES Slurm allocated on this node ("gpu:h100:8(IDX:0-7)")
    cpus: str
    foreign_cores: float | None
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float | None:
        value = self.machine.get("score")
        return float(value) if isinstance(value, int | float) else None

    @property
    def gpu_kind(self) -> str:
        """What the node's GPUs are, as far as anyone can tell: torch's names, else the GRES type."""
        if self.gpus:
            names = sorted(set(self.gpus))
            return " + ".join(f"{self.gpus.count(n)}x {n}" for n in names)
        if self.gres:
            return self.gres.split("(")[0]
        return "no GPU"

    @classmethod
    def from_dict(cls, data: dict[str, Any], gres: str | None, where: str) -> NodeReport:
        from scaleguard.evidence.files import Fields, inert

        # every text here was written on a node (its environment, its torch, its GPUs' names)
        # and reaches the terminal: made inert and bounded once, here
        def text(value: object, limit: int = 200) -> str:
            return inert(str(value)[:limit])

        f = Fields.of(data, where, "a scaleguard bug (the pre-flight wrote it)")
        raw_gpus, raw_placement, raw_machine = data.get("gpus"), data.get("placement"), data.get("machine")
        gpus: list[Any] = raw_gpus if isinstance(raw_gpus, list) else []
        placement: dict[str, Any] = raw_placement if isinstance(raw_placement, dict) else {}
        machine: dict[str, Any] = raw_machine if isinstance(raw_machine, dict) else {}
        foreign = data.get("foreign_cores")
        return cls(
            node=text(f.string("node")),
            hostname=text(data.get("hostname") or ""),
            python_version=text(f.string("python_version")),
            scaleguard=text(f.string("scaleguard")),
            torch=None if (t := f.text("torch", optional=True)) is None else text(t),
            torch_error=text(data.get("torch_error") or "", 500),
            cpu_model=text(f.string("cpu_model")),
            gpus=tuple(text(g.get("name", "?"), 100) for g in gpus[:64] if isinstance(g, dict)),
            gpu_uuids=tuple(text(g.get("uuid", ""), 100) for g in gpus[:64] if isinstance(g, dict)),
            cuda_visible_devices=(
                text(placement["cuda_visible_devices"]) if "cuda_visible_devices" in placement else None
            ),
            gres=None if gres is None else text(gres),
            cpus=text(placement.get("cpus", "")),
            foreign_cores=float(foreign) if isinstance(foreign, int | float) else None,
            machine=machine,
        )


@dataclass(frozen=True)
class Preflight:
    """Every node's report, checked: the allocation is one kind of node and runs the session."""

    reports: tuple[NodeReport, ...]
    warnings: tuple[str, ...]

    @property
    def one_host(self) -> bool:
        """Several nodes are one machine (slurmd -N on one host): their probes competed."""
        return len({r.hostname for r in self.reports}) < len(self.reports)

    @property
    def cpu_model(self) -> str:
        return self.reports[0].cpu_model

    @property
    def gpu_name(self) -> str | None:
        """The nodes' GPU as the key names it: torch's name, else the GRES type."""
        first = self.reports[0]
        if first.gpus:
            return first.gpus[0]
        if first.gres and first.gres.startswith("gpu:"):
            parts = first.gres.split("(")[0].split(":")
            return parts[1] if len(parts) == 3 else None
        return None

    def slowest_machine(self) -> dict[str, Any]:
        """The slowest node's probe: a step over several nodes runs at its slowest node's pace."""
        scored = [r for r in self.reports if r.score is not None]
        if not scored:
            return {}
        # nodes of one host probed side by side: the best reading is the host's own
        pick = max if self.one_host else min
        return dict(pick(scored, key=lambda r: r.score or 0.0).machine)

    def lines(self) -> list[str]:
        """What the header says of the nodes: one line per kind, then each warning."""
        first = self.reports[0]
        nodes = ",".join(r.node for r in self.reports)
        gpus = first.gpu_kind
        visible = first.cuda_visible_devices
        out = [
            f"pre-flight on {len(self.reports)} node(s) {nodes}: python {first.python_version}, "
            f"scaleguard {first.scaleguard}, torch {first.torch}; {first.cpu_model}; GPUs {gpus}"
            + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible else "")
        ]
        scores = ", ".join(
            f"{r.node} {r.score:.2f}" + (f"/{r.foreign_cores:.2f} foreign cores" if r.foreign_cores else "")
            for r in self.reports
            if r.score is not None
        )
        if scores:
            out.append(f"pre-flight machine speed per node: {scores}")
        return out + list(self.warnings)


def check(reports: Sequence[NodeReport], device: str, gpus_per_node: int) -> Preflight:
    """Refuse what cannot give a fair session; warn of what may disturb one.

    Raises:
        PreflightError: nodes with other software, other GPUs (or too few), other CPUs on a CPU
            session; each node named with what it has.
    """
    if not reports:
        raise PreflightError("no node reported")

    def differ(what: str, value: Any) -> None:
        seen: dict[Any, list[str]] = {}
        for r in reports:
            seen.setdefault(value(r), []).append(r.node)
        if len(seen) > 1:
            said = "; ".join(f"{','.join(nodes)}: {v}" for v, nodes in seen.items())
            raise PreflightError(f"a mixed allocation ({what} differ): {said}")

    broken = [r for r in reports if r.torch is None]
    if broken:
        said = "; ".join(f"{r.node}: {r.torch_error or 'torch does not import'}" for r in broken)
        raise PreflightError(f"torch does not import on every node ({said})")
    differ("Python versions", lambda r: r.python_version)
    differ("scaleguard versions", lambda r: r.scaleguard)
    differ("torch versions", lambda r: r.torch)
    if gpus_per_node:
        # what each node was given first (its own fault), then whether the nodes agree
        for r in reports:
            given = len([d for d in (r.cuda_visible_devices or "").split(",") if d.strip()])
            if given < gpus_per_node:
                raise PreflightError(
                    f"{r.node} was given {given} GPU(s) (CUDA_VISIBLE_DEVICES="
                    f"{r.cuda_visible_devices or 'unset'}), the session asked for {gpus_per_node}"
                )
            if device == "cuda" and len(r.gpus) < gpus_per_node:
                raise PreflightError(
                    f"{r.node}: torch sees {len(r.gpus)} CUDA device(s) of the {given} Slurm gave "
                    f"(CUDA_VISIBLE_DEVICES={r.cuda_visible_devices})"
                )
        differ("GPUs", lambda r: r.gpu_kind)
    if device == "cpu":
        differ("CPU models", lambda r: r.cpu_model)
    warnings = []
    scores = [r.score for r in reports if r.score is not None]
    hosts = {r.hostname for r in reports}
    if len(hosts) < len(reports):
        warnings.append(
            f"pre-flight: {len(reports)} nodes share {len(hosts)} host(s) ({', '.join(sorted(hosts))}): "
            "their machine-speed probes ran side by side and are not compared"
        )
    elif len(scores) > 1:
        for r in reports:
            others = [s for other in reports if other is not r and (s := other.score) is not None]
            if r.score is not None and others and r.score < SLOW_NODE * statistics.median(others):
                warnings.append(
                    f"pre-flight: node {r.node} is slow: machine-speed probe {r.score:.2f} against "
                    f"{statistics.median(others):.2f} on the other nodes (its steps pace every "
                    "multi-node case)"
                )
    for r in reports:
        if r.foreign_cores is not None and r.foreign_cores > BUSY_NODE_CORES:
            warnings.append(
                f"pre-flight: node {r.node} is busy: {r.foreign_cores:.2f} cores used by processes "
                "not of this job"
            )
    return Preflight(tuple(reports), tuple(warnings))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
