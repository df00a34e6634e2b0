"""Statistics from raw samples (numpy, scipy.stats): per-run step summaries, how precisely a run
pins its median, and the run-level comparison of one metric between two sets of runs.

The unit of evidence is the run: steps of one process share its CPU placement, clocks, memory
layout and cuDNN algorithm choices, so they are not independent samples of "this torch on this
machine". Within-run figures (IQR, the median's confidence interval) say how well a run pinned
its own median; whether two configurations differ is decided on run medians only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# scipy.stats is imported where it is used, not here: rank processes import this module (via
# records) and never need it on CPU, and importing it costs ~1 s of every rank's start-up on a
# 2-core machine (a third of its imports), paid again by every fresh-process confirm run.


@dataclass(frozen=True)
class StepSummary:
    """Robust and classical statistics of one run's per-step times, in seconds."""

    n: int
    min_s: float
    max_s: float
    mean_s: float
    stddev_s: float
    median_s: float
    q1_s: float
    q3_s: float
    mad_s: float = 0.0  # median absolute deviation from the median

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    @property
    def rel_iqr(self) -> float:
        """IQR over median: the within-run spread shown beside each run."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("inf")

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
            mad_s=float(np.median(np.abs(data - median))),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def slowest_rank_steps(per_rank_step_s: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Per step, the time of the slowest rank: the step is done only when every rank is."""
    lengths = {len(steps) for steps in per_rank_step_s}
    if len(lengths) != 1:
        raise ValueError(f"ranks measured different step counts: {sorted(lengths)}")
    return tuple(float(x) for x in np.max(np.asarray(per_rank_step_s, dtype=np.float64), axis=0))


def median_ci_halfwidth(samples: Sequence[float], confidence: float = 0.95) -> float:
    """Half-width of the distribution-free confidence interval of the median, relative to it.

    The interval runs between two order statistics chosen from the binomial(n, 1/2) law (the
    classic sign-test interval): exact coverage without assuming a shape, O(n log n) time and
    O(n) memory whatever the sample count, unlike a bootstrap. ``inf`` below 6 samples, where
    no such interval reaches 95 %.
    """
    data = np.sort(np.asarray(samples, dtype=np.float64))
    n = data.size
    if n < 6:
        return math.inf
    # j: smallest count with P(Bin(n, 1/2) <= j) >= alpha/2, so the j-th order statistic
    # (1-based) and its mirror cover the median with probability >= 1 - alpha
    from scipy import stats as sps

    j = int(sps.binom.ppf((1 - confidence) / 2, n, 0.5))
    lo = max(j - 1, 0)
    hi = n - 1 - lo
    median = float(np.median(data))
    return float((data[hi] - data[lo]) / 2 / median) if median > 0 else math.inf


@dataclass(frozen=True)
class Shift:
    """One metric compared at the run level: NEW runs against OLD (baseline) runs.

    Relative metrics (step time, memory) are compared on log values, so ``change`` is the ratio
    of geometric means minus 1 and ``spread`` is the run-to-run standard deviation of the log
    (about the relative spread). Absolute metrics (scaling efficiency) use points.
    """

    change: float  # NEW vs OLD: ratio - 1 (relative) or difference (absolute)
    ci: tuple[float, float]  # 95 % interval of ``change``
    p_up: float  # one-sided p that NEW is larger than OLD
    p_down: float  # one-sided p that NEW is smaller than OLD
    spread: float  # run-to-run standard deviation of the case: the larger of the pooled one
    # (used by the test) and the baseline's own, so tight new runs of one session cannot
    # shrink the guard against between-session drift
    spread_assumed: bool  # True: the baseline was too young to measure it; a prior was used
    n_new: int
    n_old: int
    se: float = 0.0  # standard error of ``diff`` (log or points) the test used
    session_spread: float = 0.0  # the between-session component the test assumed (0: none)

    @property
    def spread_of_runs(self) -> float:
        """The run-level part of ``spread`` (all of it unless a session component was assumed)."""
        return math.sqrt(max(self.spread**2 - self.session_spread**2, 0.0))


def run_shift(
    new: Sequence[float],
    old: Sequence[float],
    *,
    relative: bool,
    prior_spread: float,
    min_spread: float,
    young: bool,
    session_spread: float = 0.0,
    run_spread: float = 0.0,
) -> Shift:
    """Compare per-run values of one metric with a pooled two-sample t test on run values.

    With one new run this is the prediction interval of a new run from the baseline runs. While
    the baseline is ``young`` (too few runs or sessions to know its own run-to-run spread, which
    is mostly between sessions), the spread is at least ``prior_spread`` and is treated as known
    (normal law): conservative, and said in the verdict.

    Args:
        relative: compare logs (step time, memory) rather than values (efficiency).
        prior_spread: the device's assumed run-to-run spread, used while ``young``.
        min_spread: floor on the measured spread: a few baseline runs that happen to agree
            must not make a tiny change look certain.
        session_spread: the between-session component of the spread, measured per device
            (0: not known). With it, a young comparison is a two-level one: each side's runs
            share one session's offset, which more runs do not average away, so
            se^2 = 2 x session^2 + run^2 x (1/m + 1/k), the run-level spread measured within
            the sessions (pooled, floored at ``run_spread``, the device's measured one) or
            ``prior_spread`` where no run has a twin.
            Without it, ``prior_spread`` is taken as a run-level spread, which makes the
            error of a mean of runs from one session too small, and the k x spread guard
            (on the whole spread) must make up for it at a cost in power.
    """
    x = np.log(np.asarray(new, dtype=np.float64)) if relative else np.asarray(new, dtype=np.float64)
    y = np.log(np.asarray(old, dtype=np.float64)) if relative else np.asarray(old, dtype=np.float64)
    m, k = x.size, y.size
    if m == 0 or k == 0:
        raise ValueError("run_shift needs at least one run on each side")
    diff = float(x.mean() - y.mean())
    df = m + k - 2
    ss = float(((x - x.mean()) ** 2).sum() + ((y - y.mean()) ** 2).sum())
    measured = math.sqrt(ss / df) if df > 0 else 0.0
    two_level = young and session_spread > 0
    if two_level:
        run_level = max(measured, run_spread, min_spread) if df > 0 else prior_spread
        se = math.sqrt(2 * session_spread**2 + run_level**2 * (1 / m + 1 / k))
        # what one run of one session spreads by between sessions; the baseline's own few runs
        # are in ``measured`` already, so its own spread is no separate guard here
        spread, dist_df = math.hypot(session_spread, run_level), math.inf
    else:
        if young or df == 0:
            spread, dist_df = max(measured, prior_spread, min_spread), math.inf
        else:
            spread, dist_df = max(measured, min_spread), float(df)
        se = spread * math.sqrt(1 / m + 1 / k)
        # tight new runs of one session cannot shrink the guard below the baseline's own spread
        spread = max(spread, float(np.std(y, ddof=1)) if k >= 2 else 0.0)
    from scipy import stats as sps

    law = sps.norm if math.isinf(dist_df) else sps.t(dist_df)
    t_stat = diff / se
    half = float(law.ppf(0.975)) * se
    low, high = diff - half, diff + half
    if relative:
        change, ci = math.expm1(diff), (math.expm1(low), math.expm1(high))
    else:
        change, ci = diff, (low, high)
    return Shift(
        change=change,
        ci=ci,
        p_up=float(law.sf(t_stat)),
        p_down=float(law.cdf(t_stat)),
        spread=spread,
        spread_assumed=young or df == 0,
        n_new=m,
        n_old=k,
        se=se,
        session_spread=session_spread if two_level else 0.0,
    )
