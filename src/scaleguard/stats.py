"""Summaries of raw per-step samples (numpy), and the slowest-rank reduction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# IQR/median above this: the samples are too spread to say anything about a few percent
NOISY_REL_IQR = 0.10


@dataclass(frozen=True)
class StepSummary:
    """Robust and classical statistics of one case's per-step times, in seconds."""

    n: int
    min_s: float
    max_s: float
    mean_s: float
    stddev_s: float
    median_s: float
    q1_s: float
    q3_s: float

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    @property
    def rel_iqr(self) -> float:
        """IQR over median: the noise figure the verdicts and the report use."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")

    @property
    def is_noisy(self) -> bool:
        return self.rel_iqr > NOISY_REL_IQR

    @classmethod
    def of(cls, samples: Sequence[float]) -> StepSummary:
        data = np.asarray(samples, dtype=np.float64)
        if data.size == 0:
            raise ValueError("no samples to summarise")
        q1, median, q3 = np.percentile(data, [25, 50, 75])
        return cls(
            n=int(data.size),
            min_s=float(data.min()),
            max_s=float(data.max()),
            mean_s=float(data.mean()),
            # sample stddev (ddof=1) like pytest-benchmark's statistics.stdev
            stddev_s=float(data.std(ddof=1)) if data.size > 1 else 0.0,
            median_s=float(median),
            q1_s=float(q1),
            q3_s=float(q3),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepSummary:
        return cls(**data)


def slowest_rank_steps(per_rank_step_s: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Per step, the time of the slowest rank: the step is done only when every rank is."""
    lengths = {len(steps) for steps in per_rank_step_s}
    if len(lengths) != 1:
        raise ValueError(f"ranks measured different step counts: {sorted(lengths)}")
    return tuple(float(x) for x in np.max(np.asarray(per_rank_step_s, dtype=np.float64), axis=0))
