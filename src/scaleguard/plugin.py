"""pytest11 entry point: ``--perf-*`` options and their ini twins, the case matrix as test
parameters, fixtures, pytest-benchmark machine_info, and the terminal summary. Hooks delegate."""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scaleguard.case import CaseSpec

# name, help, choices (None: free text)
_OPTIONS: tuple[tuple[str, str, tuple[str, ...] | None], ...] = (
    (
        "device",
        "where cases run: auto (cuda if visible, else cpu), cpu (gloo) or cuda (nccl)",
        ("auto", "cpu", "cuda"),
    ),
    (
        "profile",
        "model sizes: smoke (CPU-sized) or full; auto picks full on cuda, smoke on cpu",
        ("auto", "smoke", "full"),
    ),
    (
        "world-sizes",
        "comma list of world sizes (default cpu: 1,2; cuda: 1,2,4,... up to the GPU count)",
        None,
    ),
    ("modes", "comma list of single,dp,ddp,fsdp,compile (default single,dp,ddp)", None),
    ("models", "comma list of models (default: the profile's, or the --perf-workloads ones)", None),
    (
        "workloads",
        "your own workloads, comma list of package.module:attribute (a scaleguard.workload.Workload, "
        "its class, or a list of them); installed packages register theirs under the entry-point "
        "group scaleguard.workloads",
        None,
    ),
    (
        "peak-tflops",
        "the device's dense peak TFLOPS for MFU (default: a table by GPU name and precision; unknown on CPU)",
        None,
    ),
    ("precisions", "comma list of fp32,bf16 (default cuda: fp32,bf16; cpu: fp32)", None),
    ("scaling", "comma list of strong,weak (default both)", None),
    (
        "inputs",
        "comma list of synthetic,loader (default both; loader only for image models, weak scaling)",
        None,
    ),
    ("steps", "measured steps per case after warmup", None),
    ("warmup", "minimum warmup steps (then until the running median settles, capped)", None),
    ("timeout", "deadline in seconds for one case, all ranks (default 300 cpu, 900 cuda)", None),
    ("threads-per-rank", "CPU threads per rank (default: cores // largest world size)", None),
    ("data-root", "local CIFAR-10 directory for the loader cases (never downloads)", None),
    ("loader-workers", "DataLoader workers per rank for loader cases", None),
    ("baselines", "directory of baseline JSON files (default: <rootdir>/baselines)", None),
    ("baseline-torch", "compare with the baseline of this torch version (default: newest recorded)", None),
    (
        "threshold-step",
        "relative median step-time change that counts (default cuda 0.03, cpu 0.10; paired A/B on cpu 0.05)",
        None,
    ),
    (
        "threshold-efficiency",
        "scaling-efficiency drop in points that counts (default cuda 0.03, cpu 0.10; paired A/B on cpu 0.05)",
        None,
    ),
    ("threshold-memory", "relative peak-memory growth that counts (default 0.10)", None),
    (
        "repeats",
        "runs of every case, each in fresh processes, interleaved across cases (default 1; "
        "recording a baseline: 3)",
        None,
    ),
    (
        "confirm",
        "extra runs at most for a case that looks regressed, improved or undecided, added in "
        "blocks of 2 until decided (default 4; 0: judge the scheduled runs only)",
        None,
    ),
    ("keep-runs", "runs kept per case and torch version in a baseline file (default 10)", None),
    ("ab-b", "paired A/B: the Python of side B (a venv with other torch and scaleguard); turns A/B on", None),
    ("ab-a", "paired A/B: the Python of side A (default: the one running pytest)", None),
    ("ab-pairs", "paired A/B: most pairs per case (default 10 cpu, 6 cuda)", None),
    ("ab-markdown", "paired A/B: write the markdown report here", None),
    ("ab-plot", "paired A/B: write the PNG plot here", None),
    ("ab-save", "paired A/B: directory for A.json and B.json (pytest-benchmark format)", None),
    (
        "foreign-load-limit",
        "CPU cores that processes outside this session may use during a run's measured steps "
        "before the run is disturbed: set aside, measured again when quiet (default 0.25)",
        None,
    ),
    (
        "profile-steps",
        "step anatomy after the measured steps: phased steps with and without gradient sync, "
        "plus one profiled step (default 3; 0: off)",
        None,
    ),
    (
        "trace-dir",
        "where a REGRESSED case's Chrome trace is kept (default: <rootdir>/.scaleguard/traces)",
        None,
    ),
    (
        "history",
        "the history database every run is appended to (default: <rootdir>/.scaleguard/history.sqlite)",
        None,
    ),
    (
        "accept-reason",
        "why the --perf-accept cases are recorded although not OK (stored with their runs)",
        None,
    ),
)


@dataclass
class PerfState:
    """Per-session state, kept in ``config.stash``."""

    config: pytest.Config
    _planned: list[Any] | None = None
    _baselines: Any = None
    session: Any = None  # scaleguard.session.PerfSession, made by the first perf case
    run_root: Path | None = None  # rank files of every run; removed at the end
    pools: Any = None  # scaleguard.launcher.Pools: the rank processes cases share
    started: float = 0.0  # time.monotonic() at configure: the suite's wall time
    _ab_sides: Any = None
    _ab: Any = None  # scaleguard.ab.ABSession in a paired A/B session
    selected: tuple[CaseSpec, ...] = ()  # the perf cases this session will run, in order

    def option(self, name: str) -> str | None:
        value = self.config.getoption("perf_" + name.replace("-", "_"))
        if value is None:
            ini = self.config.getini("perf_" + name.replace("-", "_"))
            value = ini if ini not in ("", None, []) else None
        return None if value is None else str(value)

    def matrix_options(self) -> Any:
        from scaleguard.case import INPUTS, MODES, PRECISIONS, SCALINGS
        from scaleguard.matrix import MatrixOptions, parse_csv, parse_world_sizes

        def csv(name: str, allowed: tuple[str, ...] | None) -> tuple[str, ...] | None:
            text = self.option(name)
            return None if text is None else parse_csv(text, allowed, name)

        def integer(name: str) -> int | None:
            text = self.option(name)
            if text is None:
                return None
            if not text.isdigit() or int(text) < (0 if name in ("loader-workers", "profile-steps") else 1):
                raise ValueError(f"--perf-{name} takes a positive integer, got {text!r}")
            return int(text)

        ws = self.option("world-sizes")
        defaults = MatrixOptions()
        return MatrixOptions(
            device=self.option("device") or "auto",
            profile=self.option("profile") or "auto",
            world_sizes=parse_world_sizes(ws) if ws else None,
            modes=csv("modes", MODES) or defaults.modes,
            models=csv("models", None),
            precisions=csv("precisions", PRECISIONS),
            scalings=csv("scaling", SCALINGS) or defaults.scalings,
            inputs=csv("inputs", INPUTS) or defaults.inputs,
            steps=integer("steps"),
            warmup=integer("warmup"),
            threads_per_rank=integer("threads-per-rank"),
            data_root=self.option("data-root"),
            loader_workers=integer("loader-workers"),
            profile_steps=integer("profile-steps"),
            shared_gpu=self.flag("perf_share_gpu"),
            workloads=csv("workloads", None) or (),
        )

    def planned(self) -> list[Any]:
        if self._planned is None:
            from scaleguard.env import gpu_inventory
            from scaleguard.matrix import plan

            try:
                self._planned = plan(self.matrix_options(), gpu_inventory(), os.cpu_count() or 1)
            except ValueError as exc:
                raise pytest.UsageError(f"scaleguard: {exc}") from exc
        return self._planned

    def thresholds(self, device: str, paired: bool = False) -> Any:
        from dataclasses import replace

        from scaleguard.compare import USER_THRESHOLDS, Thresholds, parse_threshold

        thresholds = Thresholds.for_ab(device) if paired else Thresholds.for_device(device)
        try:
            values = {
                name: parse_threshold(name, str(self.option("threshold-" + name)))
                for name in USER_THRESHOLDS
                if self.option("threshold-" + name) is not None
            }
            self.case_rules()
        except ValueError as exc:
            raise pytest.UsageError(f"scaleguard: {exc}") from None
        return replace(thresholds, **values)  # type: ignore[arg-type]

    def case_rules(self) -> Any:
        """``perf_case_thresholds``, parsed once; a line that would be ignored is refused."""
        from scaleguard.compare import parse_case_rules

        try:
            return parse_case_rules(list(self.config.getini("perf_case_thresholds")))
        except ValueError as exc:
            raise pytest.UsageError(f"scaleguard: {exc}") from None

    def count(self, name: str, default: int, lo: int = 0, hi: int = 1000) -> int:
        text = self.option(name)
        if text is None:
            return default
        if not text.strip().isdigit() or not lo <= int(text) <= hi:
            raise pytest.UsageError(f"--perf-{name} takes an integer in [{lo}, {hi}], got {text!r}")
        return int(text)

    def baseline_context(self) -> Any:
        """Load this hardware's baseline once; a broken file, a missing directory or an
        unwritable one stops the session with the reason, before any case runs."""
        if self._baselines is not None:
            return self._baselines
        from scaleguard import baseline
        from scaleguard.env import host_fingerprint
        from scaleguard.ledger import BaselineContext

        spec = self.planned()[0].spec
        host = host_fingerprint()
        key = baseline.host_hardware_key(host, spec.device, spec.settings.threads_per_rank)
        given = self.option("baselines")
        directory = Path(given) if given else self.config.rootpath / "baselines"
        updating = self.update_baselines()
        if directory.exists() and not directory.is_dir():
            raise pytest.UsageError(f"scaleguard: --perf-baselines {directory} is a file, not a directory")
        if not directory.exists() and not updating and self.option("ab-b") is None:
            # (a paired A/B session judges B against A, never against a baseline)
            raise pytest.UsageError(
                f"scaleguard: {'--perf-baselines ' if given else 'the baselines directory '}{directory} "
                "does not exist; every case would be NEW and nothing judged. Check the path (or pass "
                "--perf-baselines DIR), or add --perf-update-baselines to create it."
            )
        accept = tuple(self.config.getoption("perf_accept") or ()) + tuple(self.config.getini("perf_accept"))
        reason = self.option("accept-reason")
        if accept and not reason:
            raise pytest.UsageError(
                "scaleguard: --perf-accept needs --perf-accept-reason TEXT: why these cases are "
                "recorded although not OK (stored with their runs)"
            )
        if updating and self.flag("perf_share_gpu"):
            raise pytest.UsageError(
                "scaleguard: --perf-share-gpu is a test mode (ranks share GPUs): its numbers are "
                "never written into a baseline; drop --perf-update-baselines"
            )
        if accept and not updating:
            raise pytest.UsageError(
                "scaleguard: --perf-accept only has a meaning with --perf-update-baselines"
            )
        path = directory / f"{key}.json"
        try:
            if updating:
                baseline.check_writable(directory)
                baseline.check_lock(path)
            loaded = baseline.load(path)
            baseline.check_matches(loaded, key, self.option("baseline-torch"), "--perf-baseline-torch")
        except baseline.BaselineError as exc:
            raise pytest.UsageError(f"scaleguard: {exc}") from exc
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
            },
            torch_pick=self.option("baseline-torch"),
            thresholds=self.thresholds(spec.device),
            per_case=list(self.case_rules()),
            commit=baseline.git_commit(self.config.rootpath),
            keep_runs=self.count("keep-runs", baseline.DEFAULT_KEEP_RUNS, lo=1),
            accept=accept,
            accept_reason=reason,
        )
        return self._baselines

    def history_path(self) -> Path | None:
        if self.flag("perf_no_history"):
            return None
        given = self.option("history")
        return Path(given) if given else self.config.rootpath / ".scaleguard" / "history.sqlite"

    def append_history(self, ledgers: dict[str, Any]) -> str | None:
        """Every completed case's runs (quarantined ones flagged) into the history; a history
        that cannot be written costs the history, never the session's results."""
        path = self.history_path()
        if path is None or not any(ledger.completed for ledger in ledgers.values()):
            return None
        from scaleguard.baseline import git_commit, host_hardware_key
        from scaleguard.env import host_fingerprint
        from scaleguard.history import History, HistoryError

        spec = self.planned()[0].spec
        key = host_hardware_key(host_fingerprint(), spec.device, spec.settings.threads_per_rank)
        added = 0
        try:
            with History(path) as history:
                for source, ledger in ledgers.items():
                    cases = [ledger.evidence(cid) for cid in ledger.completed]
                    verdicts = {cid: v.status if isinstance(v.status, str) else v.status.value
                                for cid, v in ledger.verdicts.items()}  # fmt: skip
                    added += history.append(cases, key, source, verdicts, git_commit(self.config.rootpath))
        except HistoryError as exc:
            return f"scaleguard: history not updated: {exc}"
        except Exception as exc:  # noqa: BLE001 - the history costs the history, never the results
            return f"scaleguard: history not updated ({type(exc).__name__}: {exc}); this is a scaleguard bug"
        return f"scaleguard: history {path}: {added} runs appended"

    def positive(self, name: str, hi: float, unit: str) -> float | None:
        """A finite number in (0, hi] from ``--perf-NAME`` or its ini twin; None when unset."""
        text = self.option(name)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not 0 < value <= hi:
            raise pytest.UsageError(f"--perf-{name} takes {unit}, got {text!r}")
        return value

    def peak_tflops(self) -> float | None:
        return self.positive("peak-tflops", 1e6, "TFLOPS (e.g. 989)")

    def foreign_limit(self) -> float | None:
        """Cores of foreign load that disturb a run; None when the check is off."""
        if self.flag("perf_no_load_check"):
            return None
        value = self.positive("foreign-load-limit", 1024, "cores (e.g. 0.25)")
        if value is None:
            from scaleguard.foreign_load import DEFAULT_LIMIT_CORES

            return DEFAULT_LIMIT_CORES
        return value

    def ab_sides(self) -> tuple[Any, Any] | None:
        """The two probed sides of a paired A/B session; None when A/B is off."""
        if self.option("ab-b") is None:
            return None
        if self._ab_sides is None:
            import sys

            from scaleguard import ab

            def env(side: str) -> list[tuple[str, str]]:
                items = list(self.config.getoption(f"perf_ab_env_{side}") or ())
                items += list(self.config.getini(f"perf_ab_env_{side}"))
                try:
                    return ab.parse_env(items, f"--perf-ab-env-{side}")
                except ab.ABInputError as exc:
                    raise pytest.UsageError(f"scaleguard: {exc}") from None

            if self.update_baselines():
                raise pytest.UsageError(
                    "scaleguard: --perf-ab-b compares two installs in pairs; "
                    "record baselines in a plain session"
                )
            try:
                self._ab_sides = (
                    ab.probe("A", self.option("ab-a") or sys.executable, env("a")),
                    ab.probe("B", str(self.option("ab-b")), env("b")),
                )
            except ab.ABInputError as exc:
                raise pytest.UsageError(f"scaleguard: {exc}") from None
        return self._ab_sides

    def ab_session(self) -> Any:
        """The paired A/B scheduler, made once (when --perf-ab-b is given)."""
        sides = self.ab_sides()
        if sides is None:
            return None
        if self._ab is None:
            import functools
            import tempfile

            from scaleguard import ab, runner

            device = self.planned()[0].spec.device
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            thresholds = self.thresholds(device, paired=True)
            per_case = self.case_rules()

            def progress(line: str) -> None:
                if reporter is not None:
                    reporter.write_line(f"scaleguard: {line}")

            from scaleguard.compare import thresholds_for

            self.run_root = self.run_root or Path(tempfile.mkdtemp(prefix="scaleguard-runs-"))
            self._ab = ab.ABSession(
                sides[0],
                sides[1],
                self.run_root,
                self.timeout_s(),
                lambda case_id: thresholds_for(case_id, thresholds, per_case),
                ab.ABSchedule.for_device(device, self.count("ab-pairs", 0, lo=0, hi=1000) or None),
                run=functools.partial(runner.run_once, foreign_limit_cores=self.foreign_limit()),
                on_run=progress,
            )
        return self._ab

    def keep_trace(self, evidence: Any) -> Path | None:
        """Copy the last run's Chrome trace out of the run directory (removed at the end) into
        ``--perf-trace-dir``; the path, or None when the run has none."""
        import shutil

        traces = [r.anatomy.trace for r in evidence.runs if r.anatomy and r.anatomy.trace]
        if not traces or not Path(traces[-1]).is_file():
            return None
        text = self.option("trace-dir")
        directory = Path(text) if text else self.config.rootpath / ".scaleguard" / "traces"
        target = directory / f"{evidence.case_id}.{evidence.runs[-1].run_id}.trace.json"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(traces[-1], target)
        except OSError as exc:  # a trace is a help, not the verdict: say why it is missing
            return Path(f"(not kept: {exc})")
        return target

    def perf_session(self) -> Any:
        """The session's scheduler and ledger, made once."""
        if self.session is None:
            import functools
            import tempfile
            import time
            import uuid

            from scaleguard import foreign_load, runner
            from scaleguard.ledger import Ledger
            from scaleguard.session import PerfSession

            reporter = self.config.pluginmanager.get_plugin("terminalreporter")

            def progress(line: str) -> None:
                if reporter is not None:
                    reporter.write_line(f"scaleguard: {line}")

            limit = self.foreign_limit()

            def wait_quiet(seconds: float) -> None:
                if limit is not None:
                    foreign_load.wait_quiet(limit, seconds)

            from scaleguard.launcher import Pools

            self.run_root = Path(tempfile.mkdtemp(prefix="scaleguard-runs-"))
            self.pools = Pools(self.run_root / "pools", isolate=bool(self.flag("perf_isolate")))
            self.session = PerfSession(
                Ledger(f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}", self.baseline_context()),
                self.run_root,
                self.timeout_s(),
                self.schedule(),
                run=functools.partial(runner.run_once, foreign_limit_cores=limit, pools=self.pools),
                on_run=progress,
                wait_quiet=wait_quiet,
            )
            from scaleguard.machine_probe import run_probe

            # before the first case: how fast this machine is, beside the baseline runs'
            speed = run_probe()
            if speed is not None:
                self.session.ledger.machine = speed.to_dict()
            from scaleguard.report import machine_line

            progress(machine_line(speed, self.baseline_context().file))
        return self.session

    def schedule(self) -> Any:
        from scaleguard.session import Schedule

        device = self.planned()[0].spec.device if self.planned() else "cpu"
        return Schedule.for_device(
            device,
            repeats=self.count("repeats", 1, lo=1, hi=100),
            confirm=self.count("confirm", Schedule.for_device(device).confirm, hi=100),
            anatomy_on_every_run=self.update_baselines(),
        )

    def flag(self, dest: str) -> bool:
        """A store_true option, or its ini twin."""
        value = self.config.getoption(dest)
        return bool(value if value is not None else self.config.getini(dest))

    def update_baselines(self) -> bool:
        return self.flag("perf_update_baselines")

    def timeout_s(self) -> float:
        text = self.option("timeout")
        if text is not None:
            try:
                value = float(text)
            except ValueError:
                raise pytest.UsageError(f"--perf-timeout takes seconds, got {text!r}") from None
            if not math.isfinite(value) or value <= 0 or value > 7 * 24 * 3600:
                raise pytest.UsageError(f"--perf-timeout must be finite, positive seconds, got {text!r}")
            return value
        planned = self.planned()
        return 900.0 if planned and planned[0].spec.device == "cuda" else 300.0


STATE = pytest.StashKey[PerfState]()

# on/off options (store_true, each with a bool ini twin): (name, help)
_FLAGS = (
    ("update-baselines", "merge this run's good cases into the baseline file"),
    (
        "no-load-check",
        "do not watch for other processes' CPU/GPU load during runs (a busy machine is then "
        "judged like a quiet one)",
    ),
    ("no-history", "do not append this session's runs to the history database"),
    (
        "share-gpu",
        "test mode: ranks of world sizes above the GPU count share the GPUs round-robin over gloo "
        "(exercises multi-rank CUDA on one GPU; never a scaling figure, never recorded)",
    ),
    (
        "isolate",
        "fresh rank processes for every run (default: consecutive cases of one model and world "
        "size share ranks; two runs of one case never do)",
    ),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scaleguard", "scaleguard performance regression suite")
    for name, help_text, choices in _OPTIONS:
        dest = "perf_" + name.replace("-", "_")
        group.addoption(f"--perf-{name}", dest=dest, default=None, choices=choices, help=help_text)
        parser.addini(dest, f"{help_text} (ini twin of --perf-{name})", default=None)
    for name, help_text in _FLAGS:
        dest = "perf_" + name.replace("-", "_")
        group.addoption(f"--perf-{name}", dest=dest, action="store_true", default=None, help=help_text)
        parser.addini(dest, f"ini twin of --perf-{name}", type="bool", default=False)
    group.addoption(
        "--perf-accept",
        dest="perf_accept",
        action="append",
        default=None,
        metavar="GLOB",
        help="with --perf-update-baselines: record the cases matching GLOB whatever their verdict "
        "(REGRESSED, INCONCLUSIVE), restarting their entry; needs --perf-accept-reason",
    )
    parser.addini("perf_accept", "ini twin of --perf-accept (one glob per line)", type="linelist", default=[])
    for side in ("a", "b"):
        group.addoption(
            f"--perf-ab-env-{side}",
            dest=f"perf_ab_env_{side}",
            action="append",
            default=None,
            metavar="KEY=VALUE",
            help=f"paired A/B: an environment variable for side {side.upper()}'s ranks only (repeatable)",
        )
        parser.addini(f"perf_ab_env_{side}", f"ini twin of --perf-ab-env-{side}", type="linelist", default=[])
    parser.addini(
        "perf_case_thresholds",
        "per-case threshold overrides, one per line: '<case-id glob> step=0.08 efficiency=0.05 memory=0.2'",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perf: a scaleguard performance case (runs worker processes)")
    import time

    state = PerfState(config, started=time.monotonic())
    config.stash[STATE] = state
    if any(state.option(name) is not None for name, _, _ in _OPTIONS):
        state.planned()  # bad --perf-* values are usage errors now, not collection errors
        state.timeout_s()
        state.schedule()
        state.foreign_limit()
        state.peak_tflops()
        state.ab_sides()  # a missing or torch-less B interpreter is a usage error now
        if state.planned():
            state.thresholds(state.planned()[0].spec.device)
        _check_data_root(state.option("data-root"))
    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(_BenchmarkHooks(state), "scaleguard-benchmark-hooks")


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(STATE, None)
    if state is None:
        return []
    try:
        planned = state.planned()
    except pytest.UsageError:
        return []
    from scaleguard.env import gpu_inventory
    from scaleguard.matrix import describe

    return describe(planned, gpu_inventory())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "perf_case" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[STATE]
    serial_reason = None
    if hasattr(metafunc.config, "workerinput"):
        serial_reason = (
            "perf cases run serially: under pytest-xdist cases would share devices "
            "and pytest-benchmark switches itself off"
        )
    params = []
    # cases that can share rank processes run back to back (launcher.PoolKey: model and
    # process count): per model, world sizes in ascending order, so a group's world-size-1
    # runs still come before the runs scaled against them
    planned_cases = state.planned()
    model_order = {m: i for i, m in reversed(list(enumerate(p.spec.model for p in planned_cases)))}
    for planned in sorted(planned_cases, key=lambda p: (model_order[p.spec.model], p.spec.nprocs)):
        reason = serial_reason or planned.skip_reason
        marks = [pytest.mark.perf] + ([pytest.mark.skip(reason=reason)] if reason else [])
        if metafunc.config.pluginmanager.hasplugin("timeout"):
            # --perf-timeout is each run's deadline; pytest-timeout must not cut in before a
            # case's last legitimate run (confirm runs and quarantine re-measures included)
            schedule = state.schedule()
            runs = (1 + schedule.confirm) * (1 + schedule.quarantine_retries)
            pause = schedule.quarantine_pause_s * schedule.quarantine_retries * (1 + schedule.confirm)
            marks.append(pytest.mark.timeout(state.timeout_s() * runs + pause + 60))
        params.append(pytest.param(planned.spec, id=planned.spec.case_id, marks=marks))
    metafunc.parametrize("perf_case", params)


def _check_data_root(root: str | None) -> None:
    """A missing CIFAR-10 would fail every loader case after its ranks start: say it now."""
    if root is None:
        return
    path = Path(root)
    if not (path / "cifar-10-batches-py").is_dir():
        raise pytest.UsageError(
            f"scaleguard: --perf-data-root {root}: no CIFAR-10 there "
            f"(expected {path / 'cifar-10-batches-py'}, "
            "as torchvision.datasets.CIFAR10 unpacks it). scaleguard never downloads; leave the "
            "option out to use FakeData."
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [item for item in session.items if "perf_case" in getattr(item, "fixturenames", ())]
    if items:
        state = session.config.stash[STATE]
        # a broken baseline file stops the run before any case is measured, as a usage error
        state.baseline_context()
        planned_ids = [p.spec.case_id for p in state.planned()]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for rule in state.case_rules():
            if not any(fnmatch.fnmatchcase(case_id, rule.pattern) for case_id in planned_ids):
                message = (
                    f"scaleguard: warning: perf_case_thresholds line {rule.line!r} matches no case "
                    "of this matrix: it changes nothing"
                )
                if reporter is not None:
                    reporter.write_line(message, yellow=True)
        state.selected = tuple(
            item.callspec.params["perf_case"]
            for item in items
            if hasattr(item, "callspec") and item.get_closest_marker("skip") is None
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    """``--perf-repeats R``: runs 1..R-1 of every selected case, round-robin, before the first
    test; outside any test item, so no per-test timeout applies to the whole prefetch."""
    state = session.config.stash[STATE]
    if state.selected and not session.config.option.collectonly and state.schedule().repeats > 1:
        state.perf_session().prefetch(state.selected)
    return (yield)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None and state.pools is not None:
        state.pools.close()  # the idle pool's ranks, also after Ctrl-C between cases
    if state is not None and state.run_root is not None:
        import shutil

        shutil.rmtree(state.run_root, ignore_errors=True)


@pytest.fixture(scope="session")
def perf_session(request: pytest.FixtureRequest) -> Any:
    """Session-wide scheduler and ledger: spawns each run's ranks and keeps the evidence."""
    return request.config.stash[STATE].perf_session()


@pytest.fixture
def perf_run(perf_session: Any, benchmark: Any, request: pytest.FixtureRequest) -> Callable[[CaseSpec], Any]:
    """Run a case (its runs, and confirm runs when it looks changed), store its steps in
    pytest-benchmark; a failed case or a REGRESSED verdict fails the test cleanly."""
    from scaleguard import benchmark_io
    from scaleguard.launcher import CaseFailedError

    def run(spec: CaseSpec) -> Any:
        ab_session = request.config.stash[STATE].ab_session()
        if ab_session is not None:
            try:
                paired = ab_session.measure(spec)
            except CaseFailedError as exc:
                pytest.fail(str(exc), pytrace=False)
            side_a = ab_session.ledgers["A"]
            benchmark_io.record(benchmark, side_a.results[spec.case_id], side_a.evidence(spec.case_id), None)
            benchmark.extra_info.update({"ab_verdict": paired.status, "ab_story": paired.story})
            if paired.failed:
                pytest.fail(paired.story, pytrace=False)
            return side_a.evidence(spec.case_id)
        try:
            verdict = perf_session.measure(spec)
        except CaseFailedError as exc:
            pytest.fail(str(exc), pytrace=False)
        ledger = perf_session.ledger
        evidence = ledger.evidence(spec.case_id)
        benchmark_io.record(
            benchmark,
            ledger.results[spec.case_id],
            evidence,
            verdict,
            request.config.stash[STATE].peak_tflops(),
        )
        if verdict is not None and verdict.failed:
            kept = request.config.stash[STATE].keep_trace(evidence)
            pytest.fail(verdict.story + (f"; trace of the last run: {kept}" if kept else ""), pytrace=False)
        return evidence

    return run


class _BenchmarkHooks:
    """Hooks that exist only when pytest-benchmark is loaded."""

    def __init__(self, state: PerfState) -> None:
        self.state = state

    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, Any]
    ) -> None:
        from scaleguard import benchmark_io
        from scaleguard.env import host_fingerprint

        planned = self.state.planned() if self.state._planned is not None else []
        if not planned:
            return
        from scaleguard.baseline import host_hardware_key

        spec = planned[0].spec
        host = host_fingerprint()
        threads = spec.settings.threads_per_rank
        benchmark_io.update_machine_info(
            machine_info,
            host,
            spec.device,
            spec.profile,
            threads,
            host_hardware_key(host, spec.device, threads),
        )


@pytest.hookimpl(wrapper=True)
def pytest_terminal_summary(
    terminalreporter: Any, exitstatus: int, config: pytest.Config
) -> Generator[None, None, None]:
    result = yield
    state = config.stash.get(STATE, None)
    if state is not None and state._ab is not None:
        _ab_summary(terminalreporter, state)
        line = state.append_history({"ab-A": state._ab.ledgers["A"], "ab-B": state._ab.ledgers["B"]})
        if line:
            terminalreporter.write_line(line)
        return result
    session = state.session if state else None
    if session is None or not (session.ledger.records or session.ledger.failures):
        return result
    from scaleguard import report

    ledger = session.ledger
    terminalreporter.section("scaleguard scaling")
    width = max(100, terminalreporter._tw.fullwidth)
    terminalreporter.write(
        report.render(report.scaling_tables(ledger, state.peak_tflops() if state else None), width)
    )
    for case_id, reason in ledger.failures.items():
        terminalreporter.write_line(f"FAILED {case_id}: {reason}")
    for line in report.verdict_lines(list(ledger.verdicts.values())):
        terminalreporter.write_line(line)
    for line in report.disturbance_lines(ledger):
        terminalreporter.write_line(line)
    import time

    for line in report.time_lines(ledger, time.monotonic() - state.started if state else 0.0):
        terminalreporter.write_line(line)
    if state is not None and state.update_baselines():
        for line in report.baseline_update_lines(ledger, exitstatus == pytest.ExitCode.INTERRUPTED):
            terminalreporter.write_line(line)
    if state is not None:
        line = state.append_history({"suite": ledger})
        if line:
            terminalreporter.write_line(line)
    return result


def _ab_summary(terminalreporter: Any, state: PerfState) -> None:
    """The paired A/B table and stories, and the files asked for."""
    from scaleguard import benchmark_io, report
    from scaleguard.env import host_fingerprint

    session = state._ab
    terminalreporter.section("scaleguard A/B")
    terminalreporter.write(
        report.render([report.ab_table(session)], max(100, terminalreporter._tw.fullwidth))
    )
    for verdict in session.verdicts.values():
        if verdict.status != "SAME" or verdict.dropped:  # a dropped pair is always reported
            terminalreporter.write_line(verdict.story)
    for name in ("ab-markdown", "ab-plot", "ab-save"):
        if state.option(name):
            target = Path(str(state.option(name)))
            (target if name == "ab-save" else target.parent).mkdir(parents=True, exist_ok=True)
    if state.option("ab-markdown"):
        Path(str(state.option("ab-markdown"))).write_text(report.ab_markdown(session), encoding="utf-8")
    if state.option("ab-plot") and session.verdicts:
        report.ab_plot(session, Path(str(state.option("ab-plot"))))
    if state.option("ab-save"):
        directory = Path(str(state.option("ab-save")))
        from scaleguard.baseline import host_hardware_key

        spec = state.planned()[0].spec
        host = host_fingerprint()
        threads = spec.settings.threads_per_rank
        # the same machine_info as a plain session's save: the hardware key makes the two
        # sides comparable by `scaleguard compare` (a file without one is refused)
        machine_info: dict[str, Any] = {}
        key = host_hardware_key(host, spec.device, threads)
        benchmark_io.update_machine_info(machine_info, host, spec.device, spec.profile, threads, key)
        for label in ("A", "B"):
            benchmark_io.write_saved_run(
                directory / f"{label}.json", session.ledgers[label], machine_info, label
            )
        terminalreporter.write_line(
            f"scaleguard: A/B sides saved as {directory / 'A.json'} and {directory / 'B.json'}"
        )
