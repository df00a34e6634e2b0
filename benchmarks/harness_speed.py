"""Harness speed and fidelity: the suite with fresh processes per run (``--perf-isolate``,
the behaviour before rank pools) against the suite with pooled ranks, alternating A B B A.

    python benchmarks/harness_speed.py --pairs 2 --out /tmp/speed [-- <extra pytest args>]

Each session is ``pytest perf/ --perf-confirm 0`` (one run per case, so both modes make the
same runs) with ``--benchmark-json``; the report reads the runs stored there (wall time,
phase breakdown, median step, whether the processes had run other cases before). Run it
alone on the machine: it is a timing measurement. Prints markdown and writes ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = {"isolated": ["--perf-isolate"], "pooled": []}


def run_session(mode: str, index: int, out: Path, extra: list[str]) -> dict[str, Any]:
    target = out / f"{mode}{index}.json"
    cmd = [sys.executable, "-m", "pytest", "perf/", "-q", "-p", "no:cacheprovider", "--perf-confirm", "0",
           f"--benchmark-json={target}", *MODES[mode], *extra]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    tail = proc.stdout.strip().splitlines()[-1:] or [""]
    print(f"{mode} session {index}: rc {proc.returncode}, {wall:.0f} s; {tail[0]}", flush=True)
    if not target.exists():
        sys.exit(f"no benchmark JSON from {' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    runs = []
    for bench in json.loads(target.read_text())["benchmarks"]:
        info = bench["extra_info"]
        for run in info.get("runs", []):
            phases = run.get("phases_s", {})
            runs.append(
                {
                    "case": info["case_id"],
                    "wall_s": run["wall_s"],
                    "measured_s": phases.get("measured steps", 0.0),
                    "phases": phases,
                    "median_s": run["summary"]["median_s"],
                    "reused": run.get("process_runs_before", 0) > 0,
                }
            )
    return {"mode": mode, "wall_s": wall, "rc": proc.returncode, "runs": runs}


def report(sessions: list[dict[str, Any]]) -> str:
    lines = ["| | isolated (before) | pooled (after) |", "|---|---|---|"]

    def per_mode(fn: Any) -> str:
        return " | ".join(fn([s for s in sessions if s["mode"] == m]) for m in MODES)

    def walls(ss: list[dict[str, Any]]) -> str:
        return ", ".join(f"{s['wall_s']:.0f}" for s in ss) + " s"

    def overhead(ss: list[dict[str, Any]], reused: bool | None = None) -> str:
        values = [
            r["wall_s"] - r["measured_s"] for s in ss for r in s["runs"] if reused in (None, r["reused"])
        ]
        if not values:
            return "-"
        return f"median {statistics.median(values):.2f} s (n={len(values)})"

    def measured(ss: list[dict[str, Any]]) -> str:
        fr = [sum(r["measured_s"] for r in s["runs"]) / s["wall_s"] for s in ss]
        return ", ".join(f"{f:.0%}" for f in fr)

    def top_phases(ss: list[dict[str, Any]]) -> str:
        totals: dict[str, float] = {}
        for s in ss:
            for r in s["runs"]:
                for k, v in r["phases"].items():
                    totals[k] = totals.get(k, 0.0) + v / len(ss)
        top = sorted(totals.items(), key=lambda kv: -kv[1])[:4]
        return ", ".join(f"{k} {v:.0f} s" for k, v in top)

    lines.append(f"| session wall time | {per_mode(walls)} |")
    lines.append(f"| measured steps / wall | {per_mode(measured)} |")
    lines.append(f"| per-run overhead (wall − measured steps) | {per_mode(overhead)} |")
    lines.append(
        "| … runs in processes that ran another case first | "
        + " | ".join(overhead([s for s in sessions if s["mode"] == m], True) for m in MODES)
        + " |"
    )
    lines.append(f"| most time per session (mean) | {per_mode(top_phases)} |")
    # fidelity: per case, the geometric mean over sessions of pooled/isolated median step
    medians: dict[str, dict[str, list[float]]] = {}
    for s in sessions:
        for r in s["runs"]:
            medians.setdefault(r["case"], {}).setdefault(s["mode"], []).append(r["median_s"])

    def log_mean(xs: list[float]) -> float:
        return statistics.fmean(math.log(x) for x in xs)

    ratios = {
        case: math.exp(log_mean(m["pooled"]) - log_mean(m["isolated"]))
        for case, m in medians.items()
        if m.get("pooled") and m.get("isolated")
    }
    lines.append("")
    if ratios:
        geo = math.exp(statistics.fmean(math.log(v) for v in ratios.values()))
        lines.append(
            f"Median step, pooled / isolated, per case (geometric mean over sessions): overall "
            f"{geo - 1:+.1%}, cases from {min(ratios.values()) - 1:+.1%} to {max(ratios.values()) - 1:+.1%}."
        )
        lines += ["", "| case | pooled / isolated |", "|---|---|"]
        lines += [f"| {c} | {v - 1:+.1%} |" for c, v in sorted(ratios.items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=2, help="A B B A blocks: sessions = 2 x pairs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("extra", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sessions = []
    for pair in range(args.pairs):
        order = ["isolated", "pooled"] if pair % 2 == 0 else ["pooled", "isolated"]
        for mode in order:
            sessions.append(run_session(mode, pair, args.out, args.extra))
    text = report(sessions)
    (args.out / "report.md").write_text(text + "\n")
    (args.out / "sessions.json").write_text(json.dumps(sessions, indent=1))
    print(text)


if __name__ == "__main__":
    main()
