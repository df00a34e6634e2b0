"""pytest11 entry point: ``--perf-*`` options and their ini twins, the case matrix as test
parameters, fixtures, pytest-benchmark machine_info, and the terminal summary. Hooks delegate."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from scaleguard import options
from scaleguard.case import CaseSpec
from scaleguard.config import ConfigError, PerfConfig, check_output_path
from scaleguard.evidence.verdict import Status
from scaleguard.suite import Suite

if TYPE_CHECKING:
    from scaleguard.schedule.matrix import PlannedCase


def read_config(config: pytest.Config) -> PerfConfig:
    """Every ``--perf-*`` option and its ini twin, read and checked once."""

    def text(name: str) -> str | None:
        dest = "perf_" + name.replace("-", "_")
        value = config.getoption(dest)
        if value is None:
            ini = config.getini(dest)
            value = ini if ini not in ("", None, []) else None
        return None if value is None else str(value)

    def flag(name: str) -> bool:
        dest = "perf_" + name.replace("-", "_")
        value = config.getoption(dest)
        return bool(value if value is not None else config.getini(dest))

    def lines(name: str) -> list[str]:
        dest = "perf_" + name.replace("-", "_")
        given = config.getoption(dest, None) if options.BY_NAME[name].kind == "lines" else None
        return list(given or ()) + list(config.getini(dest))

    with usage_errors():
        return PerfConfig.read(text, flag, lines, os.environ)


def _workload_entry_points() -> bool:
    """Whether any installed package offers workloads (metadata only: nothing imported)."""
    from importlib.metadata import entry_points

    return bool(entry_points(group="scaleguard.workloads"))


@contextlib.contextmanager
def usage_errors() -> Generator[None, None, None]:
    """A problem the user can fix stops pytest as a usage error (exit 4), without a traceback."""
    try:
        yield
    except ConfigError as exc:
        raise pytest.UsageError(f"scaleguard: {exc}") from None


STATE = pytest.StashKey[Suite]()


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_pytest_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "perf: a scaleguard performance case (runs worker processes)")
    perf_config = read_config(config)  # a bad value is a usage error now, before collection

    def progress(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        # written during a test (the machine probe, confirm runs), a line would land in the
        # test's captured output, seen only if it fails: show it live, as live logging does
        capture = config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(f"scaleguard: {line}")

    perf_config = _default_history_or_none(perf_config, config.rootpath, progress)
    state = Suite(perf_config, config.rootpath, progress)
    config.stash[STATE] = state
    if perf_config != PerfConfig() or _workload_entry_points():
        # an installed workload that cannot load is the user's to fix: a usage error now, not
        # a collection traceback later
        with usage_errors():
            state.planned()  # a matrix this machine cannot plan is a usage error now
            if perf_config.slurm is None:
                # so is a missing or torch-less B interpreter; on a cluster a side lives where
                # its steps run (its container): probed in a step at its first case
                state.ab_sides()
    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(_BenchmarkHooks(state), "scaleguard-benchmark-hooks")
    if perf_config.slurm is not None:  # (the backend is made lazily; its kind is known now)
        _release_on_signals()


def _default_history_or_none(
    perf_config: PerfConfig, rootpath: Path, progress: Callable[[str], None]
) -> PerfConfig:
    """The default history (``<rootdir>/.scaleguard/history.sqlite``) checked at configure as a
    given ``--perf-history`` is. Nobody asked for it, so a read-only checkout keeps the session:
    one line says the session keeps no history, instead of a failed write at its end."""
    if perf_config.history is not None or not perf_config.record_history:
        return perf_config
    default = rootpath / ".scaleguard" / "history.sqlite"
    try:
        check_output_path(default, "the default history")
    except ConfigError as exc:
        progress(f"{exc}: this session keeps no history (give --perf-history PATH, or --perf-no-history)")
        return dataclasses.replace(perf_config, record_history=False)
    return perf_config


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP ended the session: unwound as Ctrl-C is, so every step and the
    allocation are released on the way out (``Suite.close``)."""


def _release_on_signals() -> None:
    """SIGTERM and SIGHUP (scancel of a wrapper job, its time limit with ``--signal``, a
    watchdog, a dropped ssh) end the session as Ctrl-C does, instead of killing it with its
    allocation held. The first one unwinds; later ones are ignored so the release finishes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        name = signal.Signals(signum).name
        raise Terminated(f"{name}: the session releases its Slurm allocation and stops")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(STATE, None)
    if state is None:
        return []
    try:
        planned = state.planned()
    except ConfigError:
        return []
    from scaleguard.machine.env import gpu_inventory
    from scaleguard.schedule.matrix import describe

    return describe(planned, gpu_inventory()) + [
        f"scaleguard: FAULT INJECTED into every run ({where}): SCALEGUARD_INJECT_FAULT={fault} "
        "(--perf-inject-faults): a test of the harness, not a measurement"
        for where, fault in state.config.inject_faults
    ]


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
    with usage_errors():
        planned_cases = state.planned()
    model_order = {m: i for i, m in reversed(list(enumerate(p.spec.model for p in planned_cases)))}

    def order(p: PlannedCase) -> tuple[int, ...]:
        if state.backend.orders_by_nodes:
            # on a cluster, each run is a job step (no pools): the world-size-1 references
            # first, then the most nodes first, so the allocation gives nodes back as the
            # node count falls (Suite.case_done)
            return (p.spec.world_size != 1, -p.spec.settings.nodes, model_order[p.spec.model], p.spec.nprocs)
        return (model_order[p.spec.model], p.spec.nprocs)

    for planned in sorted(planned_cases, key=order):
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


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [item for item in session.items if "perf_case" in getattr(item, "fixturenames", ())]
    if items:
        state = session.config.stash[STATE]
        state.select(
            tuple(
                item.callspec.params["perf_case"]
                for item in items
                if hasattr(item, "callspec") and item.get_closest_marker("skip") is None
            ),
            bool(session.config.option.collectonly),
        )  # (a cluster's allocation holds as many nodes as these need)
        # a broken baseline file stops the run before any case is measured, as a usage error
        with usage_errors():
            state.baseline_context()
        planned_ids = [p.spec.case_id for p in state.planned()]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for rule in state.config.thresholds.per_case:
            if not any(fnmatch.fnmatchcase(case_id, rule.pattern) for case_id in planned_ids):
                message = (
                    f"scaleguard: warning: perf_case_thresholds line {rule.line!r} matches no case "
                    "of this matrix: it changes nothing"
                )
                if reporter is not None:
                    reporter.write_line(message, yellow=True)


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
    if state is not None:
        state.close()


@pytest.fixture(scope="session")
def perf_session(request: pytest.FixtureRequest) -> Any:
    """Session-wide scheduler and ledger: spawns each run's ranks and keeps the evidence."""
    return request.config.stash[STATE].perf_session()


def _fail_or_skip(exc: Exception, state: Suite | None = None) -> NoReturn:
    """A case that failed fails its test; one that never started (its cluster allocation stayed
    pending) is skipped instead when the user asked for that (--perf-slurm-skip-pending); one
    the cluster took away (its allocation lost, and the new one too) is an infrastructure
    outcome: skipped, listed apart, and the session exits EXIT_INFRASTRUCTURE if nothing failed."""
    if getattr(exc, "infra", False):
        if state is not None:
            state.infrastructure[getattr(exc, "case_id", "?")] = str(exc)
        pytest.skip(f"INFRASTRUCTURE: {exc}")
    if getattr(exc, "skip", False):
        pytest.skip(str(exc))
    pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(STATE, None)
    if state is not None and state.infrastructure and session.exitstatus == pytest.ExitCode.OK:
        from scaleguard.schedule.slurm import EXIT_INFRASTRUCTURE

        session.exitstatus = EXIT_INFRASTRUCTURE


@pytest.fixture
def perf_run(perf_session: Any, benchmark: Any, request: pytest.FixtureRequest) -> Callable[[CaseSpec], Any]:
    """Run a case (its runs, and confirm runs when it looks changed), store its steps in
    pytest-benchmark; a failed case or a REGRESSED verdict fails the test cleanly."""
    from scaleguard.evidence import benchmark_io
    from scaleguard.ranks.protocol import CaseFailedError

    def run(spec: CaseSpec) -> Any:
        try:
            return measure(spec)
        finally:
            request.config.stash[STATE].case_done(spec)

    def measure(spec: CaseSpec) -> Any:
        try:
            ab_session = request.config.stash[STATE].ab_session()
        except ConfigError as exc:  # a cluster side that failed its probe: the user's to fix
            pytest.exit(f"scaleguard: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        if ab_session is not None:
            try:
                paired = ab_session.measure(spec)
            except CaseFailedError as exc:
                _fail_or_skip(exc, request.config.stash[STATE])
            side_a = ab_session.ledgers["A"]
            benchmark.extra_info.update({"ab_verdict": paired.status.value, "ab_story": paired.story})
            if spec.case_id not in side_a.records:  # NOISY: every pair disturbed, nothing kept
                return None
            benchmark_io.record(benchmark, spec, side_a.evidence(spec.case_id), None)
            if paired.failed:
                pytest.fail(paired.story, pytrace=False)
            return side_a.evidence(spec.case_id)
        try:
            verdict = perf_session.measure(spec)
        except CaseFailedError as exc:
            _fail_or_skip(exc, request.config.stash[STATE])
        ledger = perf_session.ledger
        evidence = ledger.evidence(spec.case_id)
        benchmark_io.record(
            benchmark,
            spec,
            evidence,
            verdict,
            request.config.stash[STATE].config.peak_tflops,
            ledger.projection(spec.case_id),
        )
        below = verdict is not None and verdict.status is Status.BELOW_PROJECTION
        fail_below = below and request.config.stash[STATE].config.fail_below_projection
        if verdict is not None and (verdict.failed or fail_below):
            kept = request.config.stash[STATE].keep_trace(evidence)
            pytest.fail(verdict.story + (f"; trace of the last run: {kept}" if kept else ""), pytrace=False)
        return evidence

    return run


class _BenchmarkHooks:
    """Hooks that exist only when pytest-benchmark is loaded."""

    def __init__(self, state: Suite) -> None:
        self.state = state

    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, Any]
    ) -> None:
        from scaleguard.evidence import benchmark_io
        from scaleguard.machine.env import host_fingerprint

        planned = self.state.planned() if self.state.planned_yet else []
        if not planned:
            return

        spec = planned[0].spec
        host = host_fingerprint()
        threads = spec.settings.threads_per_rank
        # the backend's machines' key (on a cluster, the compute nodes': the login node ran nothing)
        key = self.state.hardware_key()
        benchmark_io.update_machine_info(
            machine_info,
            host,
            spec.device,
            spec.profile,
            threads,
            key,
        )


@pytest.hookimpl(wrapper=True)
def pytest_terminal_summary(
    terminalreporter: Any, exitstatus: int, config: pytest.Config
) -> Generator[None, None, None]:
    result = yield
    state = config.stash.get(STATE, None)
    if state is not None and state.ab is not None:
        _ab_summary(terminalreporter, state)
        line = state.append_history({"ab-A": state.ab.ledgers["A"], "ab-B": state.ab.ledgers["B"]})
        if line:
            terminalreporter.write_line(line)
        return result
    session = state.session if state else None
    if session is None or not (session.ledger.records or session.ledger.failures):
        return result
    from scaleguard.report import terminal as report

    ledger = session.ledger
    terminalreporter.section("scaleguard scaling")
    width = max(100, terminalreporter._tw.fullwidth)
    tables = report.scaling_tables(ledger, state.config.peak_tflops if state else None)
    # a CI log (not a terminal) gets each table at its natural width: nothing folded or cut
    terminalreporter.write(report.render(tables, width, fit=not terminalreporter.isatty))
    for case_id, reason in ledger.failures.items():
        if state is not None and case_id in state.infrastructure:
            terminalreporter.write_line(f"INFRASTRUCTURE {case_id}: not run, the cluster lost it: {reason}")
        else:
            terminalreporter.write_line(f"FAILED {case_id}: {reason}")
    for line in report.verdict_lines(list(ledger.verdicts.values())):
        terminalreporter.write_line(line)
    for line in report.disturbance_lines(ledger):
        terminalreporter.write_line(line)
    import time

    for line in report.time_lines(ledger, time.monotonic() - state.started if state else 0.0):
        terminalreporter.write_line(line)
    used = state.backend.usage() if state is not None else None
    if used:
        terminalreporter.write_line(used)
    if state is not None and state.config.update_baselines:
        update = ledger.update_baselines(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        for line in report.baseline_update_lines(update):
            terminalreporter.write_line(line)
    if state is not None:
        line = state.append_history({"suite": ledger})
        if line:
            terminalreporter.write_line(line)
    return result


def _ab_summary(terminalreporter: Any, state: Suite) -> None:
    """The paired A/B table and stories, and the files asked for."""
    from scaleguard.report import terminal as report

    session = state.ab
    assert session is not None
    config = state.config
    terminalreporter.section("scaleguard A/B")
    terminalreporter.write(
        report.render(
            [report.ab_table(session)],
            max(100, terminalreporter._tw.fullwidth),
            fit=not terminalreporter.isatty,
        )
    )
    for verdict in session.verdicts.values():
        if verdict.status is not Status.SAME or verdict.dropped:  # a dropped pair is always reported
            terminalreporter.write_line(verdict.story)
    try:
        _ab_files(state, session)
    except OSError as exc:
        # checked at the start; a disk that filled or a directory removed since then costs
        # the files, never the verdicts printed above
        terminalreporter.write_line(f"scaleguard: A/B files not written: {exc}")
        return
    if config.ab_save is not None:
        directory = config.ab_save
        terminalreporter.write_line(
            f"scaleguard: A/B sides saved as {directory / 'A.json'} and {directory / 'B.json'}"
        )


def _ab_files(state: Suite, session: Any) -> None:
    """The markdown, plot and saved sides asked for (the sides in pytest-benchmark format)."""
    from scaleguard.evidence import benchmark_io
    from scaleguard.machine.env import host_fingerprint
    from scaleguard.report import terminal as report

    config = state.config
    for target in (config.ab_markdown, config.ab_plot):
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
    if config.ab_markdown is not None:
        config.ab_markdown.write_text(report.ab_markdown(session), encoding="utf-8")
    if config.ab_plot is not None and session.verdicts:
        report.ab_plot(session, config.ab_plot)
    if config.ab_save is not None:
        directory = config.ab_save
        directory.mkdir(parents=True, exist_ok=True)
        spec = state.planned()[0].spec
        host = host_fingerprint()
        threads = spec.settings.threads_per_rank
        # the same machine_info as a plain session's save: the hardware key makes the two
        # sides comparable by `scaleguard compare` (a file without one is refused)
        machine_info: dict[str, Any] = {}
        key = state.hardware_key()
        benchmark_io.update_machine_info(machine_info, host, spec.device, spec.profile, threads, key)
        for label in ("A", "B"):
            benchmark_io.write_saved_run(
                directory / f"{label}.json", session.ledgers[label], machine_info, label
            )
