"""``scaleguard history --html FILE``: one self-contained page of the history (no network: plotly's
script and every style inline).

Per case: step time over time (each run a point coloured by torch version, the nightly median a
line, change points marked with their magnitude and builds); per group: scaling efficiency per
world size over time and the scaling curve (speedup over world size) per torch version. Open
regressions (change points whose newer level is slower and still current) are listed first.
Filters by model, mode, precision and world size show and hide cases.

Plotly, because it is made for interactive pages from Python (hover, zoom, legends) and embeds
as one script with no server; bokeh would do as well, altair needs a vega runtime fetched or
vendored separately.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scaleguard.evidence.verdict import ThresholdSettings
from scaleguard.history import database as history

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
.case { border-top: 2px solid #ddd; margin-top: 1.2em; padding-top: 0.5em; }
.filters select { margin-right: 1em; }
.regressed { color: #b00; font-weight: bold; }
"""

_FILTER_SCRIPT = """
function applyFilters() {
  const picks = {};
  document.querySelectorAll('.filters select').forEach(s => { picks[s.name] = s.value; });
  document.querySelectorAll('.case').forEach(div => {
    const show = Object.entries(picks).every(([k, v]) => v === '' || div.dataset[k] === v);
    div.style.display = show ? '' : 'none';
  });
}
document.querySelectorAll('.filters select').forEach(s => s.addEventListener('change', applyFilters));
"""


def _t(text: object) -> str:
    """A stored value as plotly text: plotly renders a subset of HTML in titles, legends, hover
    and tick labels (links, styles that fetch), so every value from the history is escaped and
    stripped of control characters: shown as text, never turned into an element."""
    value = str(text)
    if not value.isprintable():  # a check at C speed: a page of 500,000 nights calls this per night
        value = "".join(ch if ch.isprintable() else "\ufffd" for ch in value)
    return html.escape(value, quote=True)


def _texts(values: Sequence[object]) -> list[str]:
    """``_t`` of a whole column: one escape over the joined column where every value is
    printable (a printable value cannot hold the separator), each value alone otherwise."""
    texts = [str(v) for v in values]
    if all(map(str.isprintable, texts)):
        return html.escape("\x1f".join(texts), quote=True).split("\x1f") if texts else []
    return [_t(v) for v in texts]


def _parts(case_id: str) -> dict[str, str]:
    """model, mode, world size, precision from an id like resnet50-ddp-ws2-bf16-strong."""
    tokens = case_id.split("-")
    out = {"model": tokens[0] if tokens else "", "mode": "", "ws": "", "precision": ""}
    if len(tokens) >= 4:
        out.update(mode=tokens[1], ws=tokens[2].removeprefix("ws"), precision=tokens[3])
    return out


def render(
    rows: Sequence[history.HistoryRow],
    title: str = "scaleguard history",
    settings: ThresholdSettings | None = None,
    series: Sequence[history.CaseSeries] | None = None,
) -> str:
    """The page's HTML for ``rows`` (any hardware keys and cases); ``series``: their nights and
    change points when the caller has them already (``history.analyse``)."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    sections: list[str] = []
    open_regressions: list[str] = []
    options: dict[str, set[str]] = {"model": set(), "mode": set(), "precision": set(), "ws": set()}
    for one in history.analyse(rows, settings) if series is None else series:
        key, case_id, case_rows, nights, points = (
            one.hardware_key,
            one.case_id,
            one.rows,
            one.nights,
            one.points,
        )
        parts = _parts(case_id)
        for name in options:
            options[name].add(parts[name])
        # the step figure as plotly's JSON, not as a go.Figure: the figure object checks and
        # deep-copies every value (0.75 s for 50 cases of 10,000 nights on the 2-core VM) and
        # makes nothing safer; the values here are numbers and escaped text (``_t``)
        traces: list[dict[str, object]] = []
        for torch in sorted({r.torch or "unknown" for r in case_rows}):
            runs = [r for r in case_rows if (r.torch or "unknown") == torch and r.quarantine is None]
            traces.append({
                "type": "scatter", "mode": "markers", "name": _t(f"torch {torch}"),
                "x": _texts([r.recorded_at for r in runs]), "y": [r.median_s * 1e3 for r in runs],
                "text": _texts([f"{r.session} {r.torch_git or ''}" for r in runs]),
            })  # fmt: skip
        times, values = history.columns_of(nights)
        traces.append({
            "type": "scatter", "mode": "lines", "name": "nightly median",
            "line": {"color": "black", "width": 1},
            "x": _texts(times), "y": np.asarray(values) * 1e3,
        })  # fmt: skip
        shapes, notes = [], []
        for point in points:
            assert point.after is not None and point.before is not None
            label = f"{point.change:+.1%}: torch {point.before.torch} -> {point.after.torch}"
            at = _t(point.after.recorded_at)
            shapes.append({"type": "line", "x0": at, "x1": at, "xref": "x", "y0": 0, "y1": 1,
                           "yref": "y domain", "line": {"dash": "dash", "color": "red"}})  # fmt: skip
            notes.append({"x": at, "y": 1.0, "yref": "paper", "text": _t(label), "showarrow": False,
                          "font": {"color": "red"}})  # fmt: skip
            if point is points[-1] and point.change > 0:
                builds = f"torch {point.before.torch} -> {point.after.torch}"
                cells = [case_id, key, f"{point.change:+.1%}", point.after.recorded_at[:19], builds]
                open_regressions.append("<tr>" + "".join(f"<td>{_t(c)}</td>" for c in cells) + "</tr>")
        layout = {
            "title": {"text": _t(f"{case_id} ({key}): step time, ms")}, "height": 320,
            "margin": {"t": 40, "b": 30}, "xaxis": {"title": {"text": "recorded"}},
            "yaxis": {"title": {"text": "ms per step"}}, "shapes": shapes, "annotations": notes,
        }  # fmt: skip
        step_figure = pio.to_html(
            {"data": traces, "layout": layout}, full_html=False, include_plotlyjs=False, validate=False
        )
        efficiency = [r for r in case_rows if r.efficiency is not None and r.quarantine is None]
        extra = ""
        if efficiency:
            xs, ys = [_t(r.recorded_at) for r in efficiency], [r.efficiency for r in efficiency]
            eff = go.Figure(go.Scatter(x=xs, y=ys, mode="markers+lines", name="efficiency"))
            projected = [r for r in efficiency if r.projected is not None]
            if projected:  # what the session's ws1 run said this world size should do
                eff.add_trace(go.Scatter(
                    x=[_t(r.recorded_at) for r in projected], y=[r.projected for r in projected],
                    mode="lines", line={"dash": "dot"}, name="projected from ws1",
                ))  # fmt: skip
            eff.update_layout(
                title=_t(f"{case_id}: scaling efficiency"), height=240, margin={"t": 40, "b": 30}
            )
            extra = eff.to_html(full_html=False, include_plotlyjs=False)
        data = " ".join(f'data-{k}="{html.escape(v)}"' for k, v in parts.items())
        sections.append(
            f'<div class="case" {data}><h3>{html.escape(case_id)} <small>{html.escape(key)}</small></h3>'
            + step_figure
            + extra
            + "</div>"
        )
    sections.extend(_scaling_curves(rows))
    if series is not None and any(one.runs > len(one.rows) for one in series):
        sections.insert(0, "<p class='note'>Runs, efficiency and scaling curves: the last "
                           f"{history.RECENT_NIGHTS} nights of each case; the nightly median line "
                           "covers every night.</p>")  # fmt: skip
    filters = "".join(
        f'<label>{name} <select name="{name}"><option value="">all</option>'
        + "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in sorted(values) if v)
        + "</select></label>"
        for name, values in options.items()
    )
    regressions = (
        "<table><tr><th>case</th><th>hardware</th><th>change</th><th>since</th><th>builds</th></tr>"
        + "".join(open_regressions)
        + "</table>"
        if open_regressions
        else "<p>No open regression: no case's latest change point made it slower.</p>"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1><h2>Open regressions</h2>{regressions}"
        f"<div class='filters'>{filters}</div>{''.join(sections)}"
        f"<script>{_FILTER_SCRIPT}</script></body></html>"
    )


def _scaling_curves(rows: Sequence[history.HistoryRow]) -> list[str]:
    """Speedup over world size per torch version, per group with several world sizes."""
    import plotly.graph_objects as go

    groups: dict[tuple[str, str], dict[str, dict[int, list[float]]]] = {}
    for row in rows:
        parts = _parts(row.case_id)
        if row.quarantine is not None or not parts["ws"].isdigit():
            continue
        group = "-".join(t for i, t in enumerate(row.case_id.split("-")) if i != 2)
        rate = 1.0 / row.median_s
        by_torch = groups.setdefault((row.hardware_key, group), {})
        by_torch.setdefault(row.torch or "unknown", {}).setdefault(int(parts["ws"]), []).append(rate)
    out = []
    for (key, group), by_torch in sorted(groups.items()):
        if not any(len(sizes) > 1 and 1 in sizes for sizes in by_torch.values()):
            continue
        fig = go.Figure()
        for torch, sizes in sorted(by_torch.items()):
            if 1 not in sizes:
                continue
            base = sum(sizes[1]) / len(sizes[1])
            xs = sorted(sizes)
            # samples/s scale with the per-step rate times the global batch; strong scaling
            # keeps the batch, weak multiplies it by ws
            weak = group.endswith("weak") or "-weak-" in group
            ys = [(sum(sizes[w]) / len(sizes[w])) / base * (w if weak else 1) for w in xs]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=_t(f"torch {torch}")))
        top = max(max(s) for s in by_torch.values())
        ideal = {"dash": "dot", "color": "grey"}
        fig.add_trace(go.Scatter(x=[1, top], y=[1, top], mode="lines", name="ideal", line=ideal))
        fig.update_layout(
            title=_t(f"{group} ({key}): speedup over world size"), height=300, xaxis_title="world size"
        )
        plot = fig.to_html(full_html=False, include_plotlyjs=False)
        out.append(f'<div class="scaling"><h3>{html.escape(group)}</h3>{plot}</div>')
    return out


def write(
    path: Path,
    rows: Sequence[history.HistoryRow],
    settings: ThresholdSettings | None = None,
    series: Sequence[history.CaseSeries] | None = None,
) -> None:
    from scaleguard.evidence.files import atomic_write_text

    atomic_write_text(path, render(rows, settings=settings, series=series))
