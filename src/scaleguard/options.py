"""Every option of the suite, declared once.

From ``OPTIONS`` come the pytest options (``--perf-NAME``) and their ini twins (``perf_NAME``),
the command line's flags that share an option (``scaleguard ab --pairs`` is ``--perf-ab-pairs``),
and the table in ``docs/options.md`` (``python -m scaleguard.options`` prints it; a test fails
when the doc and this table differ). Values are read and checked in one place,
``config.PerfConfig.read``, whichever door they came in through.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["text", "flag", "lines", "ini-lines"]


@dataclass(frozen=True)
class Option:
    """One option. ``kind``: text (one value), flag (on/off, a bool ini twin), lines (repeatable,
    a linelist ini twin) or ini-lines (ini only: one item per line). ``cli``: the subcommands that
    share it, as (command, flag)."""

    name: str
    help: str
    default: str = "–"  # as the docs say it: the value, or the rule that picks it
    kind: Kind = "text"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    cli: tuple[tuple[str, str], ...] = ()

    @property
    def flag(self) -> str:
        return f"--perf-{self.name}"

    @property
    def help_with_default(self) -> str:
        return self.help if self.default == "–" else f"{self.help} (default: {self.default})"

    @property
    def dest(self) -> str:
        return "perf_" + self.name.replace("-", "_")


def _threshold(name: str, default: str, help_text: str) -> Option:
    """A threshold, shared by ``scaleguard compare`` and ``ingest`` as ``--threshold-NAME``."""
    flag = f"--threshold-{name}"
    return Option(
        f"threshold-{name}", help_text, default, metavar="X", cli=(("compare", flag), ("ingest", flag))
    )


_BY_DEVICE = "cuda 0.03, cpu 0.10 (paired A/B on cpu 0.05)"

OPTIONS: tuple[Option, ...] = (
    Option(
        "device",
        "where cases run: auto (cuda if visible, else cpu), cpu (gloo) or cuda (nccl)",
        "auto",
        choices=("auto", "cpu", "cuda"),
    ),
    Option(
        "profile",
        "model sizes: smoke (CPU-sized) or full; auto picks full on cuda, smoke on cpu",
        "auto",
        choices=("auto", "smoke", "full"),
    ),
    Option(
        "world-sizes",
        "comma list of world sizes",
        "cpu 1,2; cuda 1,2,4,... up to the GPU count",
        metavar="1,2,4",
    ),
    Option(
        "modes",
        "comma list of single,dp,ddp,fsdp,compile (DataParallel runs at ws >= 2 only)",
        "single,dp,ddp",
        metavar="single,dp,ddp",
    ),
    Option(
        "models",
        "comma list of models: built in resnet50, resnet50_cifar, transformer, gpt2_small, "
        "resnet18_cifar, transformer_tiny, decoder_tiny, allreduce_{1m,4m,32m,256m}",
        "the profile's, or the --perf-workloads ones",
        metavar="M,...",
    ),
    Option(
        "workloads",
        "your own workloads, comma list of package.module:attribute (a scaleguard.workload.Workload, "
        "its class, or a list of them); installed packages register theirs under the entry-point "
        "group scaleguard.workloads",
        metavar="MOD:ATTR,...",
    ),
    Option(
        "peak-tflops",
        "the device's dense peak TFLOPS for MFU (unknown on CPU: no MFU)",
        "a table by GPU name and precision",
        metavar="T",
    ),
    Option(
        "share-gpu",
        "test mode: ranks of world sizes above the GPU count share the GPUs round-robin over gloo "
        "(exercises multi-rank CUDA on one GPU; never a scaling figure, never recorded)",
        "off",
        kind="flag",
    ),
    Option("precisions", "comma list of fp32,bf16", "cuda fp32,bf16; cpu fp32", metavar="fp32,bf16"),
    Option("scaling", "comma list of strong,weak", "strong,weak", metavar="strong,weak"),
    Option(
        "inputs",
        "comma list of synthetic,loader (loader only for image models, weak scaling)",
        "synthetic,loader",
        metavar="synthetic,loader",
    ),
    Option(
        "steps",
        "measured steps per case after warmup, at least; on CUDA more (up to 4x, 20 s) until the "
        "median is pinned",
        "50 cuda, 30 cpu",
        metavar="N",
    ),
    Option(
        "warmup",
        "minimum warmup steps; then until the running median settles, at most 4x",
        "10 cuda, 5 cpu",
        metavar="N",
    ),
    Option("timeout", "deadline in seconds for one case, all ranks", "900 cuda, 300 cpu", metavar="SECONDS"),
    Option(
        "threads-per-rank",
        "CPU threads in every rank (also at ws1, so scaling compares like with like)",
        "cores // largest world size",
        metavar="N",
    ),
    Option("data-root", "local CIFAR-10 directory for the loader cases (never downloads)", metavar="DIR"),
    Option("loader-workers", "DataLoader workers per rank for loader cases", "4 cuda, 0 cpu", metavar="N"),
    Option(
        "repeats",
        "runs of every case, each in fresh processes, interleaved across cases",
        "1; recording a baseline: 3",
        metavar="R",
    ),
    Option(
        "isolate",
        "fresh rank processes for every run (otherwise consecutive cases of one model and world "
        "size share ranks; two runs of one case never do)",
        "off",
        kind="flag",
    ),
    Option(
        "confirm",
        "extra runs at most for a case that looks regressed, improved or undecided, added in "
        "blocks of 2 until decided (0: judge the scheduled runs only)",
        "4",
        metavar="N",
    ),
    Option(
        "baselines",
        "directory of baseline JSON files; must exist unless --perf-update-baselines creates it",
        "<rootdir>/baselines",
        metavar="DIR",
        cli=(("ingest", "--baselines"),),
    ),
    Option(
        "baseline-torch",
        "compare with the baseline entries of this torch version",
        "the newest recorded",
        metavar="VERSION",
        cli=(("ingest", "--baseline-torch"),),
    ),
    _threshold(
        "step", "cuda 0.03, cpu 0.10 (paired A/B on cpu 0.05)", "relative median step-time change that counts"
    ),
    _threshold(
        "efficiency",
        "cuda 0.03, cpu 0.10 (paired A/B on cpu 0.05)",
        "scaling-efficiency drop in points that counts",
    ),
    _threshold("memory", "0.10", "relative peak-memory growth that counts"),
    Option(
        "case-thresholds",
        "per-case threshold overrides, one per line: '<case-id glob> step=0.08 efficiency=0.05 memory=0.2'",
        kind="ini-lines",
    ),
    Option(
        "update-baselines",
        "merge this session's recordable runs into the baseline file (locked, atomic)",
        "off",
        kind="flag",
        cli=(("ingest", "--update-baselines"),),
    ),
    Option(
        "inject-faults",
        "allow SCALEGUARD_INJECT_FAULT (also as an A/B side's --perf-ab-env-a/-b): a deliberate "
        "fault in every run, for tests of the harness; the header, every verdict line and every run "
        "record then say so. Without it a set variable is a usage error",
        "off",
        kind="flag",
    ),
    Option(
        "fail-below-projection",
        "fail a multi-rank case whose scaling efficiency stays below its projection from ws1 "
        "(BELOW-PROJECTION) after its confirm runs; without it such a case only warns",
        "off",
        kind="flag",
    ),
    Option("keep-runs", "runs kept per case and torch version in a baseline file", "10", metavar="K"),
    Option(
        "accept",
        "with --perf-update-baselines: record the cases matching GLOB whatever their verdict "
        "(REGRESSED, INCONCLUSIVE), restarting their entry; needs --perf-accept-reason",
        kind="lines",
        metavar="GLOB",
    ),
    Option(
        "accept-reason",
        "why the --perf-accept cases are recorded although not OK (stored with their runs)",
        metavar="TEXT",
    ),
    Option(
        "foreign-load-limit",
        "CPU cores that processes outside this session may use during a run's measured steps "
        "before the run is disturbed: set aside, measured again when quiet",
        "0.25",
        metavar="CORES",
    ),
    Option(
        "no-load-check",
        "do not watch for other processes' CPU/GPU load during runs (a busy machine is then "
        "judged like a quiet one)",
        "off",
        kind="flag",
    ),
    Option(
        "profile-steps",
        "step anatomy after the measured steps of confirm runs and recorded runs: phased steps "
        "with and without gradient sync, plus one profiled step (0: off)",
        "3",
        metavar="N",
    ),
    Option(
        "trace-dir",
        "where a REGRESSED case's Chrome trace is kept",
        "<rootdir>/.scaleguard/traces",
        metavar="DIR",
    ),
    Option(
        "history",
        "the history every run is appended to: a file (SQLite), or a PostgreSQL server a fleet "
        "shares (postgresql://user:password@host/db; or the SCALEGUARD_HISTORY environment "
        "variable, for a CI secret)",
        "<rootdir>/.scaleguard/history.sqlite",
        metavar="PATH|DSN",
        cli=(("ingest", "--history"), ("history", "--history"), ("export", "--history")),
    ),
    Option(
        "project",
        "the project recorded with every run in the history (several teams share one server); "
        "`scaleguard history` and `export` show only its runs (a pattern), `history import` "
        "records it",
        "the repository's directory name",
        metavar="NAME",
        cli=(("ingest", "--project"), ("history", "--project"), ("export", "--project")),
    ),
    Option("no-history", "do not append this session's runs to the history database", "off", kind="flag"),
    Option(
        "slurm",
        "run every case on a Slurm cluster: one allocation (salloc) for the session, each run a job "
        "step (srun, one task per rank) on it; judged as a local run",
        "off",
        kind="flag",
    ),
    Option(
        "slurm-nodes",
        "comma list of node counts the cases span (world size = nodes x ranks per node, and 1)",
        "1,2",
        metavar="1,2,4",
    ),
    Option(
        "slurm-ranks-per-node",
        "ranks per node: GPUs per node on cuda (required there), processes per node on cpu",
        "1 on cpu",
        metavar="N",
    ),
    Option(
        "slurm-partition", "the Slurm partition (salloc --partition)", "the cluster's default", metavar="P"
    ),
    Option("slurm-account", "the Slurm account (salloc --account)", metavar="A"),
    Option(
        "slurm-time",
        "the allocation's time limit in minutes; Slurm ends it even if the session is killed",
        "120",
        metavar="MINUTES",
    ),
    Option(
        "slurm-args",
        "more salloc arguments, as one shell-quoted string (e.g. '--qos=perf --constraint=h100')",
        metavar="ARGS",
    ),
    Option(
        "slurm-dir",
        "the shared results directory every node sees (rank files and run records go there)",
        "<rootdir>/.scaleguard/slurm",
        metavar="DIR",
    ),
    Option(
        "slurm-pending-timeout",
        "seconds the allocation may wait in the queue; then it is cancelled and the cases fail "
        "with Slurm's reason",
        "600",
        metavar="SECONDS",
    ),
    Option(
        "slurm-gpus-per-node",
        "GPUs asked for on each node, N or TYPE:N (salloc and srun --gpus-per-node; 0 asks for none)",
        "the ranks per node on cuda, 0 on cpu",
        metavar="[TYPE:]N",
    ),
    Option(
        "slurm-gpu-bind",
        "how a step's GPUs reach its ranks: node (every rank sees the node's GPUs and takes "
        "cuda:LOCAL_RANK) or task (--gpus-per-task=1: each rank sees its own one GPU)",
        "node",
        choices=("node", "task"),
    ),
    Option(
        "slurm-cpus-per-task",
        "CPUs for each rank (salloc and srun -c); a rank runs as many threads as it is bound to",
        "a node's CPUs / ranks per node",
        metavar="N",
    ),
    Option(
        "slurm-mem",
        "memory per node (salloc and srun --mem; 0 is all of the node's)",
        "0",
        metavar="SIZE",
    ),
    Option(
        "slurm-no-exclusive",
        "share the nodes with other jobs (no --exclusive): a neighbour's load then lands in the runs",
        "off (nodes held exclusively)",
        kind="flag",
    ),
    Option(
        "slurm-srun-args",
        "more srun arguments for every step, as one shell-quoted string (e.g. "
        "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3 --mpi=pmix' or '--reservation=perf')",
        metavar="ARGS",
    ),
    Option(
        "slurm-python",
        "the Python each step runs (e.g. a container's /usr/bin/python)",
        "the one running pytest",
        metavar="PYTHON",
    ),
    Option(
        "slurm-export",
        "an environment variable for every step's ranks (repeatable)",
        kind="lines",
        metavar="KEY=VALUE",
    ),
    Option(
        "slurm-iface",
        "the network interface the ranks talk over (NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME)",
        "what each library picks",
        metavar="IFACE",
    ),
    Option(
        "slurm-retries",
        "new allocations a session may ask for when its allocation is lost (preempted, a node "
        "failed, cancelled from outside); a failed node is excluded from the next",
        "1",
        metavar="N",
    ),
    Option(
        "slurm-skip-pending",
        "skip the cases, instead of failing them, when the allocation never starts",
        "off",
        kind="flag",
    ),
    Option(
        "ab-b",
        "paired A/B: the Python of side B (a venv with other torch and scaleguard); turns A/B on",
        metavar="PYTHON",
        cli=(("ab", "--b"),),
    ),
    Option(
        "ab-a",
        "paired A/B: the Python of side A",
        "the one running pytest",
        metavar="PYTHON",
        cli=(("ab", "--a"),),
    ),
    Option(
        "ab-srun-args-a",
        "paired A/B on a cluster (--perf-slurm): more srun arguments for side A's steps only, one "
        "shell-quoted string (e.g. '--container-image=nvcr.io#nvidia/pytorch:25.01-py3'); side A's "
        "Python (--perf-ab-a) is then probed inside such a step, where it lives",
        metavar="ARGS",
    ),
    Option(
        "ab-srun-args-b",
        "paired A/B on a cluster: more srun arguments for side B's steps only (its container)",
        metavar="ARGS",
    ),
    Option(
        "ab-env-a",
        "paired A/B: an environment variable for side A's ranks only (repeatable)",
        kind="lines",
        metavar="KEY=VALUE",
        cli=(("ab", "--a-env"),),
    ),
    Option(
        "ab-env-b",
        "paired A/B: an environment variable for side B's ranks only (repeatable)",
        kind="lines",
        metavar="KEY=VALUE",
        cli=(("ab", "--b-env"),),
    ),
    Option(
        "ab-pairs", "paired A/B: most pairs per case", "10 cpu, 6 cuda", metavar="N", cli=(("ab", "--pairs"),)
    ),
    Option(
        "ab-markdown",
        "paired A/B: write the markdown report here",
        metavar="FILE",
        cli=(("ab", "--markdown"),),
    ),
    Option("ab-plot", "paired A/B: write the PNG plot here", metavar="FILE", cli=(("ab", "--plot"),)),
    Option(
        "ab-save",
        "paired A/B: directory for A.json and B.json (pytest-benchmark format)",
        metavar="DIR",
        cli=(("ab", "--save-dir"),),
    ),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


def add_pytest_options(parser: Any) -> None:
    """The ``--perf-*`` options in pytest's group "scaleguard", each with its ini twin."""
    group = parser.getgroup("scaleguard", "scaleguard performance regression suite")
    for opt in OPTIONS:
        if opt.kind == "ini-lines":
            parser.addini(opt.dest, opt.help, type="linelist", default=[])
            continue
        if opt.kind == "flag":
            group.addoption(
                opt.flag, dest=opt.dest, action="store_true", default=None, help=opt.help_with_default
            )
            parser.addini(opt.dest, f"ini twin of {opt.flag}", type="bool", default=False)
        elif opt.kind == "lines":
            group.addoption(
                opt.flag,
                dest=opt.dest,
                action="append",
                default=None,
                metavar=opt.metavar,
                help=opt.help_with_default,
            )
            parser.addini(opt.dest, f"ini twin of {opt.flag} (one per line)", type="linelist", default=[])
        else:
            group.addoption(
                opt.flag,
                dest=opt.dest,
                default=None,
                choices=opt.choices,
                metavar=None if opt.choices else opt.metavar,
                help=opt.help_with_default,
            )
            parser.addini(opt.dest, f"ini twin of {opt.flag}", default=None)


def add_cli_options(
    parser: argparse.ArgumentParser,
    command: str,
    types: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    required: Sequence[str] = (),
) -> None:
    """The flags of ``scaleguard COMMAND`` that share a suite option, named as the table says.
    ``types``/``defaults``/``required`` are keyed by the option's name."""
    types, defaults = types or {}, defaults or {}
    for opt in OPTIONS:
        for cmd, flag in opt.cli:
            if cmd != command:
                continue
            kwargs: dict[str, Any] = {"help": opt.help_with_default}
            if opt.kind == "flag":
                kwargs["action"] = "store_true"
            elif opt.kind == "lines":
                kwargs.update(action="append", metavar=opt.metavar)
            else:
                kwargs.update(metavar=opt.metavar, choices=opt.choices)
                if opt.name in types:
                    kwargs["type"] = types[opt.name]
            if opt.name in defaults:
                kwargs["default"] = defaults[opt.name]
            if opt.name in required:
                kwargs["required"] = True
            parser.add_argument(flag, **kwargs)


def markdown_table() -> str:
    """The suite's options as the table in ``docs/options.md``."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    for opt in OPTIONS:
        if opt.kind == "ini-lines":
            usage = f"ini `{opt.dest}` (lines)"
        elif opt.kind == "flag":
            usage = f"`{opt.flag}`"
        else:
            value = "{" + ",".join(opt.choices) + "}" if opt.choices else opt.metavar
            usage = f"`{opt.flag} {value}`" + (" (repeatable)" if opt.kind == "lines" else "")
        shared = ", ".join(f"`scaleguard {cmd} {flag}`" for cmd, flag in opt.cli)
        meaning = opt.help + (f"; also {shared}" if shared else "")
        rows.append(f"| {usage} | {cell(opt.default)} | {cell(meaning)} |")
    return "\n".join(rows) + "\n"


BEGIN = "<!-- options table: made by `python -m scaleguard.options`; edit src/scaleguard/options.py -->"
END = "<!-- end of options table -->"


def document_with_table(text: str) -> str:
    """``text`` (docs/options.md) with the block between the markers replaced by the table."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"docs/options.md has no block between {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table, or with ``--write FILE`` put it into that markdown file."""
    import sys
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--write"] and len(args) == 2:
        path = Path(args[1])
        path.write_text(document_with_table(path.read_text()))
        return 0
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
