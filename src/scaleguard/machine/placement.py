"""Where a rank runs: its node, the CPUs it is bound to and the devices Slurm gave its step.

Read inside the rank (and the pre-flight's task): a cluster binds CPUs and GPUs per task, and
the rank's threads and device follow what it actually got, not what the login node assumed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any


def compact_cpus(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5`` (how Slurm and taskset write CPU lists)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def bound_cpus() -> list[int]:
    """The CPUs this process may run on (Slurm's task/affinity binds a task to its -c CPUs)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def slurm_placement(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Where a task runs and what the step gave it, as Slurm's environment says (empty keys
    left out; outside Slurm only the host and the CPUs)."""
    facts: dict[str, Any] = {
        "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
        # the machine itself, and its cores: Slurm "nodes" may be one host (a test cluster, an
        # oversubscribed partition), whose ranks then time-share its cores
        "host": socket.gethostname(),
        "host_cores": os.cpu_count() or 1,
        "cpus": compact_cpus(bound_cpus()),
    }
    for key, name in (
        ("CUDA_VISIBLE_DEVICES", "cuda_visible_devices"),
        ("SLURM_JOB_ID", "job"),
        ("SLURM_STEP_ID", "step"),
        ("SLURM_STEP_GPUS", "step_gpus"),
        ("SLURM_GPUS_ON_NODE", "gpus_on_node"),
        ("SLURM_CPUS_PER_TASK", "cpus_per_task"),
        ("SLURM_MEM_PER_NODE", "mem_per_node_mb"),
        ("SLURM_MEM_PER_CPU", "mem_per_cpu_mb"),
    ):
        if env.get(key):
            facts[name] = env[key][:200]
    return facts
