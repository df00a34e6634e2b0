"""Issue 39, item 9: does the block search of a long series (``changepoints.LONG_SERIES``) answer
as the whole-series search does, and what does each cost?

    python benchmarks/changepoints_long.py [--per-cell 20]

Series of 3,000, 6,000 and 10,000 nights at 1 %, 3 % and 8 % noise (log-normal), one outlier
night in 200 (x1.4), 0 to 3 steps of 3-25 % (either sign) at random nights, ``--per-cell``
series per (length, noise). Each is searched whole (``LONG_SERIES`` lifted) and in blocks, at a
CUDA case's smallest change (3 %). Prints, per cell: identical answers, the whole search's points
the blocks missed and the points only the blocks found (a point matches within 3 nights), each
search's true steps found (within 5 nights, steps >= 5 %) and its false points, and the seconds
each took. Deterministic (seeded).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from scaleguard.history import changepoints as cp

MIN_MAGNITUDE = 0.03


def series(rng: np.random.Generator, n: int, noise: float) -> tuple[np.ndarray, list[tuple[int, float]]]:
    x = np.exp(noise * rng.standard_normal(n)) * 0.1
    x[rng.random(n) < 0.005] *= 1.4
    steps = []
    for at in sorted(rng.choice(np.arange(50, n - 50), size=int(rng.integers(0, 4)), replace=False)):
        size = float(rng.uniform(0.03, 0.25)) * (1 if rng.random() < 0.5 else -1)
        x[at:] *= 1 + size
        steps.append((int(at), size))
    return x, steps


def matched(a: list[int], b: list[int], reach: int) -> int:
    return sum(any(abs(i - j) <= reach for j in b) for i in a)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-cell", type=int, default=20)
    args = parser.parse_args()
    print(
        "| nights | noise | series | identical | whole's points missed by blocks | only in blocks "
        "| true steps >= 5 % found: whole / blocks | false points: whole / blocks | s: whole / blocks |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    totals = np.zeros(8)
    for n in (3000, 6000, 10000):
        for noise in (0.01, 0.03, 0.08):
            rng = np.random.default_rng(n * 1000 + int(noise * 1000))
            row = np.zeros(8)
            seconds = [0.0, 0.0]
            for _ in range(args.per_cell):
                x, steps = series(rng, n, noise)
                saved = cp.LONG_SERIES
                cp.LONG_SERIES = 10**9
                t0 = time.perf_counter()
                whole = [s.index for s in cp.detect(x, min_magnitude=MIN_MAGNITUDE)]
                t1 = time.perf_counter()
                cp.LONG_SERIES = saved
                blocks = [s.index for s in cp.detect(x, min_magnitude=MIN_MAGNITUDE)]
                t2 = time.perf_counter()
                truth = [at for at, size in steps if abs(size) >= 0.05]
                every = [at for at, _ in steps]
                row += [
                    whole == blocks,
                    len(whole) - matched(whole, blocks, 3),
                    len(blocks) - matched(blocks, whole, 3),
                    matched(truth, whole, 5), matched(truth, blocks, 5), len(truth),
                    len(whole) - matched(whole, every, 5), len(blocks) - matched(blocks, every, 5),
                ]  # fmt: skip
                seconds[0] += t1 - t0
                seconds[1] += t2 - t1
            t_whole, t_blocks = seconds
            totals += row
            print(
                f"| {n} | {noise:.0%} | {args.per_cell} | {row[0]:.0f} | {row[1]:.0f} | {row[2]:.0f} "
                f"| {row[3]:.0f} / {row[4]:.0f} of {row[5]:.0f} | {row[6]:.0f} / {row[7]:.0f} "
                f"| {t_whole:.1f} / {t_blocks:.1f} |",
                flush=True,
            )
    print(
        f"| all | | {9 * args.per_cell} | {totals[0]:.0f} | {totals[1]:.0f} | {totals[2]:.0f} "
        f"| {totals[3]:.0f} / {totals[4]:.0f} of {totals[5]:.0f} | {totals[6]:.0f} / {totals[7]:.0f} | |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
