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
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scaleguard.case import FAULT_ENV, INPUTS, MODES, PRECISIONS, SCALINGS, fault_fields
from scaleguard.evidence.verdict import ThresholdSettings
from scaleguard.history.target import HISTORY_ENV, HistoryTarget, TargetError, target_of
from scaleguard.history.target import mask_secret as mask_secret
from scaleguard.schedule.matrix import MatrixOptions, parse_csv, parse_world_sizes
from scaleguard.schedule.slurm import SlurmOptions


class ConfigError(ValueError):
    """A value (or combination) the user gave that cannot be used; the message names it."""


# integer options: (lowest allowed, highest allowed)
INTEGER_BOUNDS = {
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
    history: HistoryTarget | None = None  # None: <rootdir>/.scaleguard/history.sqlite
    project: str | None = None  # recorded with every run; None: the repository's name
    record_history: bool = True
    trace_dir: Path | None = None  # None: <rootdir>/.scaleguard/traces
    ab_a: str | None = None
    ab_b: str | None = None  # paired A/B is on when set
    ab_env_a: tuple[tuple[str, str], ...] = ()
    ab_env_b: tuple[tuple[str, str], ...] = ()
    ab_srun_a: tuple[str, ...] = ()  # --perf-ab-srun-args-a: side A's steps only (a container)
    ab_srun_b: tuple[str, ...] = ()
    ab_pairs: int | None = None
    ab_markdown: Path | None = None
    ab_plot: Path | None = None
    ab_save: Path | None = None
    slurm: SlurmOptions | None = None  # --perf-slurm: the cases run on a cluster
    fail_below_projection: bool = False  # BELOW-PROJECTION fails the case instead of warning
    # (where, fault) of every fault injected into the ranks (--perf-inject-faults): a test mode
    inject_faults: tuple[tuple[str, str], ...] = ()

    @property
    def session_fault(self) -> str:
        """The fault of the session's own environment ('' for none); an A/B side's is its own."""
        return next((fault for where, fault in self.inject_faults if where == _ENVIRONMENT), "")

    @property
    def paired(self) -> bool:
        return self.ab_b is not None

    @classmethod
    def read(
        cls,
        text: Callable[[str], str | None],
        flag: Callable[[str], bool] = lambda name: False,
        lines: Callable[[str], Sequence[str]] = lambda name: (),
        environ: Mapping[str, str] | None = None,
    ) -> PerfConfig:
        """Read and check every option. ``text(name)`` is an option's value as the user wrote
        it (``name`` without the ``--perf-`` prefix; None when unset), ``flag(name)`` an on/off
        option, ``lines(name)`` a repeatable one (``accept``, ``ab-env-a``, ``case-thresholds``).
        ``environ``: the environment the ranks will inherit, given where ranks run (the suite):
        a fault-injection variable in it is refused unless ``--perf-inject-faults`` allows it.

        Raises:
            ConfigError: the first unusable value, named as the user wrote it.
        """
        try:
            return cls._read(text, flag, lines, environ)
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
        environ: Mapping[str, str] | None = None,
    ) -> PerfConfig:
        o = _Values(text, flag, lines)
        _check_choices(text)
        matrix = _matrix(o)
        update = flag("update-baselines")
        accept = tuple(lines("accept"))
        _check_combinations(o, matrix, update, accept)
        if not flag("slurm"):
            _values_only(o, matrix)
        envs = {side: _env(lines(f"ab-env-{side}"), f"--perf-ab-env-{side}") for side in ("a", "b")}
        return cls(
            matrix=matrix,
            thresholds=ThresholdSettings.parse(
                {name: text("threshold-" + name) for name in ThresholdSettings.NAMES},
                lines("case-thresholds"),
            ),
            timeout_s=o.seconds("timeout", None, "--perf-timeout must be finite, positive seconds"),
            repeats=o.integer("repeats") or 1,
            confirm=o.integer("confirm"),
            keep_runs=o.integer("keep-runs"),
            peak_tflops=o.positive("peak-tflops", 1e6, "TFLOPS (e.g. 989)"),
            foreign_limit=o.positive("foreign-load-limit", 1024, "cores (e.g. 0.25)"),
            load_check=not flag("no-load-check"),
            baselines=o.path("baselines"),
            baseline_torch=text("baseline-torch"),
            update_baselines=update,
            accept=accept,
            accept_reason=text("accept-reason"),
            isolate=flag("isolate"),
            history=_history_target(o),
            project=o.text("project"),
            record_history=not flag("no-history"),
            trace_dir=o.path("trace-dir"),
            ab_a=text("ab-a"),
            ab_b=text("ab-b"),
            ab_env_a=envs["a"],
            ab_env_b=envs["b"],
            ab_srun_a=_split(text("ab-srun-args-a"), "--perf-ab-srun-args-a"),
            ab_srun_b=_split(text("ab-srun-args-b"), "--perf-ab-srun-args-b"),
            ab_pairs=o.integer("ab-pairs") or None,
            ab_markdown=o.path("ab-markdown"),
            ab_plot=o.path("ab-plot"),
            ab_save=o.path("ab-save"),
            slurm=_slurm(o, matrix) if flag("slurm") else None,
            fail_below_projection=flag("fail-below-projection"),
            inject_faults=_injected_faults(flag("inject-faults"), environ, envs),
        )


@dataclass(frozen=True)
class _Values:
    """The user's option values by name (without ``--perf-``), and the one parser per kind of
    value: every error names the option as the user wrote it."""

    text: Callable[[str], str | None]
    flag: Callable[[str], bool]
    lines: Callable[[str], Sequence[str]]

    def csv(self, name: str, allowed: tuple[str, ...] | None) -> tuple[str, ...] | None:
        value = self.text(name)
        return None if value is None else parse_csv(value, allowed, name)

    def integer(
        self, name: str, default: int | None = None, bounds: tuple[int, int] | None = None
    ) -> int | None:
        """An integer in ``bounds`` (default: the option's row in ``INTEGER_BOUNDS``)."""
        value = self.text(name)
        if value is None:
            return default
        lo, hi = bounds or INTEGER_BOUNDS[name]
        try:
            number = _digits(value)
        except ValueError:
            number = None
        if number is None or not lo <= number <= hi:
            raise ConfigError(f"--perf-{name} takes an integer in [{lo}, {hi}], got {value[:40]!r}")
        return number

    def count(self, name: str, default: int, bounds: tuple[int, int]) -> int:
        """``integer`` with a default: never None."""
        value = self.integer(name, default, bounds)
        assert value is not None
        return value

    def positive(self, name: str, hi: float, unit: str) -> float | None:
        return self._number(name, None, hi, f"--perf-{name} takes {unit}", f"--perf-{name} takes {unit}")

    def seconds(self, name: str, default: float | None, problem: str) -> float | None:
        """Positive seconds, at most a week; ``problem``: the message's start."""
        return self._number(name, default, 7 * 24 * 3600, f"--perf-{name} takes seconds", problem)

    def _number(
        self, name: str, default: float | None, hi: float, not_number: str, out_of_range: str
    ) -> float | None:
        """A finite number in (0, hi]; the two messages say which way the value is wrong."""
        value = self.text(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{not_number}, got {value!r}") from None
        if not math.isfinite(number) or not 0 < number <= hi:
            raise ConfigError(f"{out_of_range}, got {value!r}")
        return number

    def path(self, name: str) -> Path | None:
        value = self.text(name)
        return None if value is None else Path(value)


def _matrix(o: _Values) -> MatrixOptions:
    defaults = MatrixOptions()
    world_sizes = o.text("world-sizes")
    data_root = o.text("data-root")
    _check_data_root(data_root)
    return MatrixOptions(
        device=o.text("device") or "auto",
        profile=o.text("profile") or "auto",
        # '' is an empty list, refused as --perf-modes='' is, never the default
        world_sizes=parse_world_sizes(world_sizes) if world_sizes is not None else None,
        modes=o.csv("modes", MODES) or defaults.modes,
        models=o.csv("models", None),
        precisions=o.csv("precisions", PRECISIONS),
        scalings=o.csv("scaling", SCALINGS) or defaults.scalings,
        inputs=o.csv("inputs", INPUTS) or defaults.inputs,
        steps=o.integer("steps"),
        warmup=o.integer("warmup"),
        threads_per_rank=o.integer("threads-per-rank"),
        data_root=data_root,
        loader_workers=o.integer("loader-workers"),
        profile_steps=o.integer("profile-steps"),
        shared_gpu=o.flag("share-gpu"),
        workloads=o.csv("workloads", None) or (),
    )


def _check_combinations(o: _Values, matrix: MatrixOptions, update: bool, accept: tuple[str, ...]) -> None:
    """Options that cannot go together, and outputs written at the end of a session, checked
    now: an unusable path found after an hour of measuring would lose the hour."""
    if accept and not o.text("accept-reason"):
        raise ConfigError(
            "--perf-accept needs --perf-accept-reason TEXT: why these cases are recorded "
            "although not OK (stored with their runs)"
        )
    if accept and not update:
        raise ConfigError("--perf-accept only has a meaning with --perf-update-baselines")
    if update and matrix.shared_gpu:
        raise ConfigError(
            "--perf-share-gpu is a test mode (ranks share GPUs): its numbers are never written "
            "into a baseline; drop --perf-update-baselines"
        )
    for side in ("a", "b"):
        if o.text(f"ab-srun-args-{side}") is not None and (o.text("ab-b") is None or not o.flag("slurm")):
            raise ConfigError(
                f"--perf-ab-srun-args-{side} gives one side's Slurm steps their own arguments: it needs "
                "--perf-slurm and a paired A/B (--perf-ab-b)"
            )
    if o.text("ab-b") is not None and update:
        raise ConfigError("--perf-ab-b compares two installs in pairs; record baselines in a plain session")
    for name, suffixes in (("ab-markdown", ()), ("ab-plot", (".png", ".svg", ".pdf"))):
        check_output_path(o.path(name), f"--perf-{name}", suffixes)
    check_output_path(o.path("ab-save"), "--perf-ab-save", directory=True)
    target = None if o.flag("no-history") else _history_target(o)
    if isinstance(target, Path):  # a server is reached when the session appends (or spooled)
        check_output_path(target, "--perf-history")


_ENVIRONMENT = "the environment"  # where a session's own fault was set (PerfConfig.inject_faults)


def _injected_faults(
    allowed: bool, environ: Mapping[str, str] | None, envs: dict[str, tuple[tuple[str, str], ...]]
) -> tuple[tuple[str, str], ...]:
    """(where, fault) of every fault the ranks would inject: the session's environment and each
    A/B side's own. A stray variable left in a shell used to be honoured silently in every run:
    refused now unless ``--perf-inject-faults``; each value is parsed now, not in the ranks."""
    if environ is None:
        return ()
    given = [(_ENVIRONMENT, environ.get(FAULT_ENV, "").strip())]
    given += [
        (f"--perf-ab-env-{side}", v.strip())
        for side, pairs in envs.items()
        for k, v in pairs
        if k == FAULT_ENV
    ]
    given = [(where, fault) for where, fault in given if fault]
    if not given:
        return ()
    where, fault = given[0]
    if not allowed:
        raise ConfigError(
            f"{FAULT_ENV}={fault[:60]!r} is set ({where}): every run would carry a deliberate fault. "
            "Unset it, or pass --perf-inject-faults for a test of the harness"
        )
    for where, fault in given:
        try:
            fault_fields(fault)  # the grammar alone, torch-free: configure stays light
        except ValueError as exc:
            raise ConfigError(f"{FAULT_ENV}={fault[:60]!r} ({where}) is no fault: {exc}") from None
    return tuple(given)


def _history_target(o: _Values) -> HistoryTarget | None:
    """``--perf-history`` (or, unset, ``SCALEGUARD_HISTORY``, where CI keeps a server's DSN as a
    secret): a file, or a PostgreSQL server (``postgresql://...``). Another server's URL is
    refused by name, its password masked: SQLite made a file named after one once."""
    text = o.text("history")
    option = "--perf-history"
    if text is None and os.environ.get(HISTORY_ENV, "").strip():
        text, option = os.environ[HISTORY_ENV].strip(), HISTORY_ENV
    if text is None:
        return None
    try:
        return target_of(text, option)
    except TargetError as exc:
        raise ConfigError(str(exc)) from None


def _check_choices(text: Callable[[str], str | None]) -> None:
    """An option with choices takes one of them, from the command line (argparse checks) and
    from its ini twin alike (which nothing checked: ``perf_profile = huge`` was an INTERNALERROR,
    ``perf_device = gpu`` planned the wrong matrix)."""
    from scaleguard.options import OPTIONS

    for option in OPTIONS:
        if option.choices is None:
            continue
        value = text(option.name)
        if value is not None and value not in option.choices:
            raise ConfigError(
                f"--perf-{option.name} (ini: {option.dest}) takes one of {', '.join(option.choices)}, "
                f"got {value[:60]!r}"
            )


def _digits(text: str) -> int:
    """A count as people write it: ASCII digits only. ``int`` also takes ``1_0`` (10) and
    ``isdigit`` passes ``²``, which ``int`` then refuses with a message naming no option."""
    if not re.fullmatch(r"[0-9]{1,12}", text.strip()):
        raise ValueError(text)
    return int(text.strip())


def _split(text: str | None, option: str) -> tuple[str, ...]:
    """One shell-quoted string of arguments, as a shell would split it."""
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as exc:  # an unclosed quote
        raise ConfigError(f"{option} {text!r}: {exc}") from None


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
    try:
        _check_output_path(path, option, suffixes, directory)
    except OSError as exc:  # a name longer than the file system allows, a loop of links
        raise ConfigError(f"{option} {str(path)[:120]}: cannot be used ({exc.strerror or exc})") from None


def _check_output_path(path: Path, option: str, suffixes: tuple[str, ...], directory: bool) -> None:
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


def _slurm(o: _Values, matrix: MatrixOptions, cluster: bool = True) -> SlurmOptions:
    """``--perf-slurm-*``, checked now: a typo found after an hour in the queue would lose it.
    ``cluster`` False: only the values (an ini file's cluster settings on a laptop session,
    where no Slurm is asked, are still read by the same rules, not skipped)."""
    from scaleguard.schedule.slurm import missing_commands

    missing = missing_commands() if cluster else []
    if missing:
        raise ConfigError(
            f"--perf-slurm: Slurm's {', '.join(missing)} not found on PATH; run pytest on a node "
            "with Slurm's client commands (a login node)"
        )

    text = o.text
    nodes_text = text("slurm-nodes") or "1,2"
    try:
        nodes = tuple(sorted({_digits(n) for n in nodes_text.split(",") if n.strip()}))
    except ValueError:
        raise ConfigError(
            f"--perf-slurm-nodes takes a comma list of node counts, got {nodes_text!r}"
        ) from None
    if not nodes or nodes[0] < 1 or nodes[-1] > 4096:
        raise ConfigError(f"--perf-slurm-nodes: node counts are 1..4096, got {nodes_text!r}")
    if cluster and matrix.device == "cuda" and text("slurm-ranks-per-node") is None:
        raise ConfigError("--perf-slurm on cuda needs --perf-slurm-ranks-per-node N (the GPUs per node)")
    if cluster and matrix.shared_gpu:
        raise ConfigError("--perf-share-gpu is a one-machine test mode; drop it with --perf-slurm")
    pending_s = o.seconds(
        "slurm-pending-timeout", 600.0, "--perf-slurm-pending-timeout must be positive seconds"
    )
    try:
        extra = tuple(shlex.split(text("slurm-args") or ""))
    except ValueError as exc:
        raise ConfigError(f"--perf-slurm-args is not a shell-quoted string ({exc})") from None
    shared = text("slurm-dir")
    # every node writes its rank files there: a file, a link or no write access is said now
    check_output_path(Path(shared) if shared else None, "--perf-slurm-dir", directory=True)
    rpn = o.count("slurm-ranks-per-node", 1, (1, 1024))
    gpu_type, gpus = _gpus_per_node(text("slurm-gpus-per-node"), matrix.device, rpn)
    bind = text("slurm-gpu-bind") or "node"
    if bind not in ("node", "task"):
        raise ConfigError(f"--perf-slurm-gpu-bind is node or task, got {bind!r}")
    if bind == "task" and gpus not in (None, rpn):
        raise ConfigError(
            f"--perf-slurm-gpu-bind task gives each of the {rpn} ranks per node one GPU; "
            f"--perf-slurm-gpus-per-node {gpus} does not match"
        )
    mem = text("slurm-mem") or "0"
    if not re.fullmatch(r"\d{1,9}[KMGT]?", mem):
        raise ConfigError(f"--perf-slurm-mem takes a size as Slurm writes it (0, 64G, 512000M), got {mem!r}")
    try:
        srun_args = tuple(shlex.split(text("slurm-srun-args") or ""))
    except ValueError as exc:
        raise ConfigError(f"--perf-slurm-srun-args is not a shell-quoted string ({exc})") from None
    iface = text("slurm-iface")
    if iface is not None and not re.fullmatch(r"[A-Za-z0-9_.:^=,-]{1,64}", iface):
        raise ConfigError(f"--perf-slurm-iface takes an interface name (eth0, ib0, ^docker), got {iface!r}")
    python = text("slurm-python")
    if python is not None and (not python.strip() or "\x00" in python):
        raise ConfigError("--perf-slurm-python is empty")
    return SlurmOptions(
        nodes=nodes,
        ranks_per_node=rpn,
        gpus_per_node=gpus,
        gpu_type=gpu_type,
        gpu_bind=bind,
        cpus_per_task=o.integer("slurm-cpus-per-task", None, (1, 4096)),
        mem=mem,
        exclusive=not o.flag("slurm-no-exclusive"),
        srun_args=srun_args,
        python=python,
        export=_env(o.lines("slurm-export"), "--perf-slurm-export"),
        iface=iface,
        retries=o.count("slurm-retries", 1, (0, 10)),
        partition=text("slurm-partition"),
        account=text("slurm-account"),
        time_min=o.count("slurm-time", 120, (1, 7 * 24 * 60)),
        extra_args=extra,
        shared_dir=Path(shared) if shared else None,
        pending_timeout_s=pending_s or 600.0,
        skip_pending=o.flag("slurm-skip-pending"),
    )


def _values_only(o: _Values, matrix: MatrixOptions) -> None:
    """Without ``--perf-slurm`` its options act on nothing, but a bad value is still said."""
    from scaleguard.options import OPTIONS

    if any(opt.name.startswith("slurm-") and o.text(opt.name) is not None for opt in OPTIONS):
        _slurm(o, matrix, cluster=False)


def _gpus_per_node(value: str | None, device: str, rpn: int) -> tuple[str | None, int | None]:
    """``--perf-slurm-gpus-per-node``: (GRES type or None, count); count None means "the ranks
    per node on cuda, none on cpu" (decided once the device is known)."""
    if value is None:
        return None, None
    gpu_type, _, count = value.rpartition(":")
    bad_type = gpu_type and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", gpu_type)
    if not count.isdigit() or int(count) > 1024 or bad_type:
        raise ConfigError(f"--perf-slurm-gpus-per-node takes N or TYPE:N (8, h100:8), got {value!r}")
    if device == "cuda" and int(count) < rpn and int(count) != 0:
        raise ConfigError(
            f"--perf-slurm-gpus-per-node {value}: {rpn} ranks per node need {rpn} GPUs per node"
        )
    return gpu_type or None, int(count)


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
