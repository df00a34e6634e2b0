"""``scaleguard compare OLD NEW``: verdicts between two saved runs or baseline files.

OLD and NEW are pytest-benchmark ``--benchmark-save`` JSON files written by scaleguard, or
baseline files. Prints a table per case, optionally writes markdown and a PNG plot, and exits
1 when anything regressed (2 on bad input), so CI can gate on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from scaleguard import baseline
from scaleguard.baseline import BaselineError, CaseRecord
from scaleguard.compare import Status, Thresholds, Verdict, judge


@dataclass(frozen=True)
class Run:
    label: str
    records: dict[str, CaseRecord]


def load_run(path: Path, torch_pick: str | None = None) -> Run:
    """Records of a saved pytest-benchmark run or of a baseline file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read JSON: {exc}") from exc
    if isinstance(data, dict) and "benchmarks" in data:
        machine = data.get("machine_info", {})
        commit = (data.get("commit_info") or {}).get("id")
        records = {}
        for bench in data["benchmarks"]:
            if "case_id" in bench.get("extra_info", {}):
                record = CaseRecord.from_benchmark(bench, machine, commit)
                records[record.case_id] = record
        if not records:
            raise BaselineError(f"{path}: a pytest-benchmark file without scaleguard cases")
        return Run(f"torch {machine.get('torch_version', '?')} ({path.stem})", records)
    loaded = baseline.load(path)
    if loaded is None:
        raise BaselineError(f"{path}: no such file")
    picked = {cid: rec for cid in loaded.cases if (rec := loaded.entry(cid, torch_pick)) is not None}
    torches = sorted({r.torch for r in picked.values()})
    return Run(f"torch {', '.join(torches)} ({path.stem})", picked)


def compare_runs(old: Run, new: Run, thresholds: Thresholds) -> list[tuple[CaseRecord, Verdict]]:
    """Judge every case of NEW against OLD; world size 1 first so scaling regressions are named."""
    rows: list[tuple[CaseRecord, Verdict]] = []
    ws1: dict[str, Status] = {}
    for record in sorted(new.records.values(), key=lambda r: (r.group_id, r.world_size)):
        verdict = judge(
            record,
            old.records.get(record.case_id),
            thresholds,
            ws1_status=ws1.get(record.group_id),
            new_reason=f"not in {old.label}",
        )
        if record.world_size == 1:
            ws1[record.group_id] = verdict.status
        rows.append((record, verdict))
    return rows


def _cells(record: CaseRecord, verdict: Verdict) -> list[str]:
    old = verdict.baseline

    def eff(r: CaseRecord | None) -> str:
        return "-" if r is None or r.scaling_efficiency is None else f"{r.scaling_efficiency:.2f}"

    return [
        record.case_id,
        "-" if old is None else f"{old.summary.median_s * 1e3:.2f}",
        f"{record.summary.median_s * 1e3:.2f}",
        "-" if verdict.step_change is None else f"{verdict.step_change:+.1%}",
        "-" if old is None else f"{old.samples_per_s:,.1f}",
        f"{record.samples_per_s:,.1f}",
        eff(old),
        eff(record),
        "-" if verdict.p_value is None else f"{verdict.p_value:.1g}",
        verdict.status.value,
    ]


HEADERS = [
    "case",
    "old step ms",
    "new step ms",
    "Δ step",
    "old samples/s",
    "new samples/s",
    "old eff.",
    "new eff.",
    "p",
    "verdict",
]


def render_table(rows: list[tuple[CaseRecord, Verdict]], old: Run, new: Run) -> Table:
    table = Table(title=f"scaleguard compare: {old.label} -> {new.label}", title_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "case" else "right")
    for record, verdict in rows:
        table.add_row(*_cells(record, verdict))
    return table


def render_markdown(rows: list[tuple[CaseRecord, Verdict]], old: Run, new: Run) -> str:
    counts = {s: sum(v.status is s for _, v in rows) for s in Status}
    lines = [
        f"### scaleguard: {old.label} → {new.label}",
        "",
        ", ".join(f"**{n}** {s.value}" for s, n in counts.items() if n),
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(_cells(r, v)) + " |" for r, v in rows]
    stories = [v.story for _, v in rows if v.status not in (Status.OK,)]
    if stories:
        lines += ["", "<details><summary>details</summary>", ""]
        lines += [f"- {story}" for story in stories] + ["", "</details>"]
    return "\n".join(lines) + "\n"


def render_plot(old: Run, new: Run, path: Path) -> None:
    """Speedup vs world size per group and version (with the ideal line), and samples/s."""
    import matplotlib

    matplotlib.use("Agg")  # headless: CI runners have no display
    import matplotlib.pyplot as plt

    groups = sorted({r.group_id for r in new.records.values()})
    fig, (ax_speed, ax_rate) = plt.subplots(1, 2, figsize=(14, max(4.5, 0.3 * len(new.records) + 2)))
    max_ws = 1
    colors = plt.get_cmap("tab10")
    for run, style in ((old, "--"), (new, "-")):
        for index, group in enumerate(groups):
            points = sorted(
                (r.world_size, r.speedup if r.speedup is not None else 1.0)
                for r in run.records.values()
                if r.group_id == group
            )
            if len(points) > 1:
                xs, ys = zip(*points, strict=True)
                max_ws = max(max_ws, *xs)
                # one colour per group; dashed = OLD, solid = NEW
                ax_speed.plot(
                    xs, ys, style, marker="o", color=colors(index % 10), label=group if run is new else None
                )
    ax_speed.plot([1, max_ws], [1, max_ws], ":", color="grey", label="ideal")
    ax_speed.set_xlabel("world size")
    ax_speed.set_ylabel("speedup over world size 1")
    ax_speed.set_title(f"scaling (dashed: {old.label}; solid: {new.label})", fontsize=9)
    ax_speed.legend(fontsize=6)
    cases = sorted(new.records)
    rows_y = list(range(len(cases)))
    old_rates = [old.records[c].samples_per_s if c in old.records else 0.0 for c in cases]
    ax_rate.barh([y + 0.2 for y in rows_y], old_rates, height=0.4, label=old.label)
    ax_rate.barh(
        [y - 0.2 for y in rows_y], [new.records[c].samples_per_s for c in cases], height=0.4, label=new.label
    )
    ax_rate.set_yticks(rows_y, cases, fontsize=6)
    ax_rate.set_xlabel("samples/s")
    ax_rate.set_title("throughput per case")
    ax_rate.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ingest(
    files: list[Path], baselines_dir: Path, hardware_key: str | None, torch_pick: str | None, update: bool
) -> int:
    """Judge case records written under torchrun against the baselines, like the suite does."""
    import tempfile

    from scaleguard import report
    from scaleguard.records import CaseResult
    from scaleguard.runner import BaselineContext, PerfRunner

    results = []
    for path in files:
        try:
            results.append(CaseResult.from_dict(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise BaselineError(f"{path}: not a scaleguard case record: {exc}") from exc
    results.sort(key=lambda r: (r.spec.group_id, r.spec.world_size))
    first = results[0]
    if hardware_key is None:
        # a torchrun job's hardware is its whole world: nodes x GPUs
        hardware_key = baseline.hardware_key(
            first.spec.device,
            first.device_name,
            max(r.spec.world_size for r in results),
            first.device_name,
            int(first.settings["threads_per_rank"]),
        )
    path = baselines_dir / f"{hardware_key}.json"
    ctx = BaselineContext(
        path=path,
        file=baseline.load(path),
        hardware_key=hardware_key,
        hardware={"device": first.spec.device, "gpu_name": first.device_name, "source": "torchrun"},
        torch_pick=torch_pick,
        thresholds=Thresholds.for_device(first.spec.device),
    )
    with tempfile.TemporaryDirectory() as scratch:
        runner = PerfRunner(Path(scratch), timeout_s=0, baselines=ctx)
        for result in results:
            result = result.with_reference(runner.reference_for(result.spec))
            runner.results[result.spec.case_id] = result
            runner.judge(result)
        console = Console(width=160)
        for table in report.scaling_tables(runner.results.values(), runner.verdicts):
            console.print(table)
        for verdict in runner.verdicts.values():
            if verdict.status is not Status.OK:
                console.print(verdict.story, markup=False, highlight=False)
        if update:
            outcome = runner.update_baselines()
            if outcome is not None:
                written_to, written, left_out = outcome
                console.print(
                    f"baseline {written_to}: {len(written)} cases recorded"
                    + (f"; left out: {', '.join(left_out)}" if left_out else ""),
                    markup=False,
                    highlight=False,
                )
    return 1 if any(v.failed for v in runner.verdicts.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scaleguard")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="verdicts between two saved runs or baseline files")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    cmp.add_argument("--markdown", type=Path, help="write a markdown report here")
    cmp.add_argument("--plot", type=Path, help="write a PNG plot here")
    cmp.add_argument("--old-torch", help="for a baseline file: which torch version's entries")
    cmp.add_argument("--new-torch", help="for a baseline file: which torch version's entries")
    for name in ("step", "efficiency", "memory"):
        cmp.add_argument(
            f"--threshold-{name}",
            type=float,
            help="default: the suite's default for the runs' device (see README)",
        )
    ing = sub.add_parser("ingest", help="judge (and record) case records written under torchrun")
    ing.add_argument("files", nargs="+", type=Path, help="*.case.json from scaleguard.torchrun_entry")
    ing.add_argument("--baselines", type=Path, default=Path("baselines"))
    ing.add_argument("--hardware-key", help="default: cuda-<gpu>-x<largest world size> / cpu-<cpu>-<n>t")
    ing.add_argument("--baseline-torch", help="compare with this torch version's entries")
    ing.add_argument("--update-baselines", action="store_true")
    ing.add_argument("--threshold-step", type=float, help="default: the suite's for the device")
    args = parser.parse_args(argv)
    if args.command == "ingest":
        try:
            return ingest(
                args.files, args.baselines, args.hardware_key, args.baseline_torch, args.update_baselines
            )
        except BaselineError as exc:
            print(f"scaleguard ingest: {exc}", file=sys.stderr)
            return 2
    try:
        old = load_run(args.old, args.old_torch)
        new = load_run(args.new, args.new_torch)
    except BaselineError as exc:
        print(f"scaleguard compare: {exc}", file=sys.stderr)
        return 2
    devices = {r.config.get("device") for r in new.records.values()}
    thresholds = Thresholds.for_device("cpu" if devices == {"cpu"} else "cuda")
    overrides = {name: getattr(args, f"threshold_{name}") for name in ("step", "efficiency", "memory")}
    thresholds = replace(thresholds, **{k: v for k, v in overrides.items() if v is not None})
    rows = compare_runs(old, new, thresholds)
    console = Console(width=160)
    console.print(render_table(rows, old, new))
    for _, verdict in rows:
        if verdict.status is not Status.OK:
            console.print(verdict.story, markup=False, highlight=False)
    if args.markdown:
        args.markdown.write_text(render_markdown(rows, old, new), encoding="utf-8")
    if args.plot:
        render_plot(old, new, args.plot)
    return 1 if any(v.failed for _, v in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
