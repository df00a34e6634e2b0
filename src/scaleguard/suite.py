"""One pytest session's objects, wired from its ``PerfConfig``: the planned cases, this
hardware's baseline, the scheduler and its ledger, the rank pools, the paired A/B session and
the history. The pytest hooks (``plugin.py``) only ask this object, as pytest-benchmark's plugin
hands everything to its ``BenchmarkSession``; everything here raises ``ConfigError`` for a
problem the user can fix, which the plugin turns into a usage error.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scaleguard.case import CaseSpec
from scaleguard.config import ConfigError, PerfConfig

if TYPE_CHECKING:
    from scaleguard.evidence.ledger import BaselineContext, Ledger
    from scaleguard.evidence.runs import CaseEvidence
    from scaleguard.evidence.verdict import Thresholds
    from scaleguard.machine.env import HostFingerprint
    from scaleguard.ranks.launcher import Pools
    from scaleguard.schedule.ab import ABSession, Side
    from scaleguard.schedule.matrix import PlannedCase
    from scaleguard.schedule.preflight import Preflight
    from scaleguard.schedule.session import PerfSession, Schedule
    from scaleguard.schedule.slurm import NodeFacts, SlurmRunner


class Suite:
    """Built lazily: a ``pytest --help`` or a session that selects no perf case plans nothing,
    probes no interpreter and opens no baseline."""

    def __init__(self, config: PerfConfig, rootpath: Path, progress: Callable[[str], None]) -> None:
        self.config = config
        self.rootpath = rootpath
        self.progress = progress  # one "scaleguard: ..." line on the terminal
        self.started = time.monotonic()  # the suite's wall time, for the summary
        self.selected: tuple[CaseSpec, ...] = ()  # the perf cases this session runs, in order
        self.session: PerfSession | None = None
        self.ab: ABSession | None = None
        self.pools: Pools | None = None
        self.run_root: Path | None = None  # rank files of every run; removed at the end
        self._planned: list[PlannedCase] | None = None
        self._baselines: BaselineContext | None = None
        self._host: HostFingerprint | None = None
        self._ab_sides: tuple[Side, Side] | None = None
        self._node_facts: NodeFacts | None = None
        self._slurm_runner: SlurmRunner | None = None
        self.session_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.collect_only = False  # pytest --collect-only: nothing is asked of a cluster
        self.infrastructure: dict[str, str] = {}  # case -> why the cluster could not run it

    # -- what runs ---------------------------------------------------------------------------

    def planned(self) -> list[PlannedCase]:
        if self._planned is None:
            import os

            from scaleguard.machine.env import gpu_inventory
            from scaleguard.schedule.matrix import plan

            try:
                if self.config.slurm is not None:
                    from scaleguard.schedule import slurm

                    self._planned = slurm.plan_on_cluster(
                        self.config.matrix, self.config.slurm, self.node_facts()
                    )
                else:
                    self._planned = plan(self.config.matrix, gpu_inventory(), os.cpu_count() or 1)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        return self._planned

    @property
    def planned_yet(self) -> bool:
        return self._planned is not None

    @property
    def device(self) -> str:
        planned = self.planned()
        return planned[0].spec.device if planned else "cpu"

    def thresholds(self, paired: bool = False) -> Thresholds:
        return self.config.thresholds.for_device(self.device, paired)

    def timeout_s(self) -> float:
        if self.config.timeout_s is not None:
            return self.config.timeout_s
        from scaleguard.devices import defaults_for

        return defaults_for(self.device).case_timeout_s

    def schedule(self) -> Schedule:
        from scaleguard.schedule.session import Schedule

        device = self.device
        confirm = self.config.confirm
        return Schedule.for_device(
            device,
            repeats=self.config.repeats,
            confirm=Schedule.for_device(device).confirm if confirm is None else confirm,
            anatomy_on_every_run=self.config.update_baselines,
        )

    def foreign_limit(self) -> float | None:
        """Cores of foreign load that disturb a run; None when the check is off."""
        if not self.config.load_check:
            return None
        if self.config.foreign_limit is None:
            from scaleguard.machine.foreign_load import DEFAULT_LIMIT_CORES

            return DEFAULT_LIMIT_CORES
        return self.config.foreign_limit

    def host(self) -> HostFingerprint:
        """This machine as the baseline key sees it, read once per session."""
        if self._host is None:
            from scaleguard.machine.env import host_fingerprint

            self._host = host_fingerprint()
        return self._host

    def node_facts(self) -> NodeFacts:
        """On a cluster: what sinfo says of its nodes, read once."""
        if self._node_facts is None:
            from scaleguard.schedule import slurm

            assert self.config.slurm is not None
            try:
                self._node_facts = slurm.node_facts(self.config.slurm)
            except slurm.SlurmError as exc:
                raise ConfigError(f"--perf-slurm: {exc}") from None
        return self._node_facts

    def hardware_key(self) -> str:
        """The one derivation of this session's baseline key (the file name, and the key the
        file must hold)."""
        from scaleguard.evidence.baseline import host_hardware_key

        spec = self.planned()[0].spec
        if self.config.slurm is not None:
            from scaleguard.schedule.slurm import cluster_hardware_key

            checked = self.cluster_preflight()
            if checked is not None:  # the compute nodes' own CPU and GPU
                gpu, cpu = checked.gpu_name, checked.cpu_model
            else:  # no allocation (it never started: every case says why): what sinfo says
                gpu, cpu = self.node_facts().gpu_type, self.host().cpu_model
            return cluster_hardware_key(
                spec.device, gpu, self.config.slurm, cpu, spec.settings.threads_per_rank
            )
        return host_hardware_key(self.host(), spec.device, spec.settings.threads_per_rank)

    def cluster_preflight(self) -> Preflight | None:
        """The allocation's pre-flight, run once (the allocation is asked for here, before the
        baseline is chosen: its key is the compute nodes'); None when it could not be had."""
        runner = self.slurm_runner()
        if runner.preflight is None and not self.collect_only and runner.not_started is None:
            from scaleguard.ranks.protocol import CaseFailedError

            try:
                runner.ensure_allocation("(the session's allocation)")
            except CaseFailedError:
                pass  # every case says why, as its own failure (or skip)
        return runner.preflight

    # -- what it is judged against -----------------------------------------------------------

    def baseline_context(self) -> BaselineContext:
        """This hardware's baseline, loaded once; a broken file, a missing directory or an
        unwritable one stops the session with the reason, before any case runs."""
        if self._baselines is not None:
            return self._baselines
        from scaleguard.evidence import baseline
        from scaleguard.evidence.ledger import BaselineContext

        config = self.config
        spec = self.planned()[0].spec
        host = self.host()
        key = self.hardware_key()
        given = config.baselines
        directory = given if given is not None else self.rootpath / "baselines"
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"--perf-baselines {directory} is a file, not a directory")
        if not directory.exists() and not config.update_baselines and not config.paired:
            # (a paired A/B session judges B against A, never against a baseline)
            raise ConfigError(
                f"{'--perf-baselines ' if given else 'the baselines directory '}{directory} "
                "does not exist; every case would be NEW and nothing judged. Check the path (or pass "
                "--perf-baselines DIR), or add --perf-update-baselines to create it."
            )
        path = directory / f"{key}.json"
        try:
            if config.update_baselines:
                baseline.check_writable(directory)
                baseline.check_lock(path)
            loaded = baseline.load(path)
            baseline.check_matches(loaded, key, config.baseline_torch, "--perf-baseline-torch")
        except baseline.BaselineError as exc:
            raise ConfigError(str(exc)) from exc
        self._baselines = BaselineContext(
            path=path,
            file=loaded,
            hardware_key=key,
            hardware={
                "device": spec.device,
                "gpu_name": host.gpu_name,
                "gpu_count": host.gpu_count,
                "cpu_model": host.cpu_model,
                "threads_per_rank": spec.settings.threads_per_rank,
                "backend": "nccl" if spec.device == "cuda" else "gloo",
                **self._cluster_hardware(),
            },
            torch_pick=config.baseline_torch,
            thresholds=self.thresholds(),
            per_case=config.thresholds.per_case,
            commit=baseline.git_commit(self.rootpath),
            keep_runs=config.keep_runs or baseline.DEFAULT_KEEP_RUNS,
            accept=config.accept,
            accept_reason=config.accept_reason,
        )
        return self._baselines

    def _cluster_hardware(self) -> dict[str, object]:
        """On a cluster, what the key does not say: the scheduler, the partition, ranks per
        node, the node counts asked for (each run keeps its own nodes and NCCL's transport)."""
        if self.config.slurm is None:
            return {}
        facts = self.node_facts()
        return {
            "scheduler": "slurm",
            **self.config.slurm.to_dict(),
            "cpus_per_node": facts.cpus,
            "gpu_type": facts.gpu_type,
        }

    # -- the schedulers ----------------------------------------------------------------------

    def perf_session(self) -> PerfSession:
        """The session's scheduler and ledger, made by the first perf case; the machine probe
        runs before it, so every run of the session carries how fast this machine is."""
        if self.session is None:
            from scaleguard.evidence.ledger import Ledger
            from scaleguard.machine import foreign_load
            from scaleguard.machine.probe import run_probe
            from scaleguard.ranks.launcher import Pools
            from scaleguard.report.terminal import machine_line
            from scaleguard.schedule import runner
            from scaleguard.schedule.session import PerfSession

            limit = self.foreign_limit()

            def wait_quiet(seconds: float) -> None:
                if limit is not None:
                    foreign_load.wait_quiet(limit, seconds)

            session_id = self.session_id
            if self.config.slurm is not None:
                # the runs are steps of one allocation; the rank files go where every node sees
                # them. The machine probe and the foreign-load check ran on every node in the
                # pre-flight: the session's probe is the slowest node's (it paces the steps)
                self.session = PerfSession(
                    Ledger(session_id, self.baseline_context()),
                    self.slurm_dir() / session_id,
                    self.timeout_s(),
                    self.schedule(),
                    run=self.slurm_runner(),
                    on_run=self.progress,
                )
                checked = self.cluster_preflight()
                if checked is not None and checked.slowest_machine():
                    self.session.ledger.machine = checked.slowest_machine()
                return self.session
            self.run_root = Path(tempfile.mkdtemp(prefix="scaleguard-runs-"))
            self.pools = Pools(self.run_root / "pools", isolate=self.config.isolate)
            self.session = PerfSession(
                Ledger(session_id, self.baseline_context()),
                self.run_root,
                self.timeout_s(),
                self.schedule(),
                run=functools.partial(runner.run_once, foreign_limit_cores=limit, pools=self.pools),
                on_run=self.progress,
                wait_quiet=wait_quiet,
            )
            speed = run_probe()
            if speed is not None:
                self.session.ledger.machine = speed.to_dict()
            self.progress(machine_line(speed, self.baseline_context().file))
        return self.session

    def slurm_dir(self) -> Path:
        assert self.config.slurm is not None
        return self.config.slurm.shared_dir or self.rootpath / ".scaleguard" / "slurm"

    def slurm_runner(self) -> SlurmRunner:
        """The session's one allocation (asked for before the first run) and its run function."""
        if self._slurm_runner is None:
            from scaleguard.schedule import slurm

            assert self.config.slurm is not None
            # as many nodes as the selected cases need (-k ws8 on a 1,2 plan holds one node)
            runnable = {p.spec.case_id for p in self.planned() if p.skip_reason is None}
            chosen = [s for s in self.selected if s.case_id in runnable] or [
                p.spec for p in self.planned() if p.skip_reason is None
            ]
            nodes = max((s.settings.nodes for s in chosen), default=1)
            resources = self.config.slurm.resources(self.device, self.node_facts())
            allocation = slurm.Allocation(
                self.config.slurm, nodes, f"scaleguard-{self.session_id}", self.progress, resources
            )
            self._slurm_runner = slurm.SlurmRunner(
                allocation, preflight_dir=self.slurm_dir() / self.session_id, device=self.device
            )
        return self._slurm_runner

    def case_done(self, spec: CaseSpec) -> None:
        """A case's test is over (its confirm runs too): on a cluster, the nodes that no case
        left needs go back to Slurm."""
        runner = self._slurm_runner
        if runner is None or self.ab is not None or spec not in self.selected:
            return
        left = self.selected[self.selected.index(spec) + 1 :]
        if left:
            runner.allocation.shrink(max(s.settings.nodes for s in left))

    def slurm_used(self) -> str | None:
        """How well the session used what it held: node-minutes held against node-minutes in
        the runs' steps (None off a cluster, or before an allocation was held)."""
        runner = self._slurm_runner
        if runner is None or runner.node_seconds_held <= 0:
            return None
        held, used = runner.node_seconds_held / 60, runner.used_s / 60
        return (
            f"scaleguard: Slurm node-minutes held {held:.1f}, in the runs' steps {used:.1f} "
            f"({used / held:.0%}); the rest: the pre-flight, steps starting, judging between runs"
        )

    def ab_sides(self) -> tuple[Side, Side] | None:
        """The two probed sides of a paired A/B session; None when A/B is off."""
        if not self.config.paired:
            return None
        if self._ab_sides is None:
            import sys

            from scaleguard.schedule import ab

            try:
                self._ab_sides = (
                    ab.probe("A", self.config.ab_a or sys.executable, list(self.config.ab_env_a)),
                    ab.probe("B", str(self.config.ab_b), list(self.config.ab_env_b)),
                )
            except ab.ABInputError as exc:
                raise ConfigError(str(exc)) from None
        return self._ab_sides

    def ab_session(self) -> ABSession | None:
        """The paired A/B scheduler, made once (when --perf-ab-b is given)."""
        sides = self.ab_sides()
        if sides is None:
            return None
        if self.ab is None:
            from scaleguard.schedule import ab, runner

            device = self.device
            settings = self.config.thresholds
            if self.config.slurm is not None:
                # both sides alternate on the same allocation: the same nodes for A and B; their
                # files stay in the shared directory
                base_dir = self.slurm_dir() / f"ab-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
            else:
                self.run_root = self.run_root or Path(tempfile.mkdtemp(prefix="scaleguard-runs-"))
                base_dir = self.run_root
            self.ab = ab.ABSession(
                sides[0],
                sides[1],
                base_dir,
                self.timeout_s(),
                lambda case_id: settings.for_case(case_id, device, paired=True),
                ab.ABSchedule.for_device(device, self.config.ab_pairs),
                run=(
                    self.slurm_runner()
                    if self.config.slurm is not None
                    else functools.partial(runner.run_once, foreign_limit_cores=self.foreign_limit())
                ),
                on_run=self.progress,
            )
        return self.ab

    # -- what is kept ------------------------------------------------------------------------

    def keep_trace(self, evidence: CaseEvidence) -> Path | None:
        """Copy the last run's Chrome trace out of the run directory (removed at the end) into
        ``--perf-trace-dir``; the path, or None when the run has none."""
        traces = [r.anatomy.trace for r in evidence.runs if r.anatomy and r.anatomy.trace]
        if not traces or not Path(traces[-1]).is_file():
            return None
        directory = self.config.trace_dir or self.rootpath / ".scaleguard" / "traces"
        target = directory / f"{evidence.case_id}.{evidence.runs[-1].run_id}.trace.json"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(traces[-1], target)
        except OSError as exc:  # a trace is a help, not the verdict: say why it is missing
            return Path(f"(not kept: {exc})")
        return target

    def history_path(self) -> Path | None:
        if not self.config.record_history:
            return None
        return self.config.history or self.rootpath / ".scaleguard" / "history.sqlite"

    def append_history(self, ledgers: dict[str, Ledger]) -> str | None:
        """Every completed case's runs (quarantined ones flagged) into the history; a history
        that cannot be written costs the history, never the session's results."""
        path = self.history_path()
        if path is None or not any(ledger.completed for ledger in ledgers.values()):
            return None
        from scaleguard.evidence.baseline import git_commit
        from scaleguard.history.database import History, HistoryError

        key = self.hardware_key()
        added = 0
        try:
            with History(path) as history:
                for source, ledger in ledgers.items():
                    cases = [ledger.evidence(cid) for cid in ledger.completed]
                    verdicts = {cid: str(getattr(v.status, "value", v.status))
                                for cid, v in ledger.verdicts.items()}  # fmt: skip
                    added += history.append(cases, key, source, verdicts, git_commit(self.rootpath))
        except HistoryError as exc:
            return f"scaleguard: history not updated: {exc}"
        except Exception as exc:  # noqa: BLE001 - the history costs the history, never the results
            return f"scaleguard: history not updated ({type(exc).__name__}: {exc}); this is a scaleguard bug"
        return f"scaleguard: history {path}: {added} runs appended"

    def close(self) -> None:
        """The idle pool's ranks (also after Ctrl-C between cases), the Slurm allocation, and
        every run's files (a cluster's stay in the shared directory, for who reads them)."""
        if self._slurm_runner is not None:
            self._slurm_runner.allocation.release()
        if self.pools is not None:
            self.pools.close()
        if self.run_root is not None:
            shutil.rmtree(self.run_root, ignore_errors=True)
