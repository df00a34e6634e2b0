"""Verdicts: did a case get slower, scale worse or use more memory than its baseline?

A change counts only when it is both *practically* large (over a threshold) and *statistically*
real on the raw per-step samples (one-sided Mann-Whitney U, scipy.stats). When the bootstrap
confidence interval of the median ratio is too wide to resolve a threshold-sized change, the
verdict is NOISY: the suite says it cannot judge instead of guessing.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np
from scipy import stats as sps

from scaleguard.baseline import CaseRecord


class Status(str, Enum):
    OK = "OK"
    REGRESSED = "REGRESSED"
    IMPROVED = "IMPROVED"
    NOISY = "NOISY"
    NEW = "NEW"


@dataclass(frozen=True)
class Thresholds:
    step: float = 0.05  # relative change of the median step time
    efficiency: float = 0.03  # absolute points of scaling efficiency
    memory: float = 0.10  # relative change of peak memory
    alpha: float = 0.01  # significance level of the one-sided Mann-Whitney U test

    @classmethod
    def for_device(cls, device: str) -> Thresholds:
        """Defaults per device. CUDA: 5 % / 3 points / 10 %. CPU (gloo, shared cores): medians
        of identical runs on a 2-core VM moved by up to 19 % between runs, far more than the
        within-run samples show, so a 5 % threshold there raises false alarms; 25 % / 20 points."""
        if device == "cpu":
            return cls(step=0.25, efficiency=0.20)
        return cls()

    @classmethod
    def parse_overrides(cls, base: Thresholds, text: str) -> Thresholds:
        """``step=0.08 efficiency=0.05`` -> a copy of ``base`` with those values."""
        values: dict[str, float] = {}
        for item in text.split():
            key, _, value = item.partition("=")
            if key not in ("step", "efficiency", "memory", "alpha"):
                raise ValueError(f"unknown threshold {key!r} in {text!r}")
            values[key] = float(value)
        return replace(base, **values)


def thresholds_for(case_id: str, default: Thresholds, per_case: list[str]) -> Thresholds:
    """Per-case overrides: lines ``<glob> step=0.08 ...``; the last matching line wins."""
    chosen = default
    for line in per_case:
        pattern, _, rest = line.strip().partition(" ")
        if pattern and fnmatch.fnmatchcase(case_id, pattern):
            chosen = Thresholds.parse_overrides(default, rest)
    return chosen


@dataclass(frozen=True)
class Verdict:
    case_id: str
    status: Status
    story: str
    step_change: float | None = None  # median ratio - 1
    p_value: float | None = None
    ci: tuple[float, float] | None = None  # bootstrap 95 % CI of the median ratio
    baseline: CaseRecord | None = None
    scaling_regression: bool = False

    @property
    def failed(self) -> bool:
        return self.status is Status.REGRESSED


def _median_ratio_ci(new: np.ndarray, old: np.ndarray, seed: int = 0) -> tuple[float, float]:
    def ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(a, axis=axis) / np.median(b, axis=axis)

    result = sps.bootstrap(
        (new, old),
        ratio,
        n_resamples=2000,
        confidence_level=0.95,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def median_ci_halfwidth(samples: tuple[float, ...] | np.ndarray, seed: int = 0) -> float:
    """Half-width of the bootstrap 95 % CI of the median, relative to the median: how precisely
    a run pins its own step time (a baseline must be pinned tighter than the threshold)."""
    data = np.asarray(samples, dtype=np.float64)
    if data.size < 3:
        return float("inf")
    result = sps.bootstrap(
        (data,),
        np.median,
        n_resamples=2000,
        confidence_level=0.95,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval.low, result.confidence_interval.high
    return float((high - low) / 2 / np.median(data))


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def judge(
    new: CaseRecord,
    old: CaseRecord | None,
    thresholds: Thresholds,
    ws1_status: Status | None = None,
    new_reason: str = "no baseline",
) -> Verdict:
    """Compare ``new`` with ``old``.

    Args:
        ws1_status: verdict of the world-size-1 case of the same group in the same run; an
            efficiency drop while it is OK is named a scaling regression.
        new_reason: why there is no baseline, for the NEW verdict.
    """
    if old is None:
        return Verdict(new.case_id, Status.NEW, f"{new.case_id} NEW: {new_reason}")
    if old.config != new.config:
        diff = ", ".join(
            f"{k} {old.config.get(k)!r} -> {new.config.get(k)!r}"
            for k in sorted(set(old.config) | set(new.config))
            if old.config.get(k) != new.config.get(k)
        )
        return Verdict(
            new.case_id,
            Status.NEW,
            f"{new.case_id} NEW: configuration differs from the baseline ({diff}); not compared",
        )
    a, b = np.asarray(new.step_s), np.asarray(old.step_s)
    ratio = float(np.median(a) / np.median(b))
    change = ratio - 1
    p_slower = float(sps.mannwhitneyu(a, b, alternative="greater").pvalue)
    p_faster = float(sps.mannwhitneyu(a, b, alternative="less").pvalue)
    ci = _median_ratio_ci(a, b)
    versions = f"torch {old.torch} -> {new.torch}" if old.torch != new.torch else f"torch {new.torch}"
    step_text = f"step {_fmt_ms(new.summary.median_s)} vs {_fmt_ms(old.summary.median_s)} ({change:+.1%}"
    reasons: list[str] = []
    scaling = False
    # within-run spread wider than the threshold: the samples cannot resolve such a change, and
    # such cases (e.g. host-bound small batches on a GPU) also move most between runs
    noise = max(new.summary.rel_iqr, old.summary.rel_iqr)
    judgeable = noise <= thresholds.step
    slower = judgeable and change > thresholds.step and p_slower < thresholds.alpha
    if slower:
        reasons.append(f"{step_text}, p={p_slower:.1g})")
    eff_new, eff_old = new.scaling_efficiency, old.scaling_efficiency
    eff_text = ""
    if eff_new is not None and eff_old is not None and new.world_size > 1:
        eff_text = f"efficiency {eff_old:.2f} -> {eff_new:.2f}"
        if judgeable and eff_old - eff_new > thresholds.efficiency and p_slower < thresholds.alpha:
            scaling = ws1_status in (Status.OK, Status.IMPROVED)
            label = (
                "scaling regression: ws1 unchanged"
                if scaling
                else "ws1 too noisy to tell"
                if ws1_status is Status.NOISY
                else "ws1 changed too"
            )
            if not slower:
                reasons.append(f"{step_text}, p={p_slower:.1g})")
            reasons.append(f"{eff_text} ({label})")
    mem_change = new.peak_mem_bytes / old.peak_mem_bytes - 1 if old.peak_mem_bytes else 0.0
    if mem_change > thresholds.memory:
        reasons.append(
            f"peak memory {old.peak_mem_bytes / 2**20:.0f} -> "
            f"{new.peak_mem_bytes / 2**20:.0f} MiB ({mem_change:+.1%})"
        )
    if reasons:
        status = Status.REGRESSED
        if new.throttled or old.throttled:
            # a throttled GPU is slower for reasons outside the code under test
            status = Status.NOISY
            reasons.append("measured while throttled: not judged")
        story = f"{new.case_id} {status.value}: " + "; ".join(reasons) + f"; {versions}"
        return Verdict(new.case_id, status, story, change, p_slower, ci, old, scaling)
    if not judgeable:
        story = (
            f"{new.case_id} NOISY: {step_text}), but IQR/median is {new.summary.rel_iqr:.1%} "
            f"now and {old.summary.rel_iqr:.1%} in the baseline, wider than the "
            f"{thresholds.step:.0%} threshold: cannot judge"
        )
        return Verdict(new.case_id, Status.NOISY, story, change, p_slower, ci, old)
    if change < -thresholds.step and p_faster < thresholds.alpha:
        story = f"{new.case_id} IMPROVED: {step_text}, p={p_faster:.1g}); {versions}"
        return Verdict(new.case_id, Status.IMPROVED, story, change, p_faster, ci, old)
    if (ci[1] - ci[0]) / 2 > thresholds.step:
        story = (
            f"{new.case_id} NOISY: {step_text}), but the 95 % CI of the ratio "
            f"[{ci[0]:.3f}, {ci[1]:.3f}] is wider than +/-{thresholds.step:.0%}: cannot judge"
        )
        return Verdict(new.case_id, Status.NOISY, story, change, p_slower, ci, old)
    story = f"{new.case_id} OK: {step_text})" + (f"; {eff_text}" if eff_text else "")
    return Verdict(new.case_id, Status.OK, story, change, min(p_slower, p_faster), ci, old)
