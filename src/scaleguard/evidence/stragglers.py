"""A slow rank named: every rank's own compute against the others', from each rank's anatomy.

A step takes as long as its slowest rank, and a slow rank (a throttled GPU, a noisy neighbour,
a bad node) shows on every other rank only as time waiting in the all-reduce: rank 0's anatomy
alone calls it "exposed communication". Each rank's anatomy (``RunRecord.rank_ms``) splits its
step into its own compute (data, forward, backward without the gradient all-reduce, optimizer)
and its wait (the exposed communication), so the rank whose compute stands out, while the
others wait about as much longer, is the straggler, named with its node.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scaleguard.evidence.runs import RunRecord

COMPUTE = ("data", "forward", "backward", "optimizer")
WAIT = "exposed communication"
# a rank stands out when its compute exceeds the others' median by this share and this much:
# two unmodified gloo ranks on the 2-core VM differed by up to 10.5 % (3.7 of 35 ms) in one CI
# run, so 20 %; a smaller imbalance still shows as the others' exposed communication
MIN_SHARE = 0.20
MIN_MS = 1.0
# ... and the others wait for it: their wait grew by at least this share of its extra compute
WAIT_SHARE = 0.5


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str | None
    extra_ms: float  # its compute over the others' median, ms per step
    compute_ms: float
    others_ms: float
    wait_ms: float  # the others' median wait
    own_wait_ms: float

    def describe(self) -> str:
        where = f" (node {self.node})" if self.node else ""
        return (
            f"straggler: rank {self.rank}{where} computes {self.extra_ms:.1f} ms/step more than the others "
            f"({self.compute_ms:.1f} against {self.others_ms:.1f}); they wait for it in the all-reduce "
            f"(exposed communication {self.wait_ms:.1f} against its {self.own_wait_ms:.1f} ms/step)"
        )


def per_rank(runs: Sequence[RunRecord]) -> dict[int, tuple[float, float]]:
    """Each rank's (compute, wait) in ms per step: the median over the runs that have them."""
    compute: dict[int, list[float]] = {}
    wait: dict[int, list[float]] = {}
    for run in runs:
        for key, ms in run.rank_ms.items():
            if not isinstance(ms, dict) or not str(key).isdigit():
                continue
            rank = int(key)
            compute.setdefault(rank, []).append(sum(float(ms.get(k, 0.0)) for k in COMPUTE))
            wait.setdefault(rank, []).append(float(ms.get(WAIT, 0.0)))
    return {r: (statistics.median(compute[r]), statistics.median(wait[r])) for r in compute}


def find(runs: Sequence[RunRecord]) -> Straggler | None:
    """The rank whose compute stands out while the others wait for it; None when none does
    (or the runs carry no per-rank anatomy: one rank, no anatomy, FSDP's wait not split)."""
    ranks = per_rank(runs)
    if len(ranks) < 2:
        return None
    slowest = max(ranks, key=lambda r: ranks[r][0])
    others = [ranks[r] for r in ranks if r != slowest]
    others_compute = statistics.median(c for c, _ in others)
    others_wait = statistics.median(w for _, w in others)
    compute, own_wait = ranks[slowest]
    extra = compute - others_compute
    if extra < max(MIN_MS, MIN_SHARE * others_compute):
        return None
    if others_wait - own_wait < WAIT_SHARE * extra:
        return None  # the others do not wait for it: not what paces the step
    node = None
    for run in reversed(runs):
        facts = run.placement.get(str(slowest))
        if isinstance(facts, dict) and facts.get("node"):
            node = str(facts["node"])
            break
    return Straggler(slowest, node, extra, compute, others_compute, others_wait, own_wait)
