"""Change-point detection (scaleguard.history.change_points) on synthetic nightly series at the
spreads measured for the suite: detection rate and location error of a level step, and false
change points per 100 stationary nights.

    python benchmarks/change_points.py [--series 200]
"""

from __future__ import annotations

import argparse

import numpy as np

from scaleguard.history import change_points


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--nights", type=int, default=60)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| device | night-to-night spread | step | detected | location error (nights), median / max | false change points per 100 stationary nights |")
    print("| --- | --- | --- | --- | --- | --- |")
    for device, spread, step in (("cuda", 0.002, 0.05), ("cuda", 0.005, 0.05), ("cpu", 0.04, 0.30), ("cpu", 0.12, 0.30)):
        detected, errors, false = 0, [], 0
        for _ in range(args.series):
            at = int(rng.integers(10, args.nights - 10))
            level = np.where(np.arange(args.nights) < at, 1.0, 1.0 + step)
            series = 0.1 * level * np.exp(rng.normal(0, spread, args.nights))
            points = change_points(series, min_magnitude=0.02 if device == "cuda" else 0.10)
            near = [p for p in points if abs(p.index - at) <= 3]
            if near:
                detected += 1
                errors.append(min(abs(p.index - at) for p in near))
            flat = 0.1 * np.exp(rng.normal(0, spread, args.nights))
            false += len(change_points(flat, min_magnitude=0.02 if device == "cuda" else 0.10))
        err = f"{int(np.median(errors))} / {max(errors)}" if errors else "-"
        print(f"| {device} | {spread:.1%} | +{step:.0%} | {detected}/{args.series} | {err} | "
              f"{100 * false / (args.series * args.nights):.2f} ({false} in {args.series * args.nights} nights) |")


if __name__ == "__main__":
    main()
