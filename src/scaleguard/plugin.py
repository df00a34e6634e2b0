"""pytest11 entry point: ``--perf-*`` options and their ini twins, the case matrix as test
parameters, fixtures, pytest-benchmark machine_info, and the terminal summary. Hooks delegate."""

from __future__ import annotations

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
    ("modes", "comma list of single,dp,ddp,fsdp (default single,dp,ddp)", None),
    ("models", "comma list of models (default: the profile's)", None),
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
    ("threshold-step", "relative median step-time change that counts (default 0.05)", None),
    ("threshold-efficiency", "scaling-efficiency drop in points that counts (default 0.03)", None),
    ("threshold-memory", "relative peak-memory growth that counts (default 0.10)", None),
)


@dataclass
class PerfState:
    """Per-session state, kept in ``config.stash``."""

    config: pytest.Config
    _planned: list[Any] | None = None
    _baselines: Any = None
    runner: Any = None
    host: Any = None

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
            if not text.isdigit() or int(text) < (0 if name == "loader-workers" else 1):
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

    def baseline_context(self) -> Any:
        """Load this hardware's baseline once; a broken file stops the session with the reason."""
        if self._baselines is not None:
            return self._baselines
        from scaleguard import baseline
        from scaleguard.compare import Thresholds
        from scaleguard.env import host_fingerprint
        from scaleguard.runner import BaselineContext

        spec = self.planned()[0].spec
        host = host_fingerprint()
        key = baseline.host_hardware_key(host, spec.device, spec.settings.threads_per_rank)
        directory = Path(self.option("baselines") or self.config.rootpath / "baselines")
        path = directory / f"{key}.json"
        try:
            thresholds = Thresholds.for_device(spec.device)
            overrides = " ".join(
                f"{name}={self.option('threshold-' + name)}"
                for name in ("step", "efficiency", "memory")
                if self.option("threshold-" + name) is not None
            )
            if overrides:
                thresholds = Thresholds.parse_overrides(thresholds, overrides)
            loaded = baseline.load(path)
        except (ValueError, baseline.BaselineError) as exc:
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
            thresholds=thresholds,
            per_case=list(self.config.getini("perf_case_thresholds")),
            commit=baseline.git_commit(self.config.rootpath),
        )
        return self._baselines

    def update_baselines(self) -> bool:
        flag = self.config.getoption("perf_update_baselines")
        return bool(flag if flag is not None else self.config.getini("perf_update_baselines"))

    def timeout_s(self) -> float:
        text = self.option("timeout")
        if text is not None:
            try:
                value = float(text)
            except ValueError:
                raise pytest.UsageError(f"--perf-timeout takes seconds, got {text!r}") from None
            if value <= 0:
                raise pytest.UsageError(f"--perf-timeout must be positive, got {text!r}")
            return value
        planned = self.planned()
        return 900.0 if planned and planned[0].spec.device == "cuda" else 300.0


STATE = pytest.StashKey[PerfState]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scaleguard", "scaleguard performance regression suite")
    for name, help_text, choices in _OPTIONS:
        dest = "perf_" + name.replace("-", "_")
        group.addoption(f"--perf-{name}", dest=dest, default=None, choices=choices, help=help_text)
        parser.addini(dest, f"{help_text} (ini twin of --perf-{name})", default=None)
    group.addoption(
        "--perf-update-baselines",
        dest="perf_update_baselines",
        action="store_true",
        default=None,
        help="merge this run's good cases into the baseline file",
    )
    parser.addini("perf_update_baselines", "ini twin of --perf-update-baselines", type="bool", default=False)
    parser.addini(
        "perf_case_thresholds",
        "per-case threshold overrides, one per line: '<case-id glob> step=0.08 efficiency=0.05 memory=0.2'",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perf: a scaleguard performance case (runs worker processes)")
    state = PerfState(config)
    config.stash[STATE] = state
    if any(state.option(name) is not None for name, _, _ in _OPTIONS):
        state.planned()  # bad --perf-* values are usage errors now, not collection errors
        state.timeout_s()
    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(_BenchmarkHooks(state), "scaleguard-benchmark-hooks")


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
    for planned in state.planned():
        reason = serial_reason or planned.skip_reason
        marks = [pytest.mark.perf] + ([pytest.mark.skip(reason=reason)] if reason else [])
        if metafunc.config.pluginmanager.hasplugin("timeout"):
            # --perf-timeout is the case's deadline; pytest-timeout must not cut in before it
            marks.append(pytest.mark.timeout(state.timeout_s() + 60))
        params.append(pytest.param(planned.spec, id=planned.spec.case_id, marks=marks))
    metafunc.parametrize("perf_case", params)


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("perf_case" in getattr(item, "fixturenames", ()) for item in session.items):
        # a broken baseline file stops the run before any case is measured, as a usage error
        session.config.stash[STATE].baseline_context()


@pytest.fixture(scope="session")
def perf_runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Session-wide runner: spawns each case's ranks and keeps the results."""
    from scaleguard.runner import PerfRunner

    state = request.config.stash[STATE]
    if state.runner is None:
        state.runner = PerfRunner(
            tmp_path_factory.mktemp("scaleguard-runs"), state.timeout_s(), state.baseline_context()
        )
    return state.runner


@pytest.fixture
def perf_run(perf_runner: Any, benchmark: Any) -> Callable[[CaseSpec], Any]:
    """Run a case, store its steps in pytest-benchmark; a failed case fails the test cleanly."""
    from scaleguard import benchmark_io
    from scaleguard.launcher import CaseFailedError

    def run(spec: CaseSpec) -> Any:
        try:
            result = perf_runner.run(spec)
        except CaseFailedError as exc:
            pytest.fail(str(exc), pytrace=False)
        benchmark_io.record(benchmark, result)
        verdict = perf_runner.judge(result)
        if verdict is not None:
            benchmark.extra_info["verdict"] = verdict.status.value
            benchmark.extra_info["verdict_story"] = verdict.story
            if verdict.failed:
                pytest.fail(verdict.story, pytrace=False)
        return result

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
        spec = planned[0].spec
        benchmark_io.update_machine_info(
            machine_info, host_fingerprint(), spec.device, spec.profile, spec.settings.threads_per_rank
        )


@pytest.hookimpl(wrapper=True)
def pytest_terminal_summary(
    terminalreporter: Any, exitstatus: int, config: pytest.Config
) -> Generator[None, None, None]:
    result = yield
    state = config.stash.get(STATE, None)
    runner = state.runner if state else None
    if runner is None or not (runner.results or runner.failures):
        return result
    from scaleguard import report

    terminalreporter.section("scaleguard scaling")
    width = max(100, terminalreporter._tw.fullwidth)
    tables = report.scaling_tables(runner.results.values(), runner.verdicts)
    terminalreporter.write(report.render(tables, width))
    for case_id, reason in runner.failures.items():
        terminalreporter.write_line(f"FAILED {case_id}: {reason}")
    for verdict in runner.verdicts.values():
        if verdict.status.value != "OK":
            terminalreporter.write_line(verdict.story)
    if state is not None and state.update_baselines():
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            terminalreporter.write_line("scaleguard: interrupted: baselines not updated")
        else:
            from scaleguard.baseline import BaselineError

            try:
                path, written, left_out = runner.update_baselines()
            except BaselineError as exc:
                terminalreporter.write_line(f"scaleguard: baselines not updated: {exc}")
                return result
            terminalreporter.write_line(
                f"scaleguard: baseline {path}: {len(written)} cases recorded"
                + (f"; left out as too noisy: {', '.join(left_out)}" if left_out else "")
            )
    return result
