"""Run-to-run spread per case over several saved sessions (pytest-benchmark JSON files).

    python benchmarks/run_spread.py .benchmarks/*/*.json

For each case: the median step of every run in every file, the standard deviation of their
logs (about the relative spread, the figure ``Thresholds.prior_spread`` stands for), and the
largest excursion from the case's overall geometric mean. This is how the CPU and CUDA priors in
``compare.Thresholds.for_device`` were chosen (README, "Measured").
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from scaleguard.evidence import benchmark_io


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    per_case: dict[str, list[float]] = {}
    per_session: dict[str, list[float]] = {}
    for path in args.files:
        _, cases = benchmark_io.read_saved_run(path, benchmark_io.read_document_any(path))
        for case_id, evidence in cases.items():
            per_case.setdefault(case_id, []).extend(evidence.medians())
            per_session.setdefault(case_id, []).append(evidence.median_s())
    print(f"{'case':45} {'runs':>4} {'median ms':>9} {'spread':>7} {'max dev':>7}")
    spreads = []
    for case_id, medians in sorted(per_case.items()):
        logs = np.log(medians)
        spread = float(np.std(logs, ddof=1)) if len(logs) > 1 else math.nan
        spreads.append(spread)
        worst = float(np.max(np.abs(logs - logs.mean())))
        mean_ms = math.exp(logs.mean()) * 1e3
        print(f"{case_id:45} {len(medians):4d} {mean_ms:9.1f} {spread:7.1%} {math.expm1(worst):+7.1%}")
    print(f"median spread over cases {np.nanmedian(spreads):.1%}, largest {np.nanmax(spreads):.1%}")


if __name__ == "__main__":
    main()
