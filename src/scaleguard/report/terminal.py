"""Everything rendered for people: the session's scaling tables, the baseline-update lines, and
``scaleguard compare``'s table, markdown and plot."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from scaleguard.case import CaseSpec
from scaleguard.evidence import anatomy, metrics, stragglers
from scaleguard.evidence.files import inert
from scaleguard.evidence.runs import CaseEvidence
from scaleguard.evidence.verdict import Status, Verdict

if TYPE_CHECKING:
    from scaleguard.evidence.ledger import BaselineUpdate, Ledger

Rows = Sequence[tuple[CaseEvidence, Verdict]]


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def fmt_ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_bytes(count: float) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def fmt_spread(evidence: CaseEvidence) -> str:
    spread = evidence.run_spread()
    return "-" if spread is None else f"{spread:.1%}"


# the scaling table's columns; every header fits a CI log's 80-100 columns uncut
COLUMNS = (
    "ws", "batch", "runs", "step ms", "vs base", "can call", "spread", "IQR", "samples/s", "speedup",
    "eff", "proj", "mem/rank", "verdict",
)  # fmt: skip
WRAPPING = ("runs", "vs base", "can call")
LEGEND = (
    "vs base: this session's median step against the baseline's (signed; for ws>1 also the "
    "efficiency's change in points); can call: the smallest change this comparison could call "
    "(its threshold, or k x the run-to-run spread where that is larger; * the spread assumed: "
    "a young baseline); spread: between runs; "
    "IQR: within the noisiest run; eff: scaling efficiency; proj: the efficiency projected from ws1's "
    "compute and this world size's measured collectives (DDP's all-reduce, FSDP's gathers and scatters)"
)


def fmt_movement(verdict: Verdict | None) -> tuple[str, str]:
    """The "vs base" and "can call" cells: how far the case moved and the smallest change its
    comparison could have called (OK rows included), from ``Verdict.movement`` as the JSON."""
    figures = verdict.movement() if verdict is not None else None
    if figures is None:
        return "-", "-"
    moved = f"{figures['step_change']:+.1%}"
    needed = figures["step_needed"]
    can = "-" if needed is None else f"{needed:.1%}"
    eff, eff_needed = figures["efficiency_change"], figures["efficiency_needed"]
    if isinstance(eff, float):
        moved += f" {eff * 100:+.1f}pt"
        if isinstance(eff_needed, float):
            can += f" {eff_needed * 100:.1f}pt"
    if figures["step_spread_assumed"]:
        can += "*"  # the baseline is young: the spread behind it was assumed (the story says)
    return moved, can


def throughput_note(spec: CaseSpec, rates: dict[str, Any]) -> str | None:
    if not rates["tflops_per_gpu"]:
        return None
    parts = []
    if rates["tokens_per_s_per_gpu"]:
        parts.append(f"{rates['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU")
    tflops = rates["tflops_per_gpu"]
    unit = "GPU" if spec.device == "cuda" else "process"
    rate = f"{tflops:.1f} TFLOPS" if tflops >= 1 else f"{tflops * 1000:.1f} GFLOPS"
    parts.append(f"{rate}/{unit} ({rates['flops_source']})")
    if rates["mfu"] is not None:
        peak = f"{rates['peak_tflops']:g} TFLOPS ({spec.precision} dense peak)"
        parts.append(f"MFU {rates['mfu']:.1%} of {peak}")
    elif spec.device == "cuda":
        parts.append("MFU not shown: peak of this device unknown (--perf-peak-tflops sets it)")
    return f"ws{spec.world_size}: " + ", ".join(parts)


def scaling_tables(ledger: Ledger, peak_override: float | None = None) -> list[Table]:
    """Per model/mode/precision/scaling: one row per world size, from this session's runs."""
    groups: dict[str, list[str]] = {}
    for case_id, spec in ledger.specs.items():
        groups.setdefault(spec.group_id, []).append(case_id)
    tables = []
    for group_id, case_ids in sorted(groups.items()):
        case_ids.sort(key=lambda cid: ledger.specs[cid].world_size)
        first = ledger.specs[case_ids[0]]
        device_name = ledger.records[case_ids[0]][-1].device_name
        table = Table(
            # a device name comes from a record (ingest): inert, as every stored text printed
            title=inert(f"{group_id}  ({first.device}, profile {first.profile}, {device_name})"),
            title_justify="left",
        )
        for column in COLUMNS:
            # headers are short on purpose (legend under the table) and never narrower than their
            # longest word: a cut header ("effic…") says nothing. Figures never break; the cells
            # made of words ("3 (1 aside)", "+1.6% -2.0pt") wrap at their spaces
            table.add_column(
                column, justify="right", min_width=max(len(word) for word in column.split()),
                no_wrap=column not in WRAPPING, overflow="fold",
            )  # fmt: skip
        notes = []
        for case_id in case_ids:
            spec = ledger.specs[case_id]
            evidence = ledger.evidence(case_id)
            runs = evidence.evidence or evidence.runs
            effs = evidence.efficiencies()
            speedups = [r.speedup for r in runs if r.speedup is not None]
            verdict = ledger.verdicts.get(case_id)
            moved, callable_ = fmt_movement(verdict)
            projected = ledger.projection(case_id)
            table.add_row(
                str(spec.world_size),
                str(spec.global_batch),
                str(len(evidence.runs)) + (f" ({len(evidence.runs) - len(evidence.evidence)} aside)"
                                           if len(evidence.evidence) < len(evidence.runs) else ""),
                fmt_ms(evidence.median_s()),
                moved,
                callable_,
                fmt_spread(evidence),
                f"{max(r.summary.rel_iqr for r in runs):.1%}",
                f"{evidence.samples_per_s():,.1f}",
                fmt_ratio(sum(speedups) / len(speedups) if speedups else None),
                fmt_ratio(sum(effs) / len(effs) if effs else None),
                fmt_ratio(projected.efficiency if projected else None),
                fmt_bytes(max(r.peak_mem_bytes for r in evidence.runs)),
                verdict.status.value if verdict else "-",
            )  # fmt: skip
            for run in evidence.runs:
                notes += [f"ws{spec.world_size}: {note}" for note in run.notes]
            notes += collective_notes(spec, evidence)
            notes += bandwidth_bound_notes(ledger, spec, evidence)
            if projected is not None:
                notes.append(projected.describe(evidence.efficiency()))
            elif (withheld := ledger.projection_withheld(case_id)) is not None:
                notes.append(f"ws{spec.world_size}: {withheld}")
            note = throughput_note(spec, metrics.throughput(spec, evidence, device_name, peak_override))
            notes += [note] if note else []
            anatomies = [r.anatomy for r in runs if r.anatomy]
            if anatomies:
                notes.append(f"ws{spec.world_size} step anatomy (last run): {anatomy.summary(anatomies[-1])}")
            slow = stragglers.find(runs) if spec.world_size > 1 else None
            if slow is not None:
                notes.append(f"ws{spec.world_size} {slow.describe()}")
        notes.append(LEGEND)
        if notes:
            # notes carry text from records (a run's notes, a host name): each one inert
            table.caption = "\n".join(inert(note) for note in dict.fromkeys(notes))
            table.caption_justify = "left"
        tables.append(table)
    return tables


def collective_notes(spec: CaseSpec, evidence: CaseEvidence) -> list[str]:
    """For an all-reduce case: the bandwidth its median step means (nccl-tests' busbw)."""
    figures = metrics.collective_bandwidth(spec, evidence)
    if figures is None:
        return []
    message_bytes, algbw, busbw = figures
    return [
        f"ws{spec.world_size}: {fmt_bytes(message_bytes)} all-reduce: algbw {algbw / 1e9:.2f} GB/s, "
        f"busbw {busbw / 1e9:.2f} GB/s (busbw = algbw x 2(n-1)/n, as nccl-tests)"
    ]


def bandwidth_bound_notes(ledger: Ledger, spec: CaseSpec, evidence: CaseEvidence) -> list[str]:
    """For a DDP case at world size > 1: the efficiency its gradients allow without overlap at
    the bus bandwidth this session's all-reduce case measured, beside the measured efficiency."""
    bound = metrics.bandwidth_bound(ledger, spec, evidence)
    if bound is None:
        return []
    return [
        f"ws{spec.world_size}: efficiency {bound.efficiency:.2f}; {fmt_bytes(bound.grad_bytes)} of gradients "
        f"at {bound.reference_model}'s busbw {bound.busbw / 1e9:.2f} GB/s take {bound.comm_s * 1e3:.1f} "
        f"ms/step: {bound.bound:.2f} if none of it overlapped"
    ]


def render(tables: Sequence[Table], width: int = 120, *, fit: bool = False) -> str:
    """Render rich tables to plain text for pytest's terminal reporter.

    A table is never cropped: below its minimum width it is printed at that minimum (a
    terminal then wraps the lines; nothing is lost). ``fit``: for a log rather than a terminal
    (CI), each table is printed at its natural width (up to ``MAX_LOG_WIDTH``), so no cell is
    wrapped: a log has no right edge.
    """
    buffer = io.StringIO()
    # markup off: case ids and versions come from files and may hold "[/]"
    console = Console(file=buffer, width=width, force_terminal=False, color_system=None, markup=False)
    wide = console.options.update_width(MAX_LOG_WIDTH)
    for table in tables:
        need = console.measure(table, options=wide)
        console.width = max(width, min(need.maximum if fit else need.minimum, MAX_LOG_WIDTH))
        console.print(table)
    return buffer.getvalue()


MAX_LOG_WIDTH = 200


def time_lines(ledger: Ledger, suite_wall_s: float) -> list[str]:
    """Where the suite's time went: wall time, the measured fraction, the slowest phases."""
    runs = [r for records in ledger.records.values() for r in records]
    if not runs:
        return []
    totals: dict[str, float] = {}
    for run in runs:
        for phase, seconds in run.phases_s.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    measured = totals.get("measured steps", 0.0)
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:4]
    return [
        f"scaleguard: {suite_wall_s:.0f} s for {len(ledger.records)} cases ({len(runs)} runs); "
        f"measured steps {measured:.0f} s ({measured / max(suite_wall_s, 1e-9):.0%}); most time: "
        + ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in top)
    ]


def verdict_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """Stories of the cases that are not OK; NEW cases that share a reason (no entry, a
    configuration field that differs) are said once, with what records them."""
    lines = []
    new: dict[str, list[str]] = {}
    for verdict in verdicts:
        if verdict.status is Status.NEW:
            reason = verdict.story.split(" NEW: ", 1)[-1].replace(verdict.case_id, "<case>")
            new.setdefault(reason, []).append(verdict.case_id)
        elif verdict.status is not Status.OK:
            lines.append(verdict.story)
    # one line per probe the cases were judged by (one core for GPU cases, all cores for CPU)
    moved: dict[bool, list[Verdict]] = {}
    for v in verdicts:
        if v.machine_moved and v.machine is not None and v.step is not None:
            moved.setdefault(v.machine.all_cores, []).append(v)
    for group in moved.values():
        changes = sorted(v.step.change for v in group if v.step is not None)
        machine = group[0].machine
        assert machine is not None
        lines.append(
            f"scaleguard: {machine.describe()}; {len(group)} case{'s' if len(group) != 1 else ''} moved "
            f"{changes[0]:+.0%} to {changes[-1]:+.0%} with it (a host-bound step may move up to "
            f"{machine.reach - 1:+.0%}): not judged changes of the workload"
        )
    for reason, cases in new.items():
        if len(cases) == 1:
            lines.append(f"{cases[0]} NEW: {reason.replace('<case>', cases[0])}")
            continue
        shown = ", ".join(cases[:4]) + (f" and {len(cases) - 4} more" if len(cases) > 4 else "")
        lines.append(f"{len(cases)} cases NEW: {reason}; --perf-update-baselines records them ({shown})")
    return lines


def disturbance_lines(ledger: Ledger) -> list[str]:
    """Cases with runs set aside because the machine was busy, and who kept it busy."""
    lines: list[str] = []
    load: dict[tuple[int, str], float] = {}
    for case_id, runs in ledger.records.items():
        bad = [r for r in runs if r.disturbed]
        if bad:
            lines.append(
                f"scaleguard: disturbed: {case_id}: {len(bad)} of {len(runs)} runs: {bad[0].quarantine}"
            )
        for run in runs:
            for entry in run.host.get("top", ()):
                if float(entry["cores"]) >= 0.01:
                    key = (int(entry["pid"]), str(entry["name"]))
                    load[key] = max(load.get(key, 0.0), float(entry["cores"]))
    if lines and load:
        top = sorted(load.items(), key=lambda kv: -kv[1])[:5]
        lines.append(
            "scaleguard: busiest foreign processes: "
            + ", ".join(f"{name} (pid {pid}) {cores:.2f} cores" for (pid, name), cores in top)
        )
    return lines


def baseline_update_lines(update: BaselineUpdate) -> list[str]:
    """What a baseline update wrote, left out or refused."""
    if update.refused == "interrupted":
        return ["scaleguard: interrupted: baselines not updated"]
    if update.refused is not None:
        return [f"scaleguard: baselines not updated: {update.refused}"]
    lines = [f"scaleguard: baseline {update.path}: {len(update.written)} cases recorded"]
    lines += [
        f"scaleguard:   {cid}: entry restarted at this session's level" for cid in sorted(update.restarted)
    ]
    lines += [f"scaleguard:   not recorded: {cid}: {why}" for cid, why in update.left_out]
    return lines


HEADERS = [
    "case",
    "old step ms",
    "new step ms",
    "Δ step",
    "95% CI",
    "runs old/new",
    "spread",
    "old eff.",
    "new eff.",
    "p",
    "verdict",
]


def compare_cells(new: CaseEvidence, verdict: Verdict) -> list[str]:
    old = verdict.baseline
    step = verdict.step
    return [
        new.case_id,
        "-" if old is None else fmt_ms(old.median_s()),
        fmt_ms(new.median_s()),
        "-" if step is None else f"{step.change:+.1%}",
        "-" if step is None else f"[{step.ci[0]:+.1%}, {step.ci[1]:+.1%}]",
        f"{'-' if old is None else len(old.evidence)}/{len(new.evidence)}",
        "-" if step is None else f"{step.spread:.1%}" + ("*" if step.spread_assumed else ""),
        fmt_ratio(None if old is None else old.efficiency()),
        fmt_ratio(new.efficiency()),
        "-" if verdict.p_value is None else f"{verdict.p_value:.1g}",
        verdict.status.value,
    ]


def compare_table(rows: Rows, old_label: str, new_label: str) -> Table:
    table = Table(title=f"scaleguard compare: {inert(old_label)} -> {inert(new_label)}", title_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "case" else "right")
    for new, verdict in rows:
        table.add_row(*map(inert, compare_cells(new, verdict)))
    table.caption = "spread: run-to-run spread used; * assumed (young baseline)"
    table.caption_justify = "left"
    return table


def md_cell(text: str) -> str:
    """Text from files inside a markdown table row: one line, no column breaks, no HTML."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def plot_text(text: str) -> str:
    """Text for matplotlib, whose '$' starts math mode (an unbalanced one raises)."""
    return str(text).replace("$", r"\$")


def compare_markdown(rows: Rows, old_label: str, new_label: str) -> str:
    counts = {s: sum(v.status is s for _, v in rows) for s in Status}
    lines = [
        f"### scaleguard: {md_cell(old_label)} → {md_cell(new_label)}",
        "",
        ", ".join(f"**{n}** {s.value}" for s, n in counts.items() if n),
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(map(md_cell, compare_cells(n, v))) + " |" for n, v in rows]
    lines += ["", "spread: run-to-run spread used; * assumed (young baseline)"]
    stories = [v.story for _, v in rows if v.status is not Status.OK]
    if stories:
        lines += ["", "<details><summary>details</summary>", ""]
        lines += [f"- {md_cell(story)}" for story in stories] + ["", "</details>"]
    return "\n".join(lines) + "\n"


def compare_plot(
    old: dict[str, CaseEvidence], new: dict[str, CaseEvidence], old_label: str, new_label: str, path: Path
) -> None:
    """Speedup vs world size per group (dashed OLD, solid NEW, with the ideal line), and
    samples/s per case with each run as a dot."""
    import matplotlib

    matplotlib.use("Agg")  # headless: CI runners have no display
    import matplotlib.pyplot as plt

    groups = sorted({e.group_id for e in new.values()})
    fig, (ax_speed, ax_rate) = plt.subplots(1, 2, figsize=(14, max(4.5, 0.3 * len(new) + 2)))
    max_ws = 1
    colors = plt.get_cmap("tab10")
    for run, style in ((old, "--"), (new, "-")):
        for index, group in enumerate(groups):
            points = sorted(
                (e.world_size, (e.efficiency() or 1.0) * e.world_size)
                for e in run.values()
                if e.group_id == group
            )
            if len(points) > 1:
                xs, ys = zip(*points, strict=True)
                max_ws = max(max_ws, *xs)
                ax_speed.plot(
                    xs,
                    ys,
                    style,
                    marker="o",
                    color=colors(index % 10),
                    label=plot_text(group) if run is new else None,
                )
    ax_speed.plot([1, max_ws], [1, max_ws], ":", color="grey", label="ideal")
    ax_speed.set_xlabel("world size")
    ax_speed.set_ylabel("speedup over world size 1")
    ax_speed.set_title(plot_text(f"scaling (dashed: {old_label}; solid: {new_label})"), fontsize=9)
    ax_speed.legend(fontsize=6)
    cases = sorted(new)
    rows_y = list(range(len(cases)))
    for offset, run, label in ((0.2, old, old_label), (-0.2, new, new_label)):
        rates = [run[c].samples_per_s() if c in run else 0.0 for c in cases]
        ax_rate.barh([y + offset for y in rows_y], rates, height=0.4, label=plot_text(label))
        for y, case in zip(rows_y, cases, strict=True):
            if case in run:
                batch = run[case].config.get("global_batch") or 0
                dots = [batch / r.median_s for r in run[case].evidence] if batch else []
                ax_rate.plot(dots, [y + offset] * len(dots), "k.", markersize=3)
    ax_rate.set_yticks(rows_y, [plot_text(c) for c in cases], fontsize=6)
    ax_rate.set_xlabel("samples/s (dots: single runs)")
    ax_rate.set_title("throughput per case")
    ax_rate.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


AB_HEADERS = ["case", "A step ms", "B step ms", "B/A", "95% CI", "step", "eff. A -> B", "eff.",
              "mem. B/A", "mem.", "pairs (AB/BA)", "pair spread", "p", "verdict"]  # fmt: skip


def ab_rows(session: Any) -> list[list[str]]:
    """One row per case: each metric's change and its own verdict, then the case's."""
    rows = []
    for case_id, verdict in sorted(session.verdicts.items()):
        step = verdict.step
        if step is None:  # NOISY: no pair kept, nothing to show but the verdict
            rows.append([case_id, *["-"] * 12, verdict.status])
            continue
        a = session.ledgers["A"].evidence(case_id)
        b = session.ledgers["B"].evidence(case_id)
        p = step.p_up if step.change >= 0 else step.p_down
        metrics = verdict.metrics
        mem = verdict.memory
        rows.append(
            [
                case_id,
                fmt_ms(a.median_s()),
                fmt_ms(b.median_s()),
                f"{step.change:+.1%}",
                f"[{step.ci[0]:+.1%}, {step.ci[1]:+.1%}]",
                metrics.get("step", "-"),
                f"{fmt_ratio(a.efficiency())} -> {fmt_ratio(b.efficiency())}"
                if "efficiency" in metrics
                else "-",
                metrics.get("efficiency", "-"),
                f"{mem.change:+.1%}" if mem is not None else "-",
                metrics.get("memory", "-"),
                f"{step.n} ({verdict.orders.count('AB')}/{verdict.orders.count('BA')})",
                f"{step.spread:.1%}",
                f"{p:.1g}",
                verdict.status,
            ]
        )
    return rows


def ab_header(session: Any) -> str:
    def side(s: Any) -> str:
        runtime = {}
        ledger = session.ledgers[s.label]
        if ledger.records:
            runtime = next(iter(ledger.records.values()))[-1].runtime
        versions = ", ".join(
            f"{k} {runtime.get(k)}" for k in ("torch", "cuda", "cudnn", "nccl") if runtime.get(k)
        )
        return f"{s.label}: {s.interpreter.python} ({versions or 'torch ' + str(s.versions.get('torch'))})"

    return f"scaleguard A/B  {side(session.a)}  vs  {side(session.b)}"


def ab_table(session: Any) -> Table:
    table = Table(title=ab_header(session), title_justify="left")
    for header in AB_HEADERS:
        table.add_column(header, justify="left" if header == "case" else "right")
    for row in ab_rows(session):
        table.add_row(*row)
    return table


def ab_markdown(session: Any) -> str:
    rows = ab_rows(session)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[-1]] = counts.get(row[-1], 0) + 1
    lines = [
        f"### {md_cell(ab_header(session))}",
        "",
        ", ".join(f"**{n}** {s}" for s, n in sorted(counts.items())),
        "",
    ]
    lines += ["| " + " | ".join(AB_HEADERS) + " |", "|" + "---|" * len(AB_HEADERS)]
    lines += ["| " + " | ".join(map(md_cell, r)) + " |" for r in rows]
    stories = [v.story for v in session.verdicts.values() if v.status is not Status.SAME or v.dropped]
    if stories:
        lines += ["", "<details><summary>details</summary>", ""] + [f"- {md_cell(s)}" for s in stories]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def ab_plot(session: Any, path: Path) -> None:
    """B/A step-time ratio per case with its 95 % CI and each pair as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted(c for c, v in session.verdicts.items() if v.step is not None)
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.45 * len(cases) + 1.5)))
    colors = {
        Status.REGRESSED: "tab:red",
        Status.IMPROVED: "tab:green",
        Status.SAME: "tab:blue",
        Status.INCONCLUSIVE: "tab:grey",
    }
    for y, case_id in enumerate(cases):
        verdict = session.verdicts[case_id]
        a = session.ledgers["A"].evidence(case_id).runs
        b = session.ledgers["B"].evidence(case_id).runs
        ratios = [rb.median_s / ra.median_s - 1 for ra, rb in zip(a, b, strict=False)]
        ax.plot([100 * r for r in ratios], [y] * len(ratios), "k.", markersize=4, alpha=0.6)
        assert verdict.step is not None
        low, high = verdict.step.ci
        mid = verdict.step.change
        ax.errorbar(
            100 * mid, y, xerr=[[100 * (mid - low)], [100 * (high - mid)]],
            fmt="o", color=colors.get(verdict.status, "black"), capsize=3,
        )  # fmt: skip
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(cases)), [plot_text(c) for c in cases], fontsize=7)
    ax.set_xlabel("B vs A step time, % (dots: single pairs; bars: 95 % CI)")
    ax.set_title(plot_text(ab_header(session)), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_line(speed: Any, baseline_file: Any) -> str:
    """This session's probe beside the baseline runs' (issue 21: a faster or slower machine of
    the same hardware key moves every case with it; the verdict allows for it)."""
    if speed is None:
        return "machine probe: could not run (no figure for this session)"
    runs = []
    if baseline_file is not None:
        runs = [
            run.machine
            for by_torch in baseline_file.cases.values()
            for entry in by_torch.values()
            for run in entry.runs
            if run.machine.get("score")
        ]
    if not runs:
        return f"{speed.describe()}; the baseline's runs carry no probe"
    import statistics

    median = statistics.median(float(m["score"]) for m in runs)
    text = (
        f"{speed.describe()}; the baseline's runs: median {median:.3f} over {len(runs)} runs "
        f"(this machine {speed.score / median - 1:+.0%}"
    )
    for key, label, here in (
        ("python_ops_per_s", "one core", speed.python_ops_per_s),
        ("parallel_ops_per_s", "all cores", speed.parallel_ops_per_s),
    ):
        theirs = [float(m[key]) for m in runs if isinstance(m.get(key), (int, float)) and m[key] > 0]
        if theirs and here > 0:
            text += f"; {label} {here / statistics.median(theirs) - 1:+.0%}"
    return text + ")"
