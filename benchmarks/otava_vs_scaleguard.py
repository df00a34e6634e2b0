"""scaleguard's change-point detector against Apache Otava 0.8.0, on Otava's own test series and on
synthetic nightly series at the spreads this suite sees. Prints one markdown table per set.

    python benchmarks/otava_vs_scaleguard.py [--series 200] [--venv DIR]

Otava pins numpy 2.2 and scipy < 1.17, so it lives in a throwaway virtualenv (made on first use
under --venv, default $TMPDIR/otava-venv; `pip install apache-otava==0.8.0` from the package
index) and answers through a child process; this project's environment is never touched.

Settings match where both have them (max_pvalue, min_magnitude); Otava's window_len is its
default (50) unless a test series names another; scaleguard uses min_size 3 (2 where an Otava
test series has a level of 2 values) and its log scale.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.unit.test_history: the synthetic nights

from scaleguard.history import changepoints

HERE = Path(__file__).parent
OTAVA = "apache-otava==0.8.0"
WORKER = r"""
import json, sys
from otava.analysis import compute_change_points
out = []
for job in json.load(sys.stdin):
    cps, _ = compute_change_points(job["series"], window_len=job["window_len"],
                                   max_pvalue=job["max_pvalue"], min_magnitude=job["min_magnitude"])
    out.append([int(c.index) for c in cps])
json.dump(out, sys.stdout)
"""


def otava_python(venv: Path) -> str:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", OTAVA], check=True)
    return str(python)


def otava(python: str, jobs: list[dict]) -> list[list[int]]:
    done = subprocess.run(
        [python, "-c", WORKER], input=json.dumps(jobs), capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def ours(job: dict, min_size: int = 3, scale: str = "log") -> list[int]:
    return [
        s.index
        for s in changepoints.detect(job["series"], job["max_pvalue"], job["min_magnitude"], min_size, scale)
    ]


# -- Otava's own test series (tests/ of apache/otava at 0.8.0) ---------------------------------
def otava_tests() -> list[tuple[str, dict, list[int], int, str]]:
    """(name, job, Otava's asserted answer, our min_size, our scale)."""
    s1 = [1.02, 0.95, 0.99, 1.00, 1.12, 0.90, 0.50, 0.51, 0.48, 0.48, 0.55]
    s2 = [2.02, 2.03, 2.01, 2.04, 1.82, 1.85, 1.79, 1.81, 1.80, 1.76, 1.78]
    single = [1.02, 0.95, 0.99, 1.00, 1.12, 1.00, 1.01, 0.98, 1.01, 0.96,
              0.50, 0.51, 0.48, 0.48, 0.55, 0.50, 0.49, 0.51, 0.50, 0.49]  # fmt: skip
    seq = [0.3, 2.4, 1.5, -0.9, -0.5, 99.7, 98.3, 99.1, 149.0, 149.7, 149.5, 149.1, 148.8, 150.0]

    def job(series: list[float], window: int = 50, p: float = 0.001, mag: float = 0.0) -> dict:
        return {"series": series, "window_len": window, "max_pvalue": p, "min_magnitude": mag}

    rows = [
        ("analysis_test single_series", job(single, 10, 0.0001), [10], 2, "log"),
        ("series_test series1", job(s1), [6], 2, "log"),
        ("series_test series2", job(s2), [4], 2, "log"),
        ("series_test min_magnitude 0.2, series1", job(s1, mag=0.2), [6], 2, "log"),
        ("series_test min_magnitude 0.2, series2", job(s2, mag=0.2), [], 2, "log"),
        ("series_test incremental, series2 + 1 night", job([*s2, 1.97]), [4], 2, "log"),
        ("series_test incremental, series2 + 3 nights", job([*s2, 1.97, 33.33, 46.46]), [4, 12], 2, "log"),
        ("series_test div_by_zero (zeros)", job([0.0, 0.0, 0.0, *s1[3:]]), [3, 6], 2, "linear"),
        ("change_point_divisive_test ttest (negatives)", job(seq, p=0.01), [5, 8], 2, "linear"),
    ]
    tb = json.loads((HERE / "data" / "otava_tigerbeetle.json").read_text())
    for name, case in tb["cases"].items():
        rows.append((f"tigerbeetle {name}", job(tb["series"], 30, case["max_pvalue"], case["min_magnitude"]),
                     case["expected"], 3, "log"))  # fmt: skip
    return rows


# -- synthetic nightly series -----------------------------------------------------------------
Gen = Callable[[np.random.Generator], tuple[np.ndarray, list[int]]]


def step_set(spread: float, step: float, nights: int = 60) -> Gen:
    def make(rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
        at = int(rng.integers(10, nights - 10))
        level = np.where(np.arange(nights) < at, 1.0, 1.0 + step)
        return 0.1 * level * np.exp(rng.normal(0, spread, nights)), [at]

    return make


def flat_set(spread: float, nights: int = 60) -> Gen:
    return lambda rng: (0.1 * np.exp(rng.normal(0, spread, nights)), [])


def outlier_set(spread: float = 0.01, nights: int = 40) -> Gen:
    """A -11 % step, and one -41 % night five nights before it (the issue's case)."""

    def make(rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
        at = int(rng.integers(12, nights - 8))
        series = 0.1 * np.where(np.arange(nights) < at, 1.0, 0.89) * np.exp(rng.normal(0, spread, nights))
        series[at - 5] *= 0.59
        return series, [at]

    return make


def bump_set(spread: float = 0.005, nights: int = 30) -> Gen:
    """Regress, then fixed: +6 % for 6 nights in the middle."""

    def make(rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
        at = int(rng.integers(8, nights - 14))
        level = np.where((np.arange(nights) >= at) & (np.arange(nights) < at + 6), 1.06, 1.0)
        return 0.1 * level * np.exp(rng.normal(0, spread, nights)), [at, at + 6]

    return make


def drift_set(spread: float = 0.005, nights: int = 60) -> Gen:
    """A slow drift: +15 % over the whole series, no step."""
    return lambda rng: (0.1 * np.linspace(1.0, 1.15, nights) * np.exp(rng.normal(0, spread, nights)), [])


ROUND_TRIP = r"""
import json, sys
from otava.importer import CsvImporter
from otava.series import AnalysisOptions
from otava.test_config import create_csv_test_config
import yaml
config = yaml.safe_load(open("otava.yaml"))
out = {}
for name, test in config["tests"].items():
    series = CsvImporter().fetch_data(create_csv_test_config(name, test))
    options = AnalysisOptions()
    options.min_magnitude = float(sys.argv[1])
    points = series.analyze(options).change_points_by_time
    out[name] = [[int(p.index), [c.metric for c in p.changes]] for p in points]
json.dump(out, sys.stdout)
"""


def round_trip(python: str) -> None:
    """A history with a known step, exported as Otava CSV; Otava's own CSV reader and analysis
    find the change point our detector finds."""
    from tests.unit.test_history import KEY, nights

    from scaleguard.cli import main as cli_main
    from scaleguard.history import database as history

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "h.sqlite"
        rng = np.random.default_rng(7)
        with history.History(db) as h:
            for i, level in enumerate([0.1] * 12 + [0.115] * 12):
                h.append(nights([level * float(np.exp(rng.normal(0, 0.01)))], first=i), KEY, "suite")
        out = Path(tmp) / "otava"
        assert cli_main(["export", "--format", "otava", "--history", str(db), "--out", str(out)]) == 0
        with history.History(db, readonly=True) as h:
            ours_at = [
                p.index for p in history.case_change_points(history.nightly(h.rows()), min_magnitude=0.10)
            ]
        done = subprocess.run(
            [python, "-c", ROUND_TRIP, "0.10"], cwd=out, capture_output=True, text=True, check=True
        )
        theirs = json.loads(done.stdout)
        print("## Round trip: `scaleguard export --format otava`, read by Otava's CsvImporter\n")
        print("| test | scaleguard's change point (night) | Otava's, on the exported CSV (night: metrics) |")
        print("| --- | --- | --- |")
        for name, points in theirs.items():
            print(f"| {name} | {ours_at} | {points} |")
        print()


def score(found: list[int], truth: list[int], tolerance: int = 3) -> tuple[int, int, list[int]]:
    """(true steps found, false change points, location errors of the found steps)."""
    hit, errors = 0, []
    used: set[int] = set()
    for t in truth:
        near = [f for f in found if abs(f - t) <= tolerance and f not in used]
        if near:
            best = min(near, key=lambda f: abs(f - t))
            used.add(best)
            hit += 1
            errors.append(abs(best - t))
    return hit, len(found) - len(used), errors


TIMING_WORKER = r"""
import json, sys, time
from otava.analysis import compute_change_points
out = []
for job in json.load(sys.stdin):
    start = time.perf_counter()
    cps, _ = compute_change_points(job["series"], window_len=50, max_pvalue=0.001, min_magnitude=0.0)
    out.append([time.perf_counter() - start, len(cps)])
json.dump(out, sys.stdout)
"""


def timing(python: str | None, lengths: list[int]) -> None:
    """Seconds for one series of each length (1 % noise, a +5 % step in the middle), ours and
    Otava's (window 50, its default), each alone in its process: the detector's cost at years of
    nights, up to the 200,000 rows one view reads (issue 41)."""
    print("## Time for one series (1 % noise, one +5 % step; max_pvalue 0.001)\n")
    print("| nights | scaleguard: s (change points) | Otava 0.8.0: s (change points) |")
    print("| --- | --- | --- |")
    rng = np.random.default_rng(41)
    for n in lengths:
        series = 0.1 * np.exp(rng.normal(0, 0.01, n))
        series[n // 2 :] *= 1.05
        start = time.perf_counter()
        found = changepoints.detect(series.tolist(), 0.001, 0.0, 3)
        mine = f"{time.perf_counter() - start:.2f} ({len(found)})"
        theirs = "-"
        if python is not None:
            job = json.dumps([{"series": series.tolist()}])
            done = subprocess.run(
                [python, "-c", TIMING_WORKER], input=job, capture_output=True, text=True, check=True
            )
            seconds, count = json.loads(done.stdout)[0]
            theirs = f"{seconds:.2f} ({count})"
        print(f"| {n:,} | {mine} | {theirs} |")
    print()
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument(
        "--timing", type=str, default="", metavar="N,N",
        help="only time one series of each length (e.g. 10000,200000); --no-otava: ours alone",
    )  # fmt: skip
    parser.add_argument("--no-otava", action="store_true")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "otava-venv")
    args = parser.parse_args()
    if args.timing:
        timing(None if args.no_otava else otava_python(args.venv), [int(n) for n in args.timing.split(",")])
        return
    python = otava_python(args.venv)
    if not subprocess.run([python, "-c", "import yaml"], capture_output=True).returncode == 0:
        subprocess.run([python, "-m", "pip", "install", "-q", "pyyaml"], check=True)
    round_trip(python)

    print("## Otava's own test series\n")
    print("| series | settings | Otava 0.8.0 asserts | Otava here | scaleguard |")
    print("| --- | --- | --- | --- | --- |")
    rows = otava_tests()
    theirs = otava(python, [r[1] for r in rows])
    same = 0
    for (name, job, expected, min_size, scale), got in zip(rows, theirs, strict=True):
        try:
            mine: object = ours(job, min_size, scale)
        except ValueError as exc:
            mine = f"refused: {exc}"
        same += mine == got
        settings = f"p {job['max_pvalue']:g}, mag {job['min_magnitude']:g}, window {job['window_len']}"
        print(f"| {name} | {settings}; ours min_size {min_size}, {scale} | {expected} | {got} | {mine} |")
    print(f"\nsame answer as Otava on {same} of {len(rows)} series\n")

    sets: list[tuple[str, Gen, float]] = [
        ("CUDA 0.2 %: +2 % step", step_set(0.002, 0.02), 0.01),
        ("CUDA 0.5 %: +3 % step", step_set(0.005, 0.03), 0.01),
        ("CPU 4 %: +15 % step", step_set(0.04, 0.15), 0.05),
        ("CPU 12 %: +30 % step", step_set(0.12, 0.30), 0.10),
        ("CUDA 0.2 %: flat", flat_set(0.002), 0.01),
        ("CUDA 0.5 %: flat", flat_set(0.005), 0.01),
        ("CPU 4 %: flat", flat_set(0.04), 0.05),
        ("CPU 12 %: flat", flat_set(0.12), 0.10),
        ("outlier night (-41 %) 5 nights before a -11 % step, 1 %", outlier_set(), 0.02),
        ("regress-then-fix bump (+6 % for 6 nights), 0.5 %", bump_set(), 0.02),
        ("drift +15 % over 60 nights, 0.5 %", drift_set(), 0.02),
    ]
    print(f"## Synthetic series, {args.series} per set (max_pvalue 0.001, min_magnitude as listed)\n")
    print(
        "| set | min_magnitude | steps | detected: Otava / scaleguard "
        "| false change points: Otava / scaleguard "
        "| exact placement: Otava / scaleguard | location error, mean: Otava / scaleguard |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(20261205)
    for name, make, magnitude in sets:
        made = [make(rng) for _ in range(args.series)]
        jobs = [{"series": s.tolist(), "window_len": 50, "max_pvalue": 0.001, "min_magnitude": magnitude}
                for s, _ in made]  # fmt: skip
        results = {"Otava": otava(python, jobs), "scaleguard": [ours(j) for j in jobs]}
        cells: dict[str, list[str]] = {"det": [], "false": [], "exact": [], "err": []}
        steps = sum(len(t) for _, t in made)
        for who in ("Otava", "scaleguard"):
            hit = false = exact = 0
            errors: list[int] = []
            for found, (_, truth) in zip(results[who], made, strict=True):
                h, f, e = score(found, truth)
                hit, false, exact = hit + h, false + f, exact + sum(x == 0 for x in e)
                errors += e
            cells["det"].append(str(hit))
            cells["false"].append(str(false))
            cells["exact"].append(str(exact))
            cells["err"].append(f"{np.mean(errors):.2f}" if errors else "-")
        print(
            f"| {name} | {magnitude:g} | {steps} | "
            + " | ".join(" / ".join(v) for v in cells.values())
            + " |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
