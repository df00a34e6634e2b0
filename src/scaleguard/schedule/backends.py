"""Where a session's runs happen: the one seam between the suite and the machines.

A ``Backend`` plans the matrix for the machines it has, names their hardware key, holds what
the selected cases need and checks it (``prepare``: a local machine probes itself; Slurm
acquires an allocation and runs its pre-flight on every node), runs one case once (``run``,
the scheduler's run function), gives back what no case left needs (``case_done``) and
releases everything (``release``). The suite asks the backend and never which one it is, as
pytest-xdist's session asks its scheduling protocol; a new place to run (Kubernetes, a cloud
batch queue) is one more class here.

- ``LocalBackend``: rank pools on this machine (``ranks.launcher``), the machine-speed probe
  and the busy-machine check of this host.
- ``SlurmBackend``: every run a job step of one allocation (``schedule.slurm``), the pre-flight
  in place of the probe.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from scaleguard.case import CaseSpec
from scaleguard.evidence.runs import RunRecord
from scaleguard.ranks.protocol import CaseFailedError

if TYPE_CHECKING:
    from scaleguard.machine.env import HostFingerprint
    from scaleguard.machine.probe import MachineSpeed
    from scaleguard.ranks.launcher import Pools
    from scaleguard.schedule.ab import Side
    from scaleguard.schedule.matrix import MatrixOptions, PlannedCase
    from scaleguard.schedule.preflight import Preflight
    from scaleguard.schedule.slurm import NodeFacts, SlurmOptions, SlurmRunner

RunFn = Callable[..., RunRecord]  # (spec, run_dir, timeout_s, interpreter=None) -> RunRecord


class Backend(Protocol):
    """What the suite needs of the machines its runs happen on."""

    name: str
    holds_resources: bool  # a signal must release something outside this process tree
    orders_by_nodes: bool  # cases run most nodes first (after the world-size-1 references)

    def plan(self, matrix: MatrixOptions) -> list[PlannedCase]: ...

    def hardware_key(self, spec: CaseSpec, host: HostFingerprint) -> str: ...

    def hardware_facts(self) -> dict[str, object]:
        """What the key does not say, kept in the baseline file's hardware record."""
        ...

    def select(self, selected: Sequence[CaseSpec], collect_only: bool) -> None:
        """The cases this session runs, in order (``collect_only``: none runs)."""
        ...

    def prepare(self, selected: Sequence[CaseSpec]) -> dict[str, Any] | None:
        """Hold and check what ``selected`` needs; the machine probe's figures (or None).
        Never raises for a cluster that cannot be had: each case then says why."""
        ...

    def machine_line(self, baseline_file: Any) -> str | None:
        """The probe beside the baseline runs', for the header (None: said already)."""
        ...

    def run_dir(self, session_id: str) -> Path: ...

    def runner(self, paired: bool = False) -> RunFn:
        """The run function of the session (``paired``: of a paired A/B session)."""
        ...

    def wait_quiet(self, seconds: float) -> None: ...

    def case_done(self, left: Sequence[CaseSpec]) -> None:
        """A case is over; ``left``: the cases still to run."""
        ...

    def usage(self) -> str | None:
        """One line on how the session used what it held (None: nothing to say)."""
        ...

    def release(self) -> None: ...

    def probe_side(
        self, label: str, python: str, env: Sequence[tuple[str, str]], srun_args: Sequence[str]
    ) -> Side:
        """Side A or B of a paired A/B, checked where its ranks will run (``ab.ABInputError``)."""
        ...


class LocalBackend:
    """Rank pools on this machine."""

    name = "local"
    holds_resources = False
    orders_by_nodes = False

    def __init__(self, isolate: bool, foreign_limit: float | None, progress: Callable[[str], None]) -> None:
        self.isolate = isolate
        self.foreign_limit = foreign_limit
        self.progress = progress
        self.pools: Pools | None = None
        self.root: Path | None = None  # rank files of every run; removed at the end
        self.speed: MachineSpeed | None = None

    def plan(self, matrix: MatrixOptions) -> list[PlannedCase]:
        from scaleguard.machine.env import gpu_inventory
        from scaleguard.schedule.matrix import plan

        return plan(matrix, gpu_inventory(), os.cpu_count() or 1)

    def hardware_key(self, spec: CaseSpec, host: HostFingerprint) -> str:
        from scaleguard.evidence.baseline import host_hardware_key

        return host_hardware_key(host, spec.device, spec.settings.threads_per_rank)

    def hardware_facts(self) -> dict[str, object]:
        return {}

    def select(self, selected: Sequence[CaseSpec], collect_only: bool) -> None:
        return None  # a pool starts what a case needs when it runs

    def prepare(self, selected: Sequence[CaseSpec]) -> dict[str, Any] | None:
        from scaleguard.machine.probe import run_probe

        self.speed = run_probe()
        return self.speed.to_dict() if self.speed is not None else None

    def machine_line(self, baseline_file: Any) -> str | None:
        from scaleguard.report.terminal import machine_line

        return machine_line(self.speed, baseline_file)

    def run_dir(self, session_id: str) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="scaleguard-runs-"))
        return self.root

    def runner(self, paired: bool = False) -> RunFn:
        from scaleguard.schedule import runner

        if paired:  # each side's runs in fresh processes of its own interpreter
            return functools.partial(runner.run_once, foreign_limit_cores=self.foreign_limit)
        if self.pools is None:
            from scaleguard.ranks.launcher import Pools

            self.pools = Pools(self.run_dir("") / "pools", isolate=self.isolate)
        return functools.partial(runner.run_once, foreign_limit_cores=self.foreign_limit, pools=self.pools)

    def probe_side(
        self, label: str, python: str, env: Sequence[tuple[str, str]], srun_args: Sequence[str]
    ) -> Side:
        from scaleguard.schedule import ab

        return ab.probe(label, python, list(env))

    def wait_quiet(self, seconds: float) -> None:
        if self.foreign_limit is not None:
            from scaleguard.machine import foreign_load

            foreign_load.wait_quiet(self.foreign_limit, seconds)

    def case_done(self, left: Sequence[CaseSpec]) -> None:
        return None

    def usage(self) -> str | None:
        return None

    def release(self) -> None:
        """The idle pool's ranks (also after Ctrl-C between cases) and every run's files."""
        if self.pools is not None:
            self.pools.close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


class SlurmBackend:
    """Every run a job step of one allocation; the rank files in the shared directory."""

    name = "slurm"
    holds_resources = True
    orders_by_nodes = True

    def __init__(
        self,
        options: SlurmOptions,
        shared_dir: Path,
        session_id: str,
        progress: Callable[[str], None],
    ) -> None:
        self.options = options
        self.shared_dir = shared_dir
        self.session_id = session_id
        self.progress = progress
        self.collect_only = False  # pytest --collect-only: nothing is asked of the cluster
        self._facts: NodeFacts | None = None
        self._device = "cpu"
        self._runner: SlurmRunner | None = None
        self._selected: Sequence[CaseSpec] = ()
        self._planned: list[PlannedCase] = []
        self._released = False

    def facts(self) -> NodeFacts:
        """What sinfo says of the partition's nodes, read once (``SlurmError`` when it cannot)."""
        if self._facts is None:
            from scaleguard.schedule.slurm import node_facts

            self._facts = node_facts(self.options)
        return self._facts

    def plan(self, matrix: MatrixOptions) -> list[PlannedCase]:
        from scaleguard.schedule.slurm import SlurmError, plan_on_cluster

        try:
            planned = plan_on_cluster(matrix, self.options, self.facts())
        except SlurmError as exc:
            raise ValueError(f"--perf-slurm: {exc}") from None
        self._device = planned[0].spec.device if planned else "cpu"
        self._planned = planned
        return planned

    def preflight(self) -> Preflight | None:
        """The allocation's pre-flight, run once (the allocation is asked for here, before the
        baseline is chosen: its key is the compute nodes'); None when it could not be had."""
        runner = self.slurm_runner()
        # only for cases that will run, and never again once the session let go of the cluster
        wanted = bool(self._selected) and not self.collect_only and not self._released
        if runner.preflight is None and wanted and runner.not_started is None:
            try:
                runner.ensure_allocation("(the session's allocation)")
            except CaseFailedError:
                pass  # every case says why, as its own failure (or skip)
        return runner.preflight

    def hardware_key(self, spec: CaseSpec, host: HostFingerprint) -> str:
        from scaleguard.schedule.slurm import cluster_hardware_key

        checked = self.preflight()
        if checked is not None:  # the compute nodes' own CPU and GPU
            gpu, cpu = checked.gpu_name, checked.cpu_model
        else:  # no allocation (it never started: every case says why): what sinfo says
            gpu, cpu = self.facts().gpu_type, host.cpu_model
        return cluster_hardware_key(spec.device, gpu, self.options, cpu, spec.settings.threads_per_rank)

    def hardware_facts(self) -> dict[str, object]:
        """The scheduler, the partition, ranks per node, the node counts asked for (each run
        keeps its own nodes, placement and NCCL's transport)."""
        facts = self.facts()
        return {
            "scheduler": "slurm",
            **self.options.to_dict(),
            "cpus_per_node": facts.cpus,
            "gpu_type": facts.gpu_type,
        }

    def select(self, selected: Sequence[CaseSpec], collect_only: bool) -> None:
        """The cases this session runs: the allocation holds as many nodes as they need."""
        self._selected = selected
        self.collect_only = collect_only

    def slurm_runner(self) -> SlurmRunner:
        if self._runner is None:
            from scaleguard.schedule import slurm

            runnable = [p.spec for p in self._planned if p.skip_reason is None]
            ids = {s.case_id for s in runnable}
            chosen = [s for s in self._selected if s.case_id in ids] or runnable
            nodes = max((s.settings.nodes for s in chosen), default=1)
            resources = self.options.resources(self._device, self.facts())
            allocation = slurm.Allocation(
                self.options, nodes, f"scaleguard-{self.session_id}", self.progress, resources
            )
            self._runner = slurm.SlurmRunner(
                allocation, preflight_dir=self.shared_dir / self.session_id, device=self._device
            )
        return self._runner

    def prepare(self, selected: Sequence[CaseSpec]) -> dict[str, Any] | None:
        # the probe ran on every node in the pre-flight: the session's is the slowest node's
        # (it paces every multi-node step)
        checked = self.preflight()
        return (checked.slowest_machine() or None) if checked is not None else None

    def machine_line(self, baseline_file: Any) -> str | None:
        return None  # the pre-flight said each node's

    def run_dir(self, session_id: str) -> Path:
        return self.shared_dir / session_id

    def runner(self, paired: bool = False) -> RunFn:
        # paired A/B: both sides alternate on the same allocation, the same nodes for A and B
        return self.slurm_runner()

    def probe_side(
        self, label: str, python: str, env: Sequence[tuple[str, str]], srun_args: Sequence[str]
    ) -> Side:
        side: Side = self.slurm_runner().probe_side(label, python, env, srun_args)
        return side

    def wait_quiet(self, seconds: float) -> None:
        return None  # the nodes' load was read in the pre-flight; runs are not watched from here

    def case_done(self, left: Sequence[CaseSpec]) -> None:
        if self._runner is not None and left:
            self._runner.allocation.shrink(max(s.settings.nodes for s in left))

    def usage(self) -> str | None:
        runner = self._runner
        if runner is None or runner.node_seconds_held <= 0:
            return None
        held, used = runner.node_seconds_held / 60, runner.used_s / 60
        return (
            f"scaleguard: Slurm node-minutes held {held:.1f}, in the runs' steps {used:.1f} "
            f"({used / held:.0%}); the rest: the pre-flight, steps starting, judging between runs"
        )

    def release(self) -> None:
        self._released = True
        if self._runner is not None:
            self._runner.allocation.release()


def choose(
    slurm: SlurmOptions | None,
    rootpath: Path,
    isolate: bool,
    foreign_limit: float | None,
    session_id: str,
    progress: Callable[[str], None],
) -> Backend:
    """The session's backend: Slurm when ``--perf-slurm`` asked for it, else this machine."""
    if slurm is not None:
        shared = slurm.shared_dir or rootpath / ".scaleguard" / "slurm"
        return SlurmBackend(slurm, shared, session_id, progress)
    return LocalBackend(isolate, foreign_limit, progress)
