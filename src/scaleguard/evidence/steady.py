"""When warmup is over: the test that the step times have reached a steady state.

The measuring loop (``timing.measure``) asks it after every warmup step; the parent asks it
again, on the warmup steps a rank reported, to say why a run's warmup hit its cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scaleguard.case import RunSettings


@dataclass(frozen=True)
class WarmupPolicy:
    """Warm up at least ``min_steps``; then until the last ``2 * window`` steps look like one
    steady distribution; at most ``max_steps``.

    Steady means all three, on the last two windows of steps (``before``, then ``last``):

    - *level*: their medians agree within ``tolerance``, or, when the steps are noisier than
      that, each median lies inside the other window's interquartile range (a shift smaller
      than the windows' own spread is noise, not warmup);
    - *no drift*: the Theil-Sen slope over both windows is either not significant (its 95 %
      interval contains 0) or not material (the change it fits across the ``2 * window`` steps
      is within ``tolerance`` of the median). Two window medians can agree while the steps are
      still falling slowly; a robust slope sees the trend, and one outlier cannot fake one;
    - *no burst*: the last window's upper quartile is within ``tolerance`` of the median plus
      the earlier window's upper spread: slow steps that keep recurring (allocator growth,
      autotuning of new shapes) hold warmup back even when the median has settled.
    """

    min_steps: int
    max_steps: int
    tolerance: float = 0.02
    window: int = 6

    @classmethod
    def of(cls, settings: RunSettings) -> WarmupPolicy:
        return cls(settings.warmup_min, settings.warmup_max, settings.warmup_tolerance)

    def is_steady(self, step_s: Sequence[float]) -> bool:
        return self.unsteady_because(step_s) is None

    def unsteady_because(self, step_s: Sequence[float]) -> str | None:
        """None when steady; else which test failed, with its figures (for the run's note)."""
        w = self.window
        if len(step_s) < max(self.min_steps, 2 * w):
            return f"{len(step_s)} steps, fewer than {max(self.min_steps, 2 * w)}"
        tail = np.asarray(step_s[-2 * w :], dtype=float)
        before, last = tail[:w], tail[w:]
        b25, b50, b75 = np.percentile(before, (25, 50, 75))
        l25, l50, l75 = np.percentile(last, (25, 50, 75))
        allowed = self.tolerance * b50
        if abs(l50 - b50) > allowed and not (b25 <= l50 <= b75 and l25 <= b50 <= l75):
            return (
                f"the medians of the last two {w}-step windows differ by {l50 / b50 - 1:+.1%}, beyond "
                f"{self.tolerance:.0%} and beyond each other's quartile range"
            )
        median = float(np.median(tail))
        slope = theil_sen_slope(tail)
        if abs(slope) * (2 * w - 1) > self.tolerance * median and _significant(tail):
            return f"still drifting: {slope / median:+.2%} per step over the last {2 * w} steps (Theil-Sen)"
        if l75 - l50 > max(b75 - b50, 0.0) + allowed:
            return (
                f"recurring slow steps: the last {w} steps' upper quartile is "
                f"{l75 / l50 - 1:.1%} above their median"
            )
        return None


def theil_sen_slope(y: npt.ArrayLike) -> float:
    """The Theil-Sen slope of ``y`` against its index: the median of all pairwise slopes (what
    ``scipy.stats.theilslopes`` returns as its estimate; tests hold the two equal)."""
    values = np.asarray(y, dtype=float)
    i, j = np.triu_indices(values.size, k=1)
    return float(np.median((values[j] - values[i]) / (j - i)))


def _significant(y: npt.ArrayLike) -> bool:
    """Whether the slope's 95 % interval (Sen's, from scipy) excludes 0. Asked only once a
    slope is material, so a rank whose warmup settles never imports scipy.stats (0.3-1 s)."""
    from scipy import stats as sps

    _, _, low, high = sps.theilslopes(y)
    return bool(low > 0 or high < 0)
