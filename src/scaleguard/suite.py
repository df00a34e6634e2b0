"""One pytest session's objects, wired from its ``PerfConfig``: the planned cases, this
hardware's baseline, the scheduler and its ledger, the rank pools, the paired A/B session and
the history. The pytest hooks (``plugin.py``) only ask this object, as pytest-benchmark's plugin
hands everything to its ``BenchmarkSession``; everything here raises ``ConfigError`` for a
problem the user can fix, which the plugin turns into a usage error.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from scaleguard.case import CaseSpec
from scaleguard.config import ConfigError, PerfConfig
from scaleguard.history.target import HistoryTarget

if TYPE_CHECKING:
    from scaleguard.evidence.ledger import BaselineContext, Ledger
    from scaleguard.evidence.runs import CaseEvidence
    from scaleguard.evidence.verdict import Thresholds
    from scaleguard.machine.env import HostFingerprint
    from scaleguard.schedule.ab import ABSession, Side
    from scaleguard.schedule.backends import Backend
    from scaleguard.schedule.matrix import PlannedCase
    from scaleguard.schedule.session import PerfSession, Schedule


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
        self._backend: Backend | None = None
        self._planned: list[PlannedCase] | None = None
        self._baselines: BaselineContext | None = None
        self._host: HostFingerprint | None = None
        self._ab_sides: tuple[Side, Side] | None = None
        self.session_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.collect_only = False  # pytest --collect-only: nothing is asked of a cluster
        self.infrastructure: dict[str, str] = {}  # case -> why the cluster could not run it

    # -- what runs ---------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """Where the runs happen (this machine's rank pools, or a Slurm allocation), made once."""
        if self._backend is None:
            from scaleguard.schedule import backends

            self._backend = backends.choose(
                self.config.slurm, self.rootpath, self.config.isolate, self.foreign_limit(),
                self.session_id, self.progress,
            )  # fmt: skip
        return self._backend

    def planned(self) -> list[PlannedCase]:
        if self._planned is None:
            try:
                self._planned = self.backend.plan(self.config.matrix)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        return self._planned

    def select(self, selected: tuple[CaseSpec, ...], collect_only: bool) -> None:
        """The cases this session runs, in their order (the backend holds what they need)."""
        self.selected = selected
        self.collect_only = collect_only
        self.backend.select(selected, collect_only)

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

    def hardware_key(self) -> str:
        """The one derivation of this session's baseline key (the file name, and the key the
        file must hold): the backend's machines' (on a cluster, the compute nodes')."""
        return self.backend.hardware_key(self.planned()[0].spec, self.host())

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
                **self.backend.hardware_facts(),
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

    # -- the schedulers ----------------------------------------------------------------------

    def perf_session(self) -> PerfSession:
        """The session's scheduler and ledger, made by the first perf case; the backend's
        machines are held and probed before it, so every run carries how fast they are."""
        if self.session is None:
            from scaleguard.evidence.ledger import Ledger
            from scaleguard.schedule.session import PerfSession

            backend = self.backend
            machine = backend.prepare(self.selected)
            self.session = PerfSession(
                Ledger(self.session_id, self.baseline_context()),
                backend.run_dir(self.session_id),
                self.timeout_s(),
                self.schedule(),
                run=backend.runner(),
                on_run=self.progress,
                wait_quiet=backend.wait_quiet,
                fault=self.config.session_fault,
            )
            if machine:
                self.session.ledger.machine = machine
            line = backend.machine_line(self.baseline_context().file)
            if line:
                self.progress(line)
        return self.session

    def case_done(self, spec: CaseSpec) -> None:
        """A case's test is over (its confirm runs too): what no case left needs goes back."""
        if self.ab is not None or spec not in self.selected:
            return
        self.backend.case_done(self.selected[self.selected.index(spec) + 1 :])

    def ab_sides(self) -> tuple[Side, Side] | None:
        """The two probed sides of a paired A/B session; None when A/B is off."""
        if not self.config.paired:
            return None
        if self._ab_sides is None:
            import sys

            from scaleguard.schedule import ab

            config = self.config
            try:
                self._ab_sides = (
                    self.backend.probe_side(
                        "A", config.ab_a or sys.executable, config.ab_env_a, config.ab_srun_a
                    ),
                    self.backend.probe_side("B", str(config.ab_b), config.ab_env_b, config.ab_srun_b),
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
            from scaleguard.schedule import ab

            device = self.device
            settings = self.config.thresholds
            self.ab = ab.ABSession(
                sides[0],
                sides[1],
                self.backend.run_dir(f"ab-{self.session_id}"),
                self.timeout_s(),
                lambda case_id: settings.for_case(case_id, device, paired=True),
                ab.ABSchedule.for_device(device, self.config.ab_pairs),
                run=self.backend.runner(paired=True),
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

    def history_target(self) -> HistoryTarget | None:
        if not self.config.record_history:
            return None
        return self.config.history or self.rootpath / ".scaleguard" / "history.sqlite"

    def project(self) -> str:
        """The project recorded with every run: ``--perf-project``, else the repository's name."""
        from scaleguard.evidence.baseline import git_root

        return self.config.project or (git_root(self.rootpath) or self.rootpath).name

    def append_history(self, ledgers: dict[str, Ledger]) -> str | None:
        """Every completed case's runs (quarantined ones flagged) into the history; a history
        that cannot be written costs the history, never the session's results. A server that
        cannot be reached costs not even that: the runs wait in the spool (``history.store``)."""
        target = self.history_target()
        if target is None or not any(ledger.completed for ledger in ledgers.values()):
            return None
        from scaleguard.evidence.baseline import git_commit
        from scaleguard.history.database import Batch, Fleet, HistoryError, appendable
        from scaleguard.history.store import deliver

        key, commit = self.hardware_key(), git_commit(self.rootpath)
        batches = []
        for source, ledger in ledgers.items():
            cases = [ledger.evidence(cid) for cid in ledger.completed]
            verdicts = {cid: str(getattr(v.status, "value", v.status)) for cid, v in ledger.verdicts.items()}
            projected = {cid: ledger.projection(cid) for cid in ledger.completed}
            projections = {cid: p.to_dict() for cid, p in projected.items() if p is not None}
            batches.append(Batch(cases, key, source, verdicts, commit, projections))
        try:
            rows = appendable(batches, str(target), Fleet.here(self.project()))
            done = deliver(target, rows, self.rootpath / ".scaleguard")
        except HistoryError as exc:
            return f"scaleguard: history not updated: {exc}"
        except Exception as exc:  # noqa: BLE001 - the history costs the history, never the results
            return f"scaleguard: history not updated ({type(exc).__name__}: {exc}); this is a scaleguard bug"
        first = next((case.case_id for batch in batches for case in batch.cases), None)
        ahead = self._search_ahead(target, key, first) if done.appended and first else ""
        return f"scaleguard: {done.line}{ahead}"

    def _search_ahead(self, target: HistoryTarget, key: str, case_id: str) -> str:
        """The night's long series searched for the next viewer (``memo.search_ahead``): a cache
        of the history's, so whatever stops it costs a line, never the night."""
        import time

        from scaleguard.history.database import HistoryError
        from scaleguard.history.memo import search_ahead
        from scaleguard.history.store import open_history

        start = time.monotonic()
        try:
            with open_history(target) as db:
                long = search_ahead(db, self.config.thresholds, self.rootpath / ".scaleguard", key, case_id)
        except HistoryError as exc:
            return f"; change points not searched ahead ({exc})"
        except Exception as exc:  # noqa: BLE001 - a cache: never the night's results
            return f"; change points not searched ahead ({type(exc).__name__}: {exc}; a scaleguard bug)"
        if not long:
            return ""
        return f"; change points of {long} long series searched ahead ({time.monotonic() - start:.1f} s)"

    def close(self) -> None:
        """What the backend holds: the idle pool's ranks (also after Ctrl-C between cases) and
        the run files, or the Slurm allocation (a cluster's files stay in the shared directory,
        for who reads them)."""
        if self._backend is not None:
            self._backend.release()
