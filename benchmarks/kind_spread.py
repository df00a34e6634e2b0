"""The between-session spread of a GPU kind's device-bound cases, from its committed baseline.

A young baseline (one recording session) cannot know how far a case moves between sessions and
machines; the verdict then assumes the kind's figure (``scaleguard.devices.KIND_SPREADS``). This
script measures that figure from every case of a baseline file whose runs are device-bound (the
GPU busy >= 90 % of the step in the runs' anatomy) and come from >= 2 sessions:

- per case, the mean log run median of each session, and their standard deviation;
- pooled over cases (degrees of freedom summed), and its one-sided 90 % upper confidence bound
  (chi-square): the figure the table takes, so a few agreeing sessions do not promise too much.

Usage: python benchmarks/kind_spread.py baselines/cuda-nvidia-h200-x1.json [--busy 0.9]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats


def case_sessions(entry: dict, busy_min: float) -> dict[str, list[float]] | None:
    """Session -> log run medians, or None when the runs are not device-bound."""
    shares, by_session = [], {}
    for run in entry["runs"]:
        median = run["summary"]["median_s"]
        busy = (run.get("anatomy") or {}).get("device_busy_ms")
        if busy is not None:
            shares.append(min(1.0, busy / (median * 1e3)))
        by_session.setdefault(run["session"], []).append(math.log(median))
    if not shares or statistics.median(shares) < busy_min:
        return None
    return by_session


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--busy", type=float, default=0.90)
    args = parser.parse_args()
    data = json.loads(args.baseline.read_text())
    ss, df, rows = 0.0, 0, []
    for case_id, by_torch in sorted(data["cases"].items()):
        for torch_version, entry in by_torch.items():
            sessions = case_sessions(entry, args.busy)
            if sessions is None or len(sessions) < 2:
                continue
            means = [statistics.fmean(v) for v in sessions.values()]
            sd = statistics.stdev(means)
            ss += sd**2 * (len(means) - 1)
            df += len(means) - 1
            spread = max(means) - min(means)
            rows.append((case_id, torch_version, len(sessions), len(entry["runs"]), sd, math.expm1(spread)))
    if not rows:
        print("no device-bound case with runs from two sessions", file=sys.stderr)
        return 1
    print(f"{'case':45} {'torch':14} sessions runs  sd(log)  max-min")
    for case_id, tv, n_sessions, n_runs, sd, span in rows:
        print(f"{case_id:45} {tv:14} {n_sessions:8} {n_runs:4} {sd:8.4f} {span:+8.2%}")
    pooled = math.sqrt(ss / df)
    upper = math.sqrt(ss / stats.chi2.ppf(0.10, df))
    print(
        f"pooled between-session sd {pooled:.4f} over {len(rows)} cases ({df} df); "
        f"90 % upper bound {upper:.4f}: the young-baseline spread of this kind"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
