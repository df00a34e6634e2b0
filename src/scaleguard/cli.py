"""The ``scaleguard`` command.

* ``compare OLD NEW``: verdicts between two saved runs or baseline files (table, ``--markdown``,
  ``--plot``); exit 1 when anything regressed, 2 on bad input, so CI can gate on it.
* ``ingest RECORDS``: judge (and record) runs written under torchrun, like the suite does.
* ``history``: the nights of each case and their change points (``--html``: one page).
* ``export``: a history or saved runs as Bencher's BMF or Otava's CSV.
* ``hardware-key``: this machine's baseline file name, for scripts and CI.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from scaleguard import options
from scaleguard.config import ConfigError, PerfConfig, check_output_path
from scaleguard.evidence import baseline, benchmark_io
from scaleguard.evidence.baseline import BaselineError
from scaleguard.evidence.files import FileFormatError, content_id, inert
from scaleguard.evidence.runs import CaseEvidence
from scaleguard.evidence.verdict import Status, Thresholds, ThresholdSettings, Verdict, decide
from scaleguard.history.database import HistoryError
from scaleguard.report import terminal as report

if TYPE_CHECKING:
    from scaleguard.history.target import HistoryTarget

EXIT_REGRESSED, EXIT_BAD_INPUT = 1, 2


class UsageProblem(Exception):
    """Bad input: the message says what and how to fix it; exit 2."""


def load_cases(path: Path, torch_pick: str | None = None) -> tuple[str, str | None, dict[str, CaseEvidence]]:
    """(label, hardware key, cases) of a saved pytest-benchmark run or of a baseline file."""
    try:
        data = benchmark_io.read_document_any(path)
        if benchmark_io.is_saved_run(data):
            key, cases = benchmark_io.read_saved_run(path, data)
        else:
            loaded = baseline.load(path)
            assert loaded is not None  # read_document_any raised for a missing file
            key = loaded.hardware_key
            cases = {c: e for c in loaded.cases if (e := loaded.entry(c, torch_pick)) is not None}
            if not cases:
                raise UsageProblem(f"{path}: no entries" + (f" for torch {torch_pick}" if torch_pick else ""))
    except (FileFormatError, BaselineError) as exc:
        raise UsageProblem(str(exc)) from None
    torches = sorted({e.torch for e in cases.values()})
    return f"torch {', '.join(torches)} ({path.stem})", key, cases


def judge_all(
    old: dict[str, CaseEvidence], new: dict[str, CaseEvidence], thresholds: Thresholds, old_label: str
) -> list[tuple[CaseEvidence, Verdict]]:
    """Judge every case of NEW against OLD; world size 1 first so scaling regressions are named."""
    rows: list[tuple[CaseEvidence, Verdict]] = []
    ws1: dict[str, Status] = {}
    for evidence in sorted(new.values(), key=lambda e: (e.group_id, e.world_size)):
        verdict = decide(
            evidence, old.get(evidence.case_id), thresholds, ws1.get(evidence.group_id), f"not in {old_label}"
        )
        if evidence.world_size == 1:
            ws1[evidence.group_id] = verdict.status
        rows.append((evidence, verdict))
    return rows


def config_from(args: argparse.Namespace, writes_history: bool = True) -> PerfConfig:
    """The suite's configuration from this command's arguments (``--threshold-step`` is
    ``--perf-threshold-step`` here), read by the suite's one reader. A command that only views a
    history (``history``, ``export``) never writes it: a colleague's read-only file is viewable."""

    def text(name: str) -> str | None:
        value = getattr(args, name.replace("-", "_"), None)
        return None if value is None else str(value)

    def flag(name: str) -> bool:
        if name == "no-history" and not writes_history:
            return True
        return bool(getattr(args, name.replace("-", "_"), False))

    try:
        return PerfConfig.read(text, flag)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# --case and --hardware-key: one rule for histories and saved files (history.database.matches)
MATCH_HELP = "only {what} matching this shell-style pattern (*, ?, [seq], [!seq]; the whole id)"


def check_patterns(args: argparse.Namespace) -> None:
    """An empty pattern matches nothing anywhere: said, not silently an empty (or full) view."""
    given = [("--case", args.case), ("--hardware-key", args.hardware_key)]
    given += [(f"--{name}", getattr(args, name, None)) for name in ("runner", "project")]
    for option, value in given:
        if value is not None and not value.strip():
            raise UsageProblem(f"{option} is empty: give a pattern (e.g. '*ddp*'), or leave it out")


def check_output(
    path: Path | None, option: str, suffixes: tuple[str, ...] = (), directory: bool = False
) -> None:
    """Before any work: an output path that cannot be written is a usage error, not a
    traceback after the comparison."""
    try:
        check_output_path(path, option, suffixes, directory=directory)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None


def check_not_input(output: Path | None, option: str, inputs: list[Path]) -> None:
    """A report written over one of the command's own inputs would lose it."""
    if output is None or not output.exists():
        return
    for given in inputs:
        with contextlib.suppress(OSError):
            if given.exists() and os.path.samefile(output, given):
                raise UsageProblem(
                    f"{option} {output} is the input {given}: the report would overwrite it; "
                    "give another name"
                )


def cmd_compare(args: argparse.Namespace) -> int:
    config = config_from(args)  # every option checked before any file is read
    check_output(args.markdown, "--markdown")
    check_output(args.plot, "--plot", PLOT_SUFFIXES)
    for output, option in ((args.markdown, "--markdown"), (args.plot, "--plot")):
        check_not_input(output, option, [args.old, args.new])
    old_label, old_key, old = load_cases(args.old, args.old_torch)
    new_label, new_key, new = load_cases(args.new, args.new_torch)
    if (old_key is None or new_key is None or old_key != new_key) and not args.allow_cross_hardware:
        unknown = [str(p) for p, k in ((args.old, old_key), (args.new, new_key)) if k is None]
        raise UsageProblem(
            (
                f"{' and '.join(unknown)}: no hardware key (machine_info.scaleguard is empty)"
                if unknown
                else f"{args.old} is hardware {old_key}, {args.new} is {new_key}"
            )
            + ": numbers of different hardware are not comparable. Pass --allow-cross-hardware "
            "to compare them anyway."
        )
    devices = {str(e.config.get("device")) for e in new.values()}
    thresholds = config.thresholds.for_device("cpu" if devices == {"cpu"} else "cuda")
    rows = judge_all(old, new, thresholds, old_label)
    console = Console(width=180, markup=False)
    if old_key != new_key:
        console.print(inert(f"warning: comparing across hardware ({old_key} -> {new_key})"), markup=False)
    console.print(report.compare_table(rows, old_label, new_label))
    for _, verdict in rows:
        if verdict.status is not Status.OK:
            console.print(inert(verdict.story), markup=False, highlight=False)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.compare_markdown(rows, old_label, new_label), encoding="utf-8")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        report.compare_plot(old, new, old_label, new_label, args.plot)
    return EXIT_REGRESSED if any(v.failed for _, v in rows) else 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from scaleguard.evidence.ledger import BaselineContext, Ledger
    from scaleguard.schedule import torchrun_entry

    config = config_from(args)  # thresholds checked before any record is read
    if args.hardware_key is not None:
        baseline.check_key(args.hardware_key, "--hardware-key")
    # a run's identity is its content (its job's run id, its case, its samples), never its place in
    # this ingest: a record given twice, or ingested again beside another, counts once
    records = []
    seen: dict[str, Path] = {}
    for path in args.files:
        spec, run = torchrun_entry.read_finished_record(path)
        ident = f"{run.session}-{content_id(spec.case_id, run.step_s)}"
        if ident in seen:
            print(inert(f"scaleguard ingest: {path} is the run of {seen[ident]} again; counted once"),
                  file=sys.stderr)  # fmt: skip
            continue
        seen[ident] = path
        records.append((spec, replace(run, run_id=ident)))
    records.sort(key=lambda r: (r[0].group_id, r[0].world_size))
    first_spec, first = records[0]
    hardware_key = args.hardware_key or baseline.hardware_key(
        # a torchrun job's hardware is its whole world: nodes x GPUs
        first_spec.device,
        first.device_name,
        max(spec.world_size for spec, _ in records),
        first.device_name,
        first_spec.settings.threads_per_rank,
    )
    # a key made from a record's device name: a file name and a history key, checked as both
    baseline.check_key(hardware_key, "the hardware key made from the records' device (give --hardware-key)")
    db = None
    if config.history is not None:
        from scaleguard.history.store import open_history

        db = open_history(config.history)  # opened (and checked) before anything is judged or written
    if not args.baselines.is_dir() and not args.update_baselines:
        raise UsageProblem(
            f"--baselines {args.baselines} is not a directory (add --update-baselines to create it)"
        )
    path = args.baselines / f"{hardware_key}.json"
    if args.update_baselines:
        baseline.check_writable(args.baselines)
        baseline.check_lock(path)
    loaded = baseline.load(path)
    baseline.check_matches(loaded, hardware_key, args.baseline_torch, "--baseline-torch")
    ctx = BaselineContext(
        path=path,
        file=loaded,
        hardware_key=hardware_key,
        hardware={"device": first_spec.device, "gpu_name": first.device_name, "source": "torchrun"},
        torch_pick=args.baseline_torch,
        thresholds=config.thresholds.for_device(first_spec.device),
        commit=baseline.git_commit(Path.cwd()),
    )
    ledger = Ledger(f"ingest-{first.session}", ctx)
    for spec, run in records:
        ledger.add(spec, run, session=run.session or None, run_id=run.run_id)
    for spec, _ in records:
        ledger.judge(spec.case_id)
        ledger.complete(spec.case_id)
    console = Console(width=180, markup=False)
    for table in report.scaling_tables(ledger):
        console.print(table)
    for verdict in ledger.verdicts.values():
        if verdict.status is not Status.OK:
            console.print(inert(verdict.story), markup=False, highlight=False)
    code = EXIT_REGRESSED if any(v.failed for v in ledger.verdicts.values()) else 0
    if args.update_baselines:
        update = ledger.update_baselines()
        for line in report.baseline_update_lines(update):
            console.print(inert(line), markup=False, highlight=False)
        if update.refused is not None:
            code = EXIT_BAD_INPUT
    if db is not None:
        # after the baseline: a history that fails now costs the history, never the baseline
        from scaleguard.history.database import Fleet

        with db:
            verdicts = {cid: v.status.value for cid, v in ledger.verdicts.items()}
            added = db.append(
                [ledger.evidence(c) for c in ledger.completed], hardware_key, "ingest", verdicts,
                fleet=Fleet.here(project_of(config)),
            )  # fmt: skip
        console.print(inert(f"scaleguard: history {config.history}: {added} runs appended"), markup=False)
    return code


def load_all_cases(path: Path) -> tuple[str | None, list[CaseEvidence]]:
    """(hardware key, every entry) of a saved run or a baseline file: for a baseline every torch
    version's entry, since the runs before an upgrade are what a change point needs."""
    try:
        data = benchmark_io.read_document_any(path)
        if benchmark_io.is_saved_run(data):
            key, cases = benchmark_io.read_saved_run(path, data)
            return key, list(cases.values())
        loaded = baseline.load(path)
        assert loaded is not None  # read_document_any raised for a missing file
        return loaded.hardware_key, [e for by_torch in loaded.cases.values() for e in by_torch.values()]
    except (FileFormatError, BaselineError) as exc:
        raise UsageProblem(str(exc)) from None


DEFAULT_HISTORY = Path(".scaleguard/history.sqlite")


def project_of(config: PerfConfig) -> str:
    """``--project``, else the name of the repository we run in (else of this directory)."""
    return config.project or (baseline.git_root(Path.cwd()) or Path.cwd()).name


def cmd_history(args: argparse.Namespace) -> int:
    """``scaleguard history``: the last nights of each case and its change points;
    ``scaleguard history import FILES``: load saved runs, baselines and SQLite histories
    (idempotent); ``scaleguard history send``: a server history's spool."""
    from scaleguard.history import database as history
    from scaleguard.history.store import open_history

    check_patterns(args)
    verb = args.args[0] if args.args else None
    # --threshold-step: the smallest change of level shown; checked even where no run matches
    config = config_from(args, writes_history=verb in ("import", "send"))
    settings, target = config.thresholds, config.history or DEFAULT_HISTORY
    if args.last < 1:
        raise UsageProblem(f"--last takes a positive number of nights, got {args.last}")
    if verb == "import":
        files = [Path(f) for f in args.args[1:]]
        if not files:
            raise UsageProblem("history import takes saved runs (--benchmark-save), baselines, histories")
        raw: list[tuple[object, ...]] = []
        batches = []
        for f in files:  # every file read and validated before any write
            if history.is_sqlite(f):  # a runner's history moving in: its rows as they are
                if isinstance(target, Path) and f.resolve() == target.resolve():
                    raise UsageProblem(f"{f}: is the history imported into; give another file")
                with history.History(f, readonly=True) as old:
                    raw += old.raw_rows()
                continue
            key, cases = load_all_cases(f)
            if key is None:
                raise UsageProblem(f"{f}: no hardware key; it cannot be placed in the history")
            batches.append(history.Batch(cases, key, "import"))
        # refused before the file exists: nothing left behind
        raw += history.appendable(batches, str(target), history.Fleet(None, project_of(config)))
        with open_history(target) as db:
            added = db.append_rows(raw)  # one transaction: all files land, or none
        print(inert(f"scaleguard history: {added} new runs from {len(files)} files into {target}"))
        if added:
            _warm_change_points(target, config.thresholds, args.spool_dir)
        return 0
    if verb == "send":
        from scaleguard.history.store import send_spool, spool_path
        from scaleguard.history.target import ServerDsn

        if not isinstance(target, ServerDsn) or len(args.args) > 1:
            raise UsageProblem(
                "history send: sends a server history's spool; give --history postgresql://..."
            )
        spool = spool_path(args.spool_dir, target)
        with open_history(target) as db:
            sent = send_spool(db, spool)
        print(inert(f"scaleguard history: {sent} new runs sent from {spool} to {target}"))
        return 0
    if args.args:
        raise UsageProblem(
            f"history: unknown argument {inert(args.args[0])!r} (did you mean `history import FILES`?)"
        )
    path = target
    if args.html is not None:
        check_output(args.html, "--html", (".html", ".htm"))
        check_not_input(args.html, "--html", [path] if isinstance(path, Path) else [])
    from scaleguard.history.memo import viewed

    with open_history(path, readonly=True) as db:
        # every night of each case, the runs of the last year (or --last nights) read whole; each
        # case's change points searched once, beside the reading; a long series' blocks kept
        series, notes = viewed(
            db, settings, args.spool_dir, args.hardware_key, args.case, args.runner, args.project,
            max(args.last, history.RECENT_NIGHTS),
        )  # fmt: skip
        for note in [*db.notes, *notes]:
            print(inert(f"scaleguard history: {note}"), file=sys.stderr)
    if args.html is not None:
        from scaleguard.report import page as history_page

        shown = [r for one in series for r in one.rows]
        history_page.write(args.html, shown, settings, series)
        print(f"scaleguard history: page written to {args.html} ({sum(one.runs for one in series)} runs)")
    if not series:
        print(inert(f"scaleguard history {path}: no runs match"))
        return 0
    out = inert
    for one in series:
        key, case_id, case_rows, nights = one.hardware_key, one.case_id, one.rows, one.nights
        runners = one.runners
        more = " ..." if len(runners) > 8 else ""
        fleet = f", runners {', '.join(runners[:8])}{more}" if len(runners) > 1 else ""
        print(out(f"{case_id}  ({key}, {len(nights)} nights, {one.runs} runs{fleet})"))
        for night in nights[-args.last :]:
            verdicts = sorted({r.verdict for r in case_rows if r.session == night.session and r.verdict})
            build = f"torch {night.torch}" + (f" ({night.torch_git[:10]})" if night.torch_git else "")
            print(out(f"  {night.recorded_at[:19]}  {night.value * 1e3:9.2f} ms  {night.runs} runs  {build}"
                      f"  {'/'.join(verdicts) or '-'}  [{night.session}]"))  # fmt: skip
        for point in one.points:
            before, after = point.before, point.after
            assert before is not None and after is not None
            builds = (
                f"torch {before.torch} -> {after.torch}"
                if before.torch != after.torch
                else f"torch {after.torch}"
            )
            if before.torch_git and after.torch_git and before.torch_git != after.torch_git:
                builds += f" (git {before.torch_git[:10]} -> {after.torch_git[:10]})"
            print(out(
                f"  change point at {after.recorded_at[:19]} [{after.session}]: {point.change:+.1%} "
                f"(p={point.p_value:.1g}); last night before: {before.recorded_at[:19]} "
                f"[{before.session}]; {builds}"
            ))  # fmt: skip
    return 0


def _warm_change_points(target: HistoryTarget, settings: ThresholdSettings, spool_dir: Path) -> None:
    """After an import: every long series' whole blocks searched once and kept in the history,
    so that no viewer's first view searches years of nights (a cache: a history too large for
    one view, or a role that may not write, leaves it cold with one line)."""
    from scaleguard.history import database as history
    from scaleguard.history.memo import search_ahead
    from scaleguard.history.store import open_history

    try:
        with open_history(target) as db:
            long = search_ahead(db, settings, spool_dir)
    except history.HistoryError as exc:
        print(inert(f"scaleguard history: change points not searched ahead ({exc})"), file=sys.stderr)
        return
    if long:
        print(f"scaleguard history: change points of {long} long series searched ahead for every viewer")


def cmd_export(args: argparse.Namespace) -> int:
    """``scaleguard export``: a history (or saved runs) as Bencher's BMF or Otava's CSV."""
    from scaleguard.history import database as history
    from scaleguard.history import export

    check_patterns(args)
    # --history read by the suite's one reader (a file or a server; SCALEGUARD_HISTORY)
    source = config_from(args, writes_history=False).history or DEFAULT_HISTORY
    if args.format == "bmf":
        check_output(args.out, "--out", (".json",))
    else:  # a dangling link, a file, a directory this user cannot write: said now, by name
        check_output(args.out, "--out", directory=True)
    inputs = [*args.files, *([source] if not args.files and isinstance(source, Path) else [])]
    check_not_input(args.out, "--out", inputs)
    if args.files and (args.runner is not None or args.project is not None):
        raise UsageProblem("--runner and --project narrow a history; saved runs and baselines record neither")
    if args.files:
        rows = []
        for f in args.files:
            key, cases = load_all_cases(f)
            if key is None:
                raise UsageProblem(
                    f"{f}: no hardware key; give a file saved by pytest perf/ --benchmark-save"
                )
            rows += export.rows_of_cases(cases, key)
        key = args.hardware_key
        rows = [r for r in rows if history.matches(r.case_id, args.case)
                and (key is None or history.matches(r.hardware_key, key))]  # fmt: skip
    else:
        from scaleguard.history.store import open_history

        with open_history(source, readonly=True) as db:
            rows = db.rows(args.hardware_key, args.case, args.runner, args.project)
    figures = export.nights(rows)
    try:
        if args.format == "bmf":
            key, doc = export.bmf(figures, args.session)
            from scaleguard.evidence.files import atomic_write_text

            atomic_write_text(args.out, export.bmf_text(doc))
            # stored text is inert on the terminal and quoted in a command a user may paste
            print(inert(f"scaleguard export: {len(doc)} cases of {key} as BMF in {args.out}; upload with"))
            print(inert(f"  bencher run --testbed {shlex.quote(key)} --adapter json --file "
                        f"{shlex.quote(str(args.out))}"))  # fmt: skip
        else:
            made = export.otava(figures)
            args.out.mkdir(parents=True, exist_ok=True)
            from scaleguard.evidence.files import atomic_write_text

            for name, text in made.files.items():
                assert Path(name).name == name  # export.otava_file_name: never a path
                atomic_write_text(args.out / name, text)
            n_cases = len(made.files) - 1
            print(inert(f"scaleguard export: {n_cases} cases as Otava CSV in {args.out}; analyse with"))
            print(inert(f"  cd {shlex.quote(str(args.out))} && OTAVA_CONFIG=otava.yaml otava analyze <test>"))
            if made.untimed:
                print(f"  {made.untimed} nights without a valid recorded time left out (Otava needs a time)")
    except export.ExportError as exc:
        raise UsageProblem(str(exc)) from None
    return 0


def cmd_hardware_key(args: argparse.Namespace) -> int:
    from scaleguard.machine.env import gpu_inventory, host_fingerprint

    host = host_fingerprint()
    device = args.device if args.device != "auto" else ("cuda" if gpu_inventory().count else "cpu")
    if device == "cuda" and not host.gpu_count:
        raise UsageProblem("--device cuda: no CUDA device is visible")
    if args.threads_per_rank is not None:
        from scaleguard.config import INTEGER_BOUNDS

        lo, hi = INTEGER_BOUNDS["threads-per-rank"]  # the suite's own bound: a key it could make
        if not lo <= args.threads_per_rank <= hi:
            raise UsageProblem(
                f"--threads-per-rank takes a positive integer up to {hi}, got {args.threads_per_rank}"
            )
    threads = args.threads_per_rank or max(1, (os.cpu_count() or 1) // 2)
    print(baseline.host_hardware_key(host, device, threads))
    return 0


def cmd_ab(args: argparse.Namespace, pytest_args: list[str]) -> int:
    """``pytest perf/`` in paired A/B mode; exit 0 / 1 (REGRESSED) / 2 (bad input)."""
    import subprocess

    from scaleguard.schedule import ab

    check_output(args.markdown, "--markdown")
    check_output(args.plot, "--plot", PLOT_SUFFIXES)
    try:
        check_output_path(args.save_dir, "--save-dir", directory=True)
    except ConfigError as exc:
        raise UsageProblem(str(exc)) from None
    sides: dict[str, str] = {}
    for label, python, env in (("A", args.a, args.a_env), ("B", args.b, args.b_env)):
        try:
            probed = ab.probe(label, python, ab.parse_env(env or (), f"--{label.lower()}-env"))
        except ab.ABInputError as exc:
            raise UsageProblem(str(exc)) from None
        sides[label] = probed.interpreter.python
        print(
            f"scaleguard ab: side {label}: {probed.interpreter.python} (torch {probed.versions.get('torch')})"
        )
    pytest_args = [a for a in pytest_args if a != "--"]
    if not any(not a.startswith("-") and Path(a.split("::")[0]).exists() for a in pytest_args):
        # `-k CASE` alone: without a path pytest would collect this directory's own tests
        # (testpaths) and find no case to compare
        if not Path("perf").is_dir():
            raise UsageProblem(
                "no test path given and no perf/ here: run from the suite's root or name its perf/ directory"
            )
        pytest_args = ["perf/", *pytest_args]
    command = [sys.executable, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider"]
    command += ["--perf-ab-a", sides["A"], "--perf-ab-b", sides["B"]]
    for flag, value in (("--perf-ab-markdown", args.markdown), ("--perf-ab-plot", args.plot),
                        ("--perf-ab-save", args.save_dir), ("--perf-ab-pairs", args.pairs)):  # fmt: skip
        if value is not None:
            command += [flag, str(value)]
    for side, items in (("a", args.a_env), ("b", args.b_env)):
        for item in items or ():
            command += [f"--perf-ab-env-{side}", item]
    code = subprocess.call(command)
    # pytest: 1 tests failed (a REGRESSED case, or a failed one), 4 usage error
    return {0: 0, 1: EXIT_REGRESSED, 4: EXIT_BAD_INPUT, 5: EXIT_BAD_INPUT}.get(code, code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scaleguard")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="verdicts between two saved runs or baseline files")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    cmp.add_argument("--markdown", type=Path, help="write a markdown report here")
    cmp.add_argument("--plot", type=Path, help="write a PNG plot here")
    cmp.add_argument("--old-torch", help="for a baseline file: which torch version's entries")
    cmp.add_argument("--new-torch", help="for a baseline file: which torch version's entries")
    cmp.add_argument(
        "--allow-cross-hardware", action="store_true", help="compare files of different hardware keys"
    )
    ing = sub.add_parser("ingest", help="judge (and record) run records written under torchrun")
    ing.add_argument(
        "files", nargs="+", type=Path, help="*.case.json from scaleguard.schedule.torchrun_entry"
    )
    ing.add_argument("--hardware-key", help="default: cuda-<gpu>-x<largest world size> / cpu-<cpu>-<n>t")
    # the flags shared with the suite, from the one option table
    options.add_cli_options(cmp, "compare")
    options.add_cli_options(
        ing, "ingest", types={"baselines": Path}, defaults={"baselines": Path("baselines")}
    )
    abp = sub.add_parser(
        "ab",
        help="paired A/B of two Python installs; other arguments go to pytest (default: perf/)",
        description="Measure each selected case alternately with two interpreters (fresh processes per run, "
        "AB/BA order balanced and shuffled) and judge per-pair ratios. Arguments not listed here "
        "(-k, --perf-*) are passed to pytest.",
    )
    options.add_cli_options(
        abp,
        "ab",
        types={"ab-pairs": int, "ab-markdown": Path, "ab-plot": Path, "ab-save": Path},
        required=("ab-a", "ab-b"),
    )
    hist = sub.add_parser(
        "history",
        help="the last nights of each case and their change points; `history import FILES` loads saved runs",
    )
    hist.add_argument(
        "args",
        nargs="*",
        help="`import FILES...`: load saved runs, baselines and SQLite histories; `send`: a server "
        "history's spool (runs a session kept while the server was away)",
    )
    options.add_cli_options(hist, "history")
    hist.add_argument("--runner", help=MATCH_HELP.format(what="runners (hosts)"))
    hist.add_argument(
        "--spool-dir", type=Path, default=Path(".scaleguard"),
        help="send: where the spool is; a view keeps its change-point memo there",
    )  # fmt: skip
    hist.add_argument("--case", default="*", help=MATCH_HELP.format(what="case ids"))
    hist.add_argument("--hardware-key", help=MATCH_HELP.format(what="hardware keys"))
    hist.add_argument("--last", type=int, default=10, help="nights shown per case (default 10)")
    hist.add_argument("--html", type=Path, help="write one self-contained page (plots, change points) here")
    hist.add_argument(
        "--threshold-step",
        help="smallest change of level shown as a change point (default: the case's step threshold, "
        "CPU 0.10, CUDA 0.03)",
    )
    exp = sub.add_parser(
        "export",
        help="a history or saved runs as Bencher's metric format (BMF) or Otava's CSV",
        description="Nights where teams already look: --format bmf writes the latest night of each case "
        "(or --session's) for one hardware key, Bencher's testbed; --format otava writes one CSV per case "
        "and an otava.yaml.",
    )
    exp.add_argument("files", nargs="*", type=Path, help="saved runs or baselines instead of the history")
    exp.add_argument("--format", choices=("bmf", "otava"), required=True)
    exp.add_argument("--out", type=Path, required=True, help="bmf: a .json file; otava: a directory")
    options.add_cli_options(exp, "export")
    exp.add_argument("--runner", help=MATCH_HELP.format(what="runners (hosts)"))
    exp.add_argument("--case", default="*", help=MATCH_HELP.format(what="case ids"))
    exp.add_argument(
        "--hardware-key", help=MATCH_HELP.format(what="hardware keys") + " (BMF: one key per upload)"
    )
    exp.add_argument("--session", help="bmf: this session's night instead of the latest of each case")
    bis = sub.add_parser(
        "bisect",
        help="first bad torch build: PY_GOOD PY_2 ... PY_BAD -- perf/ -k CASE (paired A/B at each probe)",
    )
    bis.add_argument(
        "builds",
        nargs="*",
        help="interpreters (paths or commands on PATH), oldest good first; after them `--` and the "
        "pytest arguments of each probe",
    )
    bis.add_argument(
        "--wheels", type=Path, metavar="DIR",
        help="instead of interpreters: the torch wheels of DIR by version, each installed into a "
        "throwaway venv when probed",
    )  # fmt: skip
    bis.add_argument(
        "--probe-timeout", metavar="S",
        help="the deadline of one probe in seconds (default 7200); past it the probe is stopped and FAILED",
    )  # fmt: skip
    key = sub.add_parser("hardware-key", help="print this machine's baseline key (file name without .json)")
    key.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    key.add_argument(
        "--threads-per-rank", type=int, help="CPU runs: threads per rank (default: cores // 2, as the suite)"
    )
    return parser


def cmd_bisect(args: argparse.Namespace, pytest_args: list[str]) -> int:
    from scaleguard.schedule import bisect

    timeout_s = bisect.PROBE_TIMEOUT_S
    if args.probe_timeout is not None:
        try:
            timeout_s = float(args.probe_timeout)
        except ValueError:
            timeout_s = math.nan
        if not 0 < timeout_s < 1e7:  # NaN fails this too
            print("scaleguard bisect: --probe-timeout takes seconds (a positive number)", file=sys.stderr)
            return EXIT_BAD_INPUT
    if (args.wheels is None) == (not args.builds):  # both, or neither
        print("scaleguard bisect: usage: scaleguard bisect [--probe-timeout S] PY_GOOD [PY ...] PY_BAD\n"
              "                             -- perf/ -k CASE\n"
              "               or: scaleguard bisect [--probe-timeout S] --wheels DIR -- perf/ -k CASE",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    chosen: list[str] | list[bisect.Build] = args.builds
    if args.wheels is not None:
        try:
            chosen = bisect.wheel_builds(args.wheels)
        except bisect.BisectInputError as exc:
            print(f"scaleguard bisect: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    return bisect.main(chosen, pytest_args or ["perf/"], probe_timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bisect":
        # what follows `--` is the probes' pytest command line, never ours to parse
        at = argv.index("--") if "--" in argv else len(argv)
        return cmd_bisect(build_parser().parse_args(argv[:at]), argv[at + 1 :])
    args, rest = build_parser().parse_known_args(argv)
    if rest and args.command != "ab":
        build_parser().parse_args(argv)  # the usual error for unknown arguments
    handler = {"compare": cmd_compare, "ingest": cmd_ingest, "hardware-key": cmd_hardware_key,
               "history": cmd_history, "export": cmd_export}  # fmt: skip
    try:
        if args.command == "ab":
            return cmd_ab(args, rest)
        return handler[args.command](args)
    except BrokenPipeError:
        # `scaleguard history | head`: the reader has all it wanted; end quietly, as a tool that
        # SIGPIPE stopped does (stdout pointed at /dev/null so the interpreter's flush is silent)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except (UsageProblem, BaselineError, FileFormatError, HistoryError) as exc:
        print(f"scaleguard {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (OSError, ValueError, TypeError, KeyError, OverflowError, RecursionError, MemoryError) as exc:
        # the contract is exit 2 and a sentence for any input, never a traceback; an input
        # that reaches here slipped past the reader's checks, so say that too
        print(
            f"scaleguard {args.command}: cannot use the input ({type(exc).__name__}: {exc}); "
            "if the files are scaleguard's own, this is a bug: please report it",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
