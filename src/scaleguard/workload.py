"""The public seam for a team's own workload: ``from scaleguard.workload import Workload``.

The contract lives in ``scaleguard.workloads.contract`` and the registry in
``scaleguard.workloads.registry``; this module keeps the import path that the README, the
examples and users' packages name, so the package's layout can move without moving under them.
"""

from scaleguard.workloads.contract import (
    ENTRY_POINT_GROUP,
    REF,
    Batch,
    Workload,
    WorkloadError,
    check,
    entry_point_paths,
    load_path,
)
from scaleguard.workloads.registry import Registry, resolve

__all__ = [
    "ENTRY_POINT_GROUP",
    "REF",
    "Batch",
    "Registry",
    "Workload",
    "WorkloadError",
    "check",
    "entry_point_paths",
    "load_path",
    "resolve",
]
