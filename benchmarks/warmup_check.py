"""Did warmup end too early? Residual warmup left in the measured steps of saved sessions.

    python benchmarks/warmup_check.py SESSION.json [...]      (pytest-benchmark JSON files)

For each run: the median of its first ``--head`` measured steps against the median of its
second half. Noise moves that either way; warmup still going on makes the head slower only.
So the count of runs whose head is more than ``--margin`` slower, beside the count whose head
is that much faster, is the measure (asymmetry = residual warmup). Also prints how long warmup
ran and how often it hit its cap.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--head", type=int, default=8)
    parser.add_argument("--margin", type=float, default=0.03)
    args = parser.parse_args()
    print("| file | runs | warmup steps (median, max) | capped (cases) | head slower | head faster |")
    print("|---|---|---|---|---|---|")
    for path in args.files:
        runs = capped = slower = faster = 0
        warmups: list[int] = []
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or "benchmarks" not in data:
            print(f"| {path.name} | not a pytest-benchmark JSON file: skipped | | | | |")
            continue
        for bench in data["benchmarks"]:
            info = bench["extra_info"]
            capped += sum("warmup reached its cap" in note for note in info.get("notes", []))
            for run in info.get("runs", []):
                steps = run["step_s"]
                if len(steps) < 2 * args.head:
                    continue
                runs += 1
                warmups.append(run.get("warmup_steps", 0))
                change = (
                    statistics.median(steps[: args.head]) / statistics.median(steps[len(steps) // 2 :]) - 1
                )
                slower += change > args.margin
                faster += change < -args.margin
        if runs:
            print(
                f"| {path.name} | {runs} | {statistics.median(warmups):.0f}, {max(warmups)} | {capped} "
                f"| {slower} | {faster} |"
            )


if __name__ == "__main__":
    main()
