"""``scaleguard bisect PY_GOOD PY_2 ... PY_BAD -- perf/ -k CASE``: the first bad torch build.

Given interpreters ordered oldest-good first and newest-bad last (one virtual environment per
build), binary search with the paired A/B of ``scaleguard.schedule.ab`` at each probe, always against the
good end: a probe whose selected cases read REGRESSED is bad, one that reads SAME or IMPROVED is
good. An INCONCLUSIVE probe is said and the search stops there, with the range still open: a
build is never guessed. The bad end is probed first, so a regression that does not reproduce is
"not found" before any build in between is spent. As TorchBench's ``bisection.py`` and
``asv find`` do, only ``log2(n)`` builds are measured.

``--wheels DIR`` instead of interpreters: the torch wheels of a local directory, ordered by
version (nightlies are ``devYYYYMMDD``), each installed when the search first needs it into a
throwaway virtual environment (nothing downloaded; only the ``log2(n)`` probed builds and the
good end are installed).

Every probe has a deadline (``--probe-timeout``, default 2 h): a probe that has not answered
by then is interrupted as Ctrl-C would (its ranks reaped), killed after a grace period, and
said as FAILED, which stops the search with the range still open.

Exit 0: found; 1: not found or undecidable; 2: bad input.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scaleguard.evidence.verdict import Status
from scaleguard.machine import processes
from scaleguard.schedule import ab

PROBE_TIMEOUT_S = 7200.0  # one probe: an A/B session over the selected cases, pairs capped
INTERRUPT_GRACE_S = 60.0  # after the SIGINT, for pytest to reap its ranks and write what it has


@dataclass(frozen=True)
class Probe:
    index: int
    status: str  # REGRESSED / IMPROVED / SAME / INCONCLUSIVE / FAILED / USAGE (pytest exit 4)
    stories: tuple[str, ...]


def probe_build(
    good: str,
    build: str,
    pytest_args: list[str],
    index: int,
    work: Path,
    progress: Callable[[str], None] = lambda line: None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> Probe:
    """One paired A/B session of ``build`` against ``good`` over the selected cases; its
    ``scaleguard:`` progress lines are passed on as they come (a probe takes minutes). Past
    ``timeout_s`` the session is interrupted (SIGINT, as Ctrl-C: pytest reaps its ranks), then
    its process group killed after ``INTERRUPT_GRACE_S``; the probe is FAILED."""
    storage = work / f"probe{index}"
    command = [sys.executable, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider", "-q",
               "--perf-ab-a", good, "--perf-ab-b", build, "--perf-no-history",
               f"--benchmark-save=probe{index}", f"--benchmark-storage=file://{storage}"]  # fmt: skip
    lines: list[str] = []
    expired = threading.Event()
    # its own session: the deadline can reach every process it starts that did not leave it
    # (ranks make their own groups and die with their parent: PR_SET_PDEATHSIG)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as child:

        def stop() -> None:
            expired.set()
            _interrupt(child)

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        try:
            assert child.stdout is not None
            for line in child.stdout:
                lines.append(line)
                if line.startswith("scaleguard: ") and "pair" in line:
                    progress(line.rstrip())
        finally:
            timer.cancel()
            if child.poll() is None and not expired.is_set():
                # bisect itself was interrupted: its own session kept the terminal's Ctrl-C
                # from the probe, which is handed on
                _interrupt(child)
    if expired.is_set():
        return Probe(
            index,
            "FAILED",
            (
                f"no answer within {timeout_s:g} s (--probe-timeout): the probe was interrupted "
                "and its processes stopped",
            ),
        )
    done = subprocess.CompletedProcess(command, child.returncode, "".join(lines), "")
    saved = sorted(storage.glob(f"*/*_probe{index}.json"))
    if done.returncode == 4:  # pytest's usage error: the probes' arguments, not the build
        tail = done.stdout.strip().splitlines()[-3:]
        return Probe(index, "USAGE", ("pytest refused the probe's arguments: " + " | ".join(tail),))
    if done.returncode not in (0, 1) or not saved:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return Probe(index, "FAILED", (f"pytest exited {done.returncode}: " + " | ".join(tail),))
    infos = [b.get("extra_info", {}) for b in json.loads(saved[-1].read_text()).get("benchmarks", [])]
    statuses = [str(i.get("ab_verdict")) for i in infos if i.get("ab_verdict")]
    stories = tuple(str(i.get("ab_story")) for i in infos if i.get("ab_story"))
    if not statuses:
        return Probe(index, "FAILED", ("no case was measured: check the selection (-k)",))
    # a build is bad when any case regressed, good when every case is the same or better
    if Status.REGRESSED in statuses:
        status = Status.REGRESSED.value
    elif Status.INCONCLUSIVE in statuses:
        status = Status.INCONCLUSIVE.value
    elif all(s in (Status.SAME, Status.IMPROVED) for s in statuses):
        status = Status.SAME.value
    else:
        status = "FAILED"
    return Probe(index, status, stories)


def _interrupt(child: subprocess.Popen[str]) -> None:
    """SIGINT to the probe's group (pytest reaps its ranks), SIGKILL after the grace period."""
    processes.stop_group(child, ((signal.SIGINT, INTERRUPT_GRACE_S),))


class BisectInputError(ValueError):
    """Builds that cannot be bisected (named): exit 2."""


@dataclass(frozen=True)
class Build:
    """One build as the user named it: an interpreter, or a wheel to install."""

    given: str  # printed as given (`first bad: <given>`)
    wheel: Path | None = None
    version: str | None = None  # from the wheel's file name


def wheel_builds(directory: Path) -> list[Build]:
    """The torch wheels of ``directory``, oldest first by version (``2.15.0.dev20261101`` <
    ``2.15.0.dev20261102`` < ``2.15.0``), as nightly builds are named.

    Raises:
        BisectInputError: no directory, fewer than two torch wheels for this interpreter, a
            wheel name that does not parse, or two wheels of one version.
    """
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    if not directory.is_dir():
        raise BisectInputError(f"--wheels {directory} is not a directory")
    supported = set(sys_tags())
    found: dict[object, Build] = {}
    skipped = []
    for path in sorted(directory.glob("*.whl")):
        try:
            name, version, _, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename as exc:
            raise BisectInputError(f"--wheels {directory}: {path.name} is not a wheel name: {exc}") from None
        if name != "torch":
            continue
        if not path.is_file():  # a FIFO or a link to /dev/zero would hang pip's reader
            raise BisectInputError(f"--wheels {directory}: {path.name} is not a regular file")
        if not tags & supported:
            skipped.append(path.name)
            continue
        if version in found:
            raise BisectInputError(
                f"--wheels {directory}: {found[version].given} and {path} are both torch {version}"
            )
        found[version] = Build(str(path), path, str(version))
    builds = [found[v] for v in sorted(found)]  # type: ignore[type-var]
    if len(builds) < 2:
        also = f" ({', '.join(skipped)}: not for this Python/platform)" if skipped else ""
        raise BisectInputError(
            f"--wheels {directory}: {len(builds)} torch wheel(s) for this interpreter{also}; "
            "a bisection needs the good and the bad build at least"
        )
    return builds


class Interpreters:
    """Each build's interpreter, made when the search first needs it: a wheel is installed
    into a throwaway virtual environment under ``work`` (nothing downloaded) that sees this
    environment's packages (scaleguard, pytest, numpy, CUDA libraries) behind its own torch."""

    def __init__(self, builds: list[Build], work: Path, say: Callable[[str], None]) -> None:
        self.builds = builds
        self.work = work
        self.say = say
        self._sides: dict[int, ab.Side] = {}

    def side(self, index: int) -> ab.Side:
        if index not in self._sides:
            build = self.builds[index]
            python = build.given if build.wheel is None else self._install(index, build.wheel)
            try:
                side = ab.probe(f"build {index}", python)
            except ab.ABInputError as exc:
                raise BisectInputError(str(exc)) from None
            self._sides[index] = side
            self.say(f"build {index}: {build.given} -> {side.interpreter.python} ({describe(side)})")
        return self._sides[index]

    def _install(self, index: int, wheel: Path) -> str:
        import site
        import time

        venv = self.work / f"venv{index}"
        started = time.monotonic()
        python = str(venv / "bin" / "python")
        pip = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed",
               "--disable-pip-version-check", str(wheel)]  # fmt: skip
        steps = [[sys.executable, "-m", "venv", "--without-pip", str(venv)], pip]
        # no pip configuration: a config file or PIP_CONSTRAINT pinning torch (as CI machines
        # have) must not veto the very build under test
        environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        environ["PIP_CONFIG_FILE"] = os.devnull
        for number, command in enumerate(steps):
            if number == 1:
                # this environment's packages, after the venv's own (its torch wins); addsitedir
                # also reads their .pth files, so an editable scaleguard is found too
                parents = [*site.getsitepackages(), site.getusersitepackages()]
                lines = [f"import site; site.addsitedir({p!r})" for p in parents if Path(p).is_dir()]
                (purelib(venv) / "_scaleguard_parent.pth").write_text("\n".join(lines) + "\n")
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=environ)
            except (OSError, subprocess.SubprocessError) as exc:
                raise BisectInputError(f"build {index}: {wheel}: could not be installed: {exc}") from None
            if done.returncode != 0:
                tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
                raise BisectInputError(f"build {index}: {wheel}: could not be installed: {tail}")
        self.say(f"build {index}: {wheel.name} installed into {venv} in {time.monotonic() - started:.0f} s")
        return python


def purelib(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python*/site-packages"))
    if not found:
        raise BisectInputError(f"{venv}: no site-packages after `python -m venv`")
    return found[0]


def main(
    builds: list[str] | list[Build],
    pytest_args: list[str],
    out: Callable[[str], None] = print,
    probe_timeout_s: float = PROBE_TIMEOUT_S,
) -> int:
    """Binary search over ``builds`` (interpreters or wheels, good first, bad last)."""
    say = out
    chosen = [b if isinstance(b, Build) else Build(b) for b in builds]
    if len(chosen) < 2:
        say("scaleguard bisect: give at least the good and the bad interpreter, oldest first")
        return 2
    # SIGTERM (a CI job cancelled, `kill`) ends bisect as Ctrl-C does: the probe in flight is
    # interrupted and reaped, the temporary directory removed
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        with tempfile.TemporaryDirectory(prefix="scaleguard-bisect-") as tmp:
            work = Path(tmp)
            interpreters = Interpreters(chosen, work, say)
            try:
                if all(b.wheel is None for b in chosen):
                    for i in range(len(chosen)):  # interpreters cost nothing: every one checked now
                        interpreters.side(i)
                    _check_distinct(chosen, interpreters)
                return _search(chosen, interpreters, pytest_args, work, say, probe_timeout_s)
            except BisectInputError as exc:
                say(f"scaleguard bisect: {exc}")
                return 2
    except Terminated:
        say("scaleguard bisect: terminated (SIGTERM); the probe in flight was stopped, nothing left behind")
        return 128 + signal.SIGTERM
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(BaseException):
    """SIGTERM, raised where bisect is so that every ``finally`` runs (probe reaped, temp removed)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _check_distinct(builds: list[Build], interpreters: Interpreters) -> None:
    """The same interpreter twice would probe a build against itself: a search with no answer."""
    seen: dict[str, int] = {}
    for index in range(len(builds)):
        python = interpreters.side(index).interpreter.python
        if python in seen:
            raise BisectInputError(
                f"builds {seen[python]} and {index} are the same interpreter ({python}): "
                "give each build once, "
                "good first and bad last"
            )
        seen[python] = index


def _search(
    builds: list[Build],
    interpreters: Interpreters,
    pytest_args: list[str],
    work: Path,
    say: Callable[[str], None],
    probe_timeout_s: float = PROBE_TIMEOUT_S,
) -> int:
    lo, hi = 0, len(builds) - 1
    good = interpreters.side(0).interpreter.python

    def measure(index: int) -> Probe:
        python = interpreters.side(index).interpreter.python
        result = probe_build(
            good, python, pytest_args, index, work, lambda line: say(f"  {line}"), probe_timeout_s
        )
        say(f"probe build {index} ({builds[index].given}) against build 0: {result.status}")
        for story in result.stories:
            say(f"  {story}")
        return result

    last = measure(hi)
    if last.status == "USAGE":
        say("scaleguard bisect: the probes' pytest arguments (after --) are wrong; fix them and run again")
        return 2
    if last.status != "REGRESSED":
        say(f"not found: the bad end ({builds[hi].given}) reads {last.status} against the good end")
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = measure(mid)
        if result.status == "USAGE":
            return 2
        if result.status == "REGRESSED":
            hi = mid
        elif result.status == "SAME":
            lo = mid
        else:
            say(
                f"undecidable: build {mid} ({builds[mid].given}) reads {result.status}; the first bad build "
                f"is among builds {lo + 1}..{hi} ({builds[lo + 1].given} .. {builds[hi].given}): not guessed"
            )
            return 1
    say(
        f"first bad: {builds[hi].given} ({describe(interpreters.side(hi))}); "
        f"last good: {builds[lo].given} ({describe(interpreters.side(lo))})"
    )
    return 0


def describe(side: ab.Side) -> str:
    return f"torch {side.versions.get('torch')}, git {side.versions.get('git') or '?'}"
