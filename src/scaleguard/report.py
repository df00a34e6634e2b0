"""Human-readable output: the scaling table per model/mode/precision/scaling."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping

from rich.console import Console
from rich.table import Table

from scaleguard.compare import Verdict
from scaleguard.records import CaseResult


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def fmt_ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_bytes(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def scaling_tables(
    results: Iterable[CaseResult], verdicts: Mapping[str, Verdict] | None = None
) -> list[Table]:
    verdicts = verdicts or {}
    groups: dict[str, list[CaseResult]] = {}
    for result in results:
        groups.setdefault(result.spec.group_id, []).append(result)
    tables = []
    for group_id, members in sorted(groups.items()):
        members.sort(key=lambda r: r.spec.world_size)
        first = members[0].spec
        table = Table(
            title=f"{group_id}  ({first.device}, profile {first.profile}, {members[0].device_name})",
            title_justify="left",
        )
        for column in (
            "ws",
            "global batch",
            "step ms (median ± IQR)",
            "samples/s",
            "speedup",
            "efficiency",
            "peak mem/rank",
        ):
            table.add_column(column, justify="right")
        notes = []
        for r in members:
            s = r.summary
            table.add_row(
                str(r.spec.world_size),
                str(r.spec.global_batch),
                f"{fmt_ms(s.median_s)} ± {fmt_ms(s.iqr_s)}" + (" (noisy)" if s.is_noisy else ""),
                f"{r.samples_per_s:,.1f}",
                fmt_ratio(r.speedup),
                fmt_ratio(r.scaling_efficiency),
                fmt_bytes(max(r.peak_mem_bytes)),
            )
            notes += [f"ws{r.spec.world_size}: {note}" for note in r.notes]
        if notes:
            table.caption = "\n".join(notes)
            table.caption_justify = "left"
        tables.append(table)
    return tables


def verdict_cells(verdict: Verdict | None) -> list[str]:
    if verdict is None:
        return ["-", "-", "-", "-"]
    base = verdict.baseline
    if base is None:
        return ["-", "-", "-", verdict.status.value]
    change = "-" if verdict.step_change is None else f"{verdict.step_change:+.1%}"
    return [fmt_ms(base.summary.median_s), change, fmt_ratio(base.scaling_efficiency), verdict.status.value]


def render(tables: list[Table], width: int = 120) -> str:
    """Render rich tables to plain text for pytest's terminal reporter."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=False, color_system=None)
    for table in tables:
        console.print(table)
    return buffer.getvalue()
