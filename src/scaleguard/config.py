"""Every user choice of a session, read and checked once into one frozen ``PerfConfig``.

The pytest plugin reads ``--perf-*`` options and their ini twins into it at configure time, and
``cli.py`` builds the same object from its own arguments, so a value such as
``--perf-threshold-step`` is parsed in one place (``compare.ThresholdSettings``) whichever way it
came in. Nothing here plans cases, reads a baseline or starts processes: that is ``suite.Suite``'s
wiring, which takes this object as it is.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scaleguard.case import INPUTS, MODES, PRECISIONS, SCALINGS
from scaleguard.evidence.verdict import ThresholdSettings
from scaleguard.schedule.matrix import MatrixOptions, parse_csv, parse_world_sizes
from scaleguard.schedule.slurm import SlurmOptions


class ConfigError(ValueError):
    """A value (or combination) the user gave that cannot be used; the message names it."""


# integer options: (lowest allowed, highest allowed)
_INTEGERS = {
    "steps": (1, 10**6),
    "warmup": (1, 10**6),
    "threads-per-rank": (1, 4096),
    "loader-workers": (0, 1024),
    "profile-steps": (0, 1000),
    "repeats": (1, 100),
    "confirm": (0, 100),
    "keep-runs": (1, 1000),
    "ab-pairs": (0, 1000),
}


@dataclass(frozen=True)
class PerfConfig:
    """One session's choices. ``None`` means "the default for the machine the cases run on"
    (a timeout, a confirm count and thresholds depend on the device, known only once planned)."""

    matrix: MatrixOptions = field(default_factory=MatrixOptions)
    thresholds: ThresholdSettings = field(default_factory=ThresholdSettings)
    timeout_s: float | None = None
    repeats: int = 1
    confirm: int | None = None
    keep_runs: int | None = None
    peak_tflops: float | None = None
    foreign_limit: float | None = None  # cores; None with load_check on means the default
    load_check: bool = True
    baselines: Path | None = None  # None: <rootdir>/baselines
    baseline_torch: str | None = None
    update_baselines: bool = False
    accept: tuple[str, ...] = ()
    accept_reason: str | None = None
    isolate: bool = False
    history: Path | None = None  # None: <rootdir>/.scaleguard/history.sqlite
    record_history: bool = True
    trace_dir: Path | None = None  # None: <rootdir>/.scaleguard/traces
    ab_a: str | None = None
    ab_b: str | None = None  # paired A/B is on when set
    ab_env_a: tuple[tuple[str, str], ...] = ()
    ab_env_b: tuple[tuple[str, str], ...] = ()
    ab_pairs: int | None = None
    ab_markdown: Path | None = None
    ab_plot: Path | None = None
    ab_save: Path | None = None
    slurm: SlurmOptions | None = None  # --perf-slurm: the cases run on a cluster

    @property
    def paired(self) -> bool:
        return self.ab_b is not None

    @classmethod
    def read(
        cls,
        text: Callable[[str], str | None],
        flag: Callable[[str], bool] = lambda name: False,
        lines: Callable[[str], Sequence[str]] = lambda name: (),
    ) -> PerfConfig:
        """Read and check every option. ``text(name)`` is an option's value as the user wrote
        it (``name`` without the ``--perf-`` prefix; None when unset), ``flag(name)`` an on/off
        option, ``lines(name)`` a repeatable one (``accept``, ``ab-env-a``, ``case-thresholds``).

        Raises:
            ConfigError: the first unusable value, named as the user wrote it.
        """
        try:
            return cls._read(text, flag, lines)
        except ConfigError:
            raise
        except ValueError as exc:  # the parsers of matrix and compare say what is wrong
            raise ConfigError(str(exc)) from None

    @classmethod
    def _read(
        cls,
        text: Callable[[str], str | None],
        flag: Callable[[str], bool],
        lines: Callable[[str], Sequence[str]],
    ) -> PerfConfig:
        def csv(name: str, allowed: tuple[str, ...] | None) -> tuple[str, ...] | None:
            value = text(name)
            return None if value is None else parse_csv(value, allowed, name)

        def integer(name: str) -> int | None:
            value = text(name)
            if value is None:
                return None
            lo, hi = _INTEGERS[name]
            if not value.strip().isdigit() or not lo <= int(value) <= hi:
                raise ConfigError(f"--perf-{name} takes an integer in [{lo}, {hi}], got {value!r}")
            return int(value)

        def positive(name: str, hi: float, unit: str) -> float | None:
            value = text(name)
            if value is None:
                return None
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or not 0 < number <= hi:
                raise ConfigError(f"--perf-{name} takes {unit}, got {value!r}")
            return number

        def path(name: str) -> Path | None:
            value = text(name)
            return None if value is None else Path(value)

        defaults = MatrixOptions()
        world_sizes = text("world-sizes")
        data_root = text("data-root")
        share_gpu = flag("share-gpu")
        matrix = MatrixOptions(
            device=text("device") or "auto",
            profile=text("profile") or "auto",
            world_sizes=parse_world_sizes(world_sizes) if world_sizes else None,
            modes=csv("modes", MODES) or defaults.modes,
            models=csv("models", None),
            precisions=csv("precisions", PRECISIONS),
            scalings=csv("scaling", SCALINGS) or defaults.scalings,
            inputs=csv("inputs", INPUTS) or defaults.inputs,
            steps=integer("steps"),
            warmup=integer("warmup"),
            threads_per_rank=integer("threads-per-rank"),
            data_root=data_root,
            loader_workers=integer("loader-workers"),
            profile_steps=integer("profile-steps"),
            shared_gpu=share_gpu,
            workloads=csv("workloads", None) or (),
        )
        _check_data_root(data_root)
        timeout = text("timeout")
        timeout_s = None
        if timeout is not None:
            try:
                timeout_s = float(timeout)
            except ValueError:
                raise ConfigError(f"--perf-timeout takes seconds, got {timeout!r}") from None
            if not math.isfinite(timeout_s) or timeout_s <= 0 or timeout_s > 7 * 24 * 3600:
                raise ConfigError(f"--perf-timeout must be finite, positive seconds, got {timeout!r}")
        update = flag("update-baselines")
        accept = tuple(lines("accept"))
        reason = text("accept-reason")
        if accept and not reason:
            raise ConfigError(
                "--perf-accept needs --perf-accept-reason TEXT: why these cases are recorded "
                "although not OK (stored with their runs)"
            )
        if accept and not update:
            raise ConfigError("--perf-accept only has a meaning with --perf-update-baselines")
        if update and share_gpu:
            raise ConfigError(
                "--perf-share-gpu is a test mode (ranks share GPUs): its numbers are never written "
                "into a baseline; drop --perf-update-baselines"
            )
        ab_b = text("ab-b")
        if ab_b is not None and update:
            raise ConfigError(
                "--perf-ab-b compares two installs in pairs; record baselines in a plain session"
            )
        envs = {side: _env(lines(f"ab-env-{side}"), f"--perf-ab-env-{side}") for side in ("a", "b")}
        # outputs written at the end of a session are checked now: an unusable path found after
        # an hour of measuring would lose the hour
        for name, suffixes in (("ab-markdown", ()), ("ab-plot", (".png", ".svg", ".pdf"))):
            check_output_path(path(name), f"--perf-{name}", suffixes)
        check_output_path(path("ab-save"), "--perf-ab-save", directory=True)
        if not flag("no-history"):
            check_output_path(path("history"), "--perf-history")
        return cls(
            matrix=matrix,
            thresholds=ThresholdSettings.parse(
                {name: text("threshold-" + name) for name in ThresholdSettings.NAMES},
                lines("case-thresholds"),
            ),
            timeout_s=timeout_s,
            repeats=integer("repeats") or 1,
            confirm=integer("confirm"),
            keep_runs=integer("keep-runs"),
            peak_tflops=positive("peak-tflops", 1e6, "TFLOPS (e.g. 989)"),
            foreign_limit=positive("foreign-load-limit", 1024, "cores (e.g. 0.25)"),
            load_check=not flag("no-load-check"),
            baselines=path("baselines"),
            baseline_torch=text("baseline-torch"),
            update_baselines=update,
            accept=accept,
            accept_reason=reason,
            isolate=flag("isolate"),
            history=path("history"),
            record_history=not flag("no-history"),
            trace_dir=path("trace-dir"),
            ab_a=text("ab-a"),
            ab_b=ab_b,
            ab_env_a=envs["a"],
            ab_env_b=envs["b"],
            ab_pairs=integer("ab-pairs") or None,
            ab_markdown=path("ab-markdown"),
            ab_plot=path("ab-plot"),
            ab_save=path("ab-save"),
            slurm=_slurm(text, flag, matrix) if flag("slurm") else None,
        )


def check_output_path(
    path: Path | None, option: str, suffixes: tuple[str, ...] = (), directory: bool = False
) -> None:
    """An output the session or a command will write: refused now, by name, when it cannot be
    (a directory where a file goes, a file where a directory goes, a link, no write access).

    Raises:
        ConfigError: the sentence names the option, the path and the fix.
    """
    if path is None:
        return
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path}: the file name must end in {', '.join(suffixes)}")
    if path.is_symlink():
        raise ConfigError(f"{option} {path} is a symbolic link; give the real path")
    if directory:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{option} {path} is a file; give a directory")
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {path}: the directory is not writable")
    else:
        if path.is_dir():
            raise ConfigError(f"{option} {path} is a directory; give a file name")
        if path.exists() and not os.access(path, os.W_OK):
            raise ConfigError(f"{option} {path} is not writable")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        if not path.exists():
            raise ConfigError(f"{option} {path}: cannot create it in {parent}")


def _slurm(
    text: Callable[[str], str | None], flag: Callable[[str], bool], matrix: MatrixOptions
) -> SlurmOptions:
    """``--perf-slurm-*``, checked now: a typo found after an hour in the queue would lose it."""
    import shlex

    from scaleguard.schedule.slurm import missing_commands

    missing = missing_commands()
    if missing:
        raise ConfigError(
            f"--perf-slurm: Slurm's {', '.join(missing)} not found on PATH; run pytest on a node "
            "with Slurm's client commands (a login node)"
        )

    def count(name: str, default: int, hi: int) -> int:
        value = text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"--perf-{name} takes a whole number, got {value!r}") from None
        if not 1 <= number <= hi:
            raise ConfigError(f"--perf-{name} must be 1..{hi}, got {number}")
        return number

    nodes_text = text("slurm-nodes") or "1,2"
    try:
        nodes = tuple(sorted({int(n) for n in nodes_text.split(",") if n.strip()}))
    except ValueError:
        raise ConfigError(
            f"--perf-slurm-nodes takes a comma list of node counts, got {nodes_text!r}"
        ) from None
    if not nodes or nodes[0] < 1 or nodes[-1] > 4096:
        raise ConfigError(f"--perf-slurm-nodes: node counts are 1..4096, got {nodes_text!r}")
    if matrix.device == "cuda" and text("slurm-ranks-per-node") is None:
        raise ConfigError("--perf-slurm on cuda needs --perf-slurm-ranks-per-node N (the GPUs per node)")
    if matrix.shared_gpu:
        raise ConfigError("--perf-share-gpu is a one-machine test mode; drop it with --perf-slurm")
    pending = text("slurm-pending-timeout")
    try:
        pending_s = float(pending) if pending is not None else 600.0
    except ValueError:
        raise ConfigError(f"--perf-slurm-pending-timeout takes seconds, got {pending!r}") from None
    if not math.isfinite(pending_s) or not 0 < pending_s <= 7 * 24 * 3600:
        raise ConfigError(f"--perf-slurm-pending-timeout must be positive seconds, got {pending!r}")
    try:
        extra = tuple(shlex.split(text("slurm-args") or ""))
    except ValueError as exc:
        raise ConfigError(f"--perf-slurm-args is not a shell-quoted string ({exc})") from None
    shared = text("slurm-dir")
    # every node writes its rank files there: a file, a link or no write access is said now
    check_output_path(Path(shared) if shared else None, "--perf-slurm-dir", directory=True)
    return SlurmOptions(
        nodes=nodes,
        ranks_per_node=count("slurm-ranks-per-node", 1, 1024),
        partition=text("slurm-partition"),
        account=text("slurm-account"),
        time_min=count("slurm-time", 120, 7 * 24 * 60),
        extra_args=extra,
        shared_dir=Path(shared) if shared else None,
        pending_timeout_s=pending_s,
        skip_pending=flag("slurm-skip-pending"),
    )


def _env(items: Sequence[str], option: str) -> tuple[tuple[str, str], ...]:
    if not items:
        return ()
    from scaleguard.schedule.ab import ABInputError, parse_env  # numpy/scipy: only when A/B is asked

    try:
        return tuple(parse_env(items, option))
    except ABInputError as exc:
        raise ConfigError(str(exc)) from None


def _check_data_root(root: str | None) -> None:
    """A missing CIFAR-10 would fail every loader case after its ranks start: say it now."""
    if root is None:
        return
    path = Path(root)
    if not (path / "cifar-10-batches-py").is_dir():
        raise ConfigError(
            f"--perf-data-root {root}: no CIFAR-10 there "
            f"(expected {path / 'cifar-10-batches-py'}, "
            "as torchvision.datasets.CIFAR10 unpacks it). scaleguard never downloads; leave the "
            "option out to use FakeData."
        )
