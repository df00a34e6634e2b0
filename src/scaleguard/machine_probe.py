"""How fast is this machine, independently of torch: a short probe run at session start.

Two kernels in a child process pinned to one core with one BLAS/OpenMP thread, no torch:
a fixed pure-Python loop (the interpreter's and the core's speed: what a host-launch-bound step
pays) and a numpy copy of 64 MiB arrays (memory bandwidth). Each is timed 5 times and the
fastest kept (noise only ever adds time). The score is their geometric mean, relative to fixed
reference figures, so two machines compare by one number. Stored with every run; the session
header shows it beside the baseline runs'.

What it cannot see: the GPU. A GPU-bound case barely moves with the host; a host-launch-bound
one moves a lot; a CPU case with several ranks moves with cores the probe does not load.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA = 1
# reference figures (arbitrary, fixed forever): a score of 1.0 is a machine this fast
REF_PYTHON_OPS_S = 10e6
REF_COPY_GB_S = 10.0

_CHILD = r"""
import json, os, sys, time
try:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
except (AttributeError, OSError):
    pass
import numpy as np

def best(fn, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)

N = 2_000_000
def loop():
    total = 0
    for i in range(N):
        total += i * i % 7
    return total

src = np.ones(8 * 2**20)  # 64 MiB of float64
dst = np.empty_like(src)
np.copyto(dst, src)  # pages touched before timing
loop_s = best(loop)
copy_s = best(lambda: np.copyto(dst, src))
print(json.dumps({"python_ops_per_s": N / loop_s, "copy_gb_per_s": 2 * src.nbytes / copy_s / 1e9}))
"""


@dataclass(frozen=True)
class MachineSpeed:
    python_ops_per_s: float
    copy_gb_per_s: float
    schema: int = SCHEMA

    @property
    def score(self) -> float:
        """Geometric mean of the two kernels, each relative to its reference."""
        return math.sqrt(self.python_ops_per_s / REF_PYTHON_OPS_S * self.copy_gb_per_s / REF_COPY_GB_S)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "score": round(self.score, 4)}

    def describe(self) -> str:
        return (
            f"machine probe {self.score:.3f} (python {self.python_ops_per_s / 1e6:.1f} M ops/s, "
            f"copy {self.copy_gb_per_s:.1f} GB/s; 1 core)"
        )


def run_probe(timeout_s: float = 60.0) -> MachineSpeed | None:
    """Measure this machine; None when the probe cannot run (it is a diagnosis, never a gate)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=timeout_s, env=env
        )
        data = json.loads(done.stdout.strip().splitlines()[-1])
        speed = MachineSpeed(float(data["python_ops_per_s"]), float(data["copy_gb_per_s"]))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError, KeyError):
        return None
    if not (math.isfinite(speed.score) and speed.score > 0):
        return None
    return speed
