"""The between-session spread of a GPU kind's device-bound cases, from its committed baseline.

A young baseline (one recording session) cannot know how far a case moves between sessions and
machines; the verdict then assumes the kind's figure (``scaleguard.devices.KIND_SPREADS``). This
script measures that figure from every case of a baseline file that the verdict itself calls
device-bound (``CaseEvidence.gpu_busy_share() >= verdict.DEVICE_BOUND``) and whose counted runs
come from >= 2 sessions:

- per case, the mean log run median of each session, and their standard deviation;
- pooled over cases (degrees of freedom summed), and its one-sided 90 % upper confidence bound
  (chi-square): the figure the table takes, so a few agreeing sessions do not promise too much.

The file is read by the suite's own validating reader (``baseline.load``).

Usage: python benchmarks/kind_spread.py baselines/cuda-nvidia-h200-x1.json
       python benchmarks/kind_spread.py FILE --cases   (the device-bound cases as one -k expression)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scaleguard.evidence import baseline
from scaleguard.evidence.runs import CaseEvidence
from scaleguard.evidence.verdict import DEVICE_BOUND


def device_bound(entries: dict[str, dict[str, CaseEvidence]]) -> list[tuple[str, str, CaseEvidence]]:
    """(case, torch version, entry) of every entry the verdict treats as device-bound."""
    out = []
    for case_id, by_torch in sorted(entries.items()):
        for torch_version, entry in sorted(by_torch.items()):
            share = entry.gpu_busy_share()
            if share is not None and share >= DEVICE_BOUND:
                out.append((case_id, torch_version, entry))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--cases", action="store_true", help="the device-bound cases as a -k expression")
    args = parser.parse_args()
    try:
        loaded = baseline.load(args.baseline)
    except baseline.BaselineError as exc:
        print(exc, file=sys.stderr)
        return 2
    if loaded is None:
        print(f"no baseline file {args.baseline}", file=sys.stderr)
        return 2
    bound = device_bound(loaded.cases)
    if args.cases:
        print(" or ".join(f"[{case_id}]" for case_id in sorted({c for c, _, _ in bound})))
        return 0
    ss, df, rows = 0.0, 0, []
    for case_id, torch_version, entry in bound:
        by_session: dict[str, list[float]] = {}
        for run in entry.evidence:
            by_session.setdefault(run.session, []).append(math.log(run.median_s))
        if len(by_session) < 2:
            continue
        means = [statistics.fmean(v) for v in by_session.values()]
        sd = statistics.stdev(means)
        ss += sd**2 * (len(means) - 1)
        df += len(means) - 1
        span = math.expm1(max(means) - min(means))
        rows.append((case_id, torch_version, len(means), len(entry.evidence), sd, span))
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
