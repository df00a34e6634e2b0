"""Does a change of the detector change any answer? The detector of a committed version against
this checkout's, on every series of the Otava benchmark (Otava's own test series and N synthetic
series of each set of ``otava_vs_scaleguard.py``), with both one's times.

    python benchmarks/changepoints_same.py [--commit REV] [--series 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import otava_vs_scaleguard as bench  # noqa: E402

from scaleguard.history import changepoints as new  # noqa: E402


def committed(rev: str) -> object:
    text = subprocess.run(
        ["git", "show", f"{rev}:src/scaleguard/history/changepoints.py"],
        cwd=HERE.parent, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "changepoints_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("changepoints_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["changepoints_old"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--series", type=int, default=200)
    args = parser.parse_args()
    old = committed(args.commit)
    jobs = [(job, min_size, scale) for _, job, _, min_size, scale in bench.otava_tests()]
    rng = np.random.default_rng(1)
    for make in (bench.step_set(0.01, 0.05), bench.flat_set(0.04), bench.outlier_set(), bench.bump_set(),
                 bench.drift_set(), bench.step_set(0.12, 0.3), bench.flat_set(0.12)):  # fmt: skip
        for _ in range(args.series):
            series, _ = make(rng)
            jobs.append(({"series": series.tolist(), "max_pvalue": 0.001, "min_magnitude": 0.0}, 3, "log"))
    same, times = 0, {"old": 0.0, "new": 0.0}
    for job, min_size, scale in jobs:
        answers = {}
        for name, module in (("old", old), ("new", new)):
            start = time.perf_counter()
            steps = module.detect(job["series"], job["max_pvalue"], job["min_magnitude"], min_size, scale)  # type: ignore[attr-defined]
            times[name] += time.perf_counter() - start
            answers[name] = [s.index for s in steps]
        same += answers["old"] == answers["new"]
        if answers["old"] != answers["new"]:
            print(f"different: {answers['old']} -> {answers['new']}")
    print(f"{same} of {len(jobs)} series: the same answer as {args.commit}; "
          f"time {times['old']:.2f} s ({args.commit}) -> {times['new']:.2f} s (this checkout)")  # fmt: skip


if __name__ == "__main__":
    main()
