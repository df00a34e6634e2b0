"""Workloads by name: the built-ins, installed ``scaleguard.workloads`` entry points and the
import paths of ``--perf-workloads``; and, in a rank, the one workload of a case by its reference.
"""

from __future__ import annotations

from collections.abc import Sequence

from scaleguard.workloads.builtins import BUILTINS, get_model_def
from scaleguard.workloads.contract import Workload, WorkloadError, entry_point_paths, load_path


class Registry:
    """Workloads by name: the built-ins, installed entry points and ``--perf-workloads``.
    A workload's reference is its import path (``module:attr``, ``#i`` for the i-th of a list)."""

    def __init__(self, paths: Sequence[str] = ()) -> None:
        self.by_name: dict[str, Workload] = dict(BUILTINS)
        self.ref_of: dict[str, str] = {}  # name -> import reference; built-ins have none
        self.user: list[str] = []  # names from --perf-workloads, in order
        seen: set[str] = set()
        for path, explicit in [(p, False) for p in entry_point_paths()] + [(p, True) for p in paths]:
            if path in seen:
                continue
            seen.add(path)
            found = load_path(path)
            for index, workload in enumerate(found):
                ref = path if len(found) == 1 else f"{path}#{index}"
                if workload.name in self.by_name:
                    owner = self.ref_of.get(workload.name, "scaleguard (built in)")
                    raise WorkloadError(f"workload {ref}: name {workload.name!r} is already taken by {owner}")
                self.by_name[workload.name] = workload
                self.ref_of[workload.name] = ref
                if explicit:
                    self.user.append(workload.name)

    def get(self, name: str) -> Workload:
        try:
            return self.by_name[name]
        except KeyError:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(self.by_name))}") from None


def resolve(name: str, ref: str) -> Workload:
    """In a rank: the workload of a case, imported by its own reference (built-ins by name)."""
    if not ref:
        return get_model_def(name)
    path, _, index = ref.partition("#")
    found = load_path(path)
    workload = found[int(index)] if index.isdigit() and int(index) < len(found) else found[0]
    if workload.name != name:
        raise WorkloadError(f"workload {ref}: holds {workload.name!r}, not {name!r}")
    return workload
