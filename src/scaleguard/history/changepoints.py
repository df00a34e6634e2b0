"""Change points of a nightly series: pure statistics over a list of numbers, apart from storage
(as asv's ``step_detect.py``); the history module reads the nights, this module finds the steps.

The method, chosen by measurement against Apache Otava 0.8 (``benchmarks/otava_vs_scaleguard.py``,
``docs/measured.md``):

1. **Candidates, top-down, never stopping at a failed split.** Each segment is split where two
   medians fit it best (least absolute deviation), and both sides are split again until they
   are shorter than ``2 x min_size`` -- significant or not. Binary segmentation that stops at
   the first insignificant split misses a step hidden behind it (a regress-then-fix bump, a
   small step beside a large one). Medians place a step at the step: an outlier night adds its
   distance whichever side it lies on, where it drags a mean (Welch's t put the change on a
   -41 % night ten nights before a real -11 % step).
2. **Merge, bottom-up** (the merge step of Otava's Hunter paper): every candidate is tested
   against its neighbours' segments with a t test on trimmed means (Yuen's, 10 % trimmed where a
   side holds an outlier night, with one pooled winsorised variance: an outlier night neither
   makes nor hides a step, and a short side whose few nights happen to agree cannot make a
   chance difference significant); the p-value allows for the search; the weakest
   candidate (largest p-value, then smallest magnitude) is removed and its neighbours
   re-tested, until every one left is significant (``max_pvalue``) and material
   (``min_magnitude``, the relative change of the level).
3. **Placement refined**: each kept change point is re-placed where two medians fit best between
   its neighbours, then moved at most ``REFINE_NIGHTS`` to where two means fit best (medians
   locate robustly, means efficiently in heavy noise), and every point is re-tested.

Honest limits: a level needs ``min_size`` nights on each side; a series of fewer than
``2 x min_size`` nights has no change point; a slow drift shows as few steps, never as a trend.
Values are step times (positive, finite; compared as log ratios) unless ``scale="linear"``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

SCALES = ("log", "linear")
SEARCH_EXPONENT = 0.5  # p x places^0.5: chosen by measurement (docs/measured.md, change points)


class SeriesError(ValueError):
    """A series or a setting the detector cannot use; the message says which and why."""


@dataclass(frozen=True)
class Step:
    """One change of level: ``index`` is the first value of the new level."""

    index: int
    change: float  # relative change of the level (after / before - 1)
    p_value: float


def detect(
    values: Sequence[float] | np.ndarray,
    max_pvalue: float = 0.001,
    min_magnitude: float = 0.0,
    min_size: int = 3,
    scale: str = "log",
    trim: float = 0.1,
    memo: Memo | None = None,
) -> list[Step]:
    """Where the level of ``values`` changed, in order. A series longer than ``LONG_SERIES``
    takes its candidates block by block (``_block_candidates``); ``memo`` keeps a block's
    between calls (the same answer with or without it).

    Raises:
        SeriesError: a value that is not finite (or not positive on the log scale), ``min_size``
            below 2, a p-value bound outside (0, 1), a negative magnitude, an unknown scale.
    """
    x = _checked(values, max_pvalue, min_magnitude, min_size, scale, trim)
    if x.size < 2 * min_size or _flat(x.max() - x.min(), x):
        return []  # a constant series has no change, whatever rounding did to its logs
    if x.size > LONG_SERIES:
        candidates = _block_candidates(x, min_size, trim, scale, memo)
    else:
        candidates = _candidates(x, min_size)
    kept = _merge(x, candidates, max_pvalue, min_magnitude, trim, scale, min_size)
    kept = _refine(x, kept, min_size)
    kept = _merge(x, kept, max_pvalue, min_magnitude, trim, scale, min_size)
    bounds = [0, *kept, x.size]
    steps = []
    for i, index in enumerate(kept):
        p, change = _searched_test(x[bounds[i] : index], x[index : bounds[i + 2]], trim, scale, min_size)
        steps.append(Step(index, change, p))
    return steps


class Memo(Protocol):
    """Where a block's candidates are kept between views (``scaleguard.history.memo``): by a
    digest of everything they depend on, so a stale or foreign entry can never be found."""

    def get(self, digest: str) -> list[int] | None: ...

    def put(self, digest: str, found: list[int]) -> None: ...


# Years of nights. The top-down search costs ~33 us a night (0.33 s for 10,000 on the 2-core
# VM), so a view of 50 such cases took 15 s, every time. Above LONG_SERIES nights the candidates
# come block by block: blocks of BLOCK nights at fixed places from the first night, each reaching
# BLOCK_OVERLAP nights into the next (a step at a block's edge still has nights on both sides in
# one block), each searched as a series of its own and kept where it holds at CANDIDATE_P within
# the block. A block's candidates depend on its values alone, so a view after one more night
# searches the last block only and takes the others from the memo; the merge (step 2) then runs
# over the whole series with the real thresholds, exactly as for a short series. What a block
# cannot see: a step that is significant only over more than a block's nights (a change far
# below the noise; the smallest change a case may call is its step threshold, 3 % or 10 %).
# Measured against the whole-series search: benchmarks/changepoints_long.py, docs/measured.md
LONG_SERIES = 2048
BLOCK = 512
BLOCK_OVERLAP = 64
CANDIDATE_P = 0.05
BLOCK_VERSION = 1  # in every digest: a change to the block search makes every memo entry unfindable
# in every kept answer's digest (``history.analysis.series_digest``): bump it with any change to
# what ``detect`` answers that its tunables (the constants here) do not show
ANSWER_VERSION = 1


def _blocks(x: np.ndarray, min_size: int, trim: float, scale: str) -> Iterator[tuple[int, np.ndarray, str]]:
    """Each block of a long series: (its first night, its values, its memo key)."""
    import hashlib

    for start in range(0, x.size, BLOCK):
        end = min(x.size, start + BLOCK + BLOCK_OVERLAP)
        block = x[start:end]
        if block.size < 2 * min_size:
            return
        digest = hashlib.sha256(
            f"{BLOCK_VERSION}|{min_size}|{trim!r}|{scale}|{CANDIDATE_P!r}|".encode() + block.tobytes()
        ).hexdigest()
        yield start, block, digest
        if end == x.size:
            return


def block_keys(
    values: Sequence[float], min_size: int = 3, scale: str = "log", trim: float = 0.1
) -> list[tuple[str, bool]]:
    """The memo keys ``detect`` will ask for, with the same settings: one per block of a series
    longer than ``LONG_SERIES`` (none for a shorter one), each with whether the block is whole
    (all its nights in: once the series has grown past it, its key and candidates never
    change, so it is worth keeping where every viewer finds it). A series ``detect`` would
    refuse has none."""
    try:
        x = _checked(values, 0.5, 0.0, min_size, scale, trim)
    except SeriesError:
        return []
    if x.size <= LONG_SERIES or _flat(x.max() - x.min(), x):
        return []
    blocks = _blocks(x, min_size, trim, scale)
    return [(digest, block.size == BLOCK + BLOCK_OVERLAP) for _, block, digest in blocks]


def _block_candidates(x: np.ndarray, min_size: int, trim: float, scale: str, memo: Memo | None) -> list[int]:
    found: set[int] = set()
    for start, block, digest in _blocks(x, min_size, trim, scale):
        kept = memo.get(digest) if memo is not None else None
        if kept is None or any(not (min_size <= k <= block.size - min_size) for k in kept):
            kept = []
            if not _flat(block.max() - block.min(), block):
                candidates = _candidates(block, min_size)
                kept = _merge(block, candidates, CANDIDATE_P, 0.0, trim, scale, min_size)
            if memo is not None:
                memo.put(digest, kept)
        found.update(start + k for k in kept)
    out: list[int] = []
    for k in sorted(found):  # two blocks' views of one step (their overlap): the first kept
        if min_size <= k <= x.size - min_size and (not out or k - out[-1] >= min_size):
            out.append(k)
    return out


def _checked(
    values: Sequence[float] | np.ndarray,
    max_pvalue: float,
    min_magnitude: float,
    min_size: int,
    scale: str,
    trim: float,
) -> np.ndarray:
    if scale not in SCALES:
        raise SeriesError(f"scale {scale!r}: choose from {', '.join(SCALES)}")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 2:
        raise SeriesError(
            f"min_size {min_size!r}: a level needs at least 2 values (1 makes every value a step)"
        )
    if not 0 < max_pvalue < 1:
        raise SeriesError(f"max_pvalue {max_pvalue!r}: must lie in (0, 1)")
    if not (math.isfinite(min_magnitude) and min_magnitude >= 0):
        raise SeriesError(f"min_magnitude {min_magnitude!r}: must be a finite number >= 0")
    if not 0 <= trim < 0.5:
        raise SeriesError(f"trim {trim!r}: must lie in [0, 0.5)")
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise SeriesError("values must be numbers") from None
    if x.ndim != 1:
        raise SeriesError("values must be one series of numbers")
    bad = ~np.isfinite(x)
    if bad.any():
        raise SeriesError(f"value {x[bad][0]!r} at index {int(np.argmax(bad))} is not a finite number")
    if scale == "log":
        if (x <= 0).any():
            at = int(np.argmax(x <= 0))
            raise SeriesError(
                f"value {x[at]!r} at index {at}: step times are positive "
                "(use scale='linear' for other metrics)"
            )
        x = np.log(x)
    return x


def _prefix_l1(a: np.ndarray) -> np.ndarray:
    """``out[k-1]`` = sum of |a_i - median(a_0..a_{k-1})| over the first k values, for every k
    (two heaps keep the running median and the sums on each side: O(m log m); one push-pop a
    value, the hot loop of the search)."""
    return np.asarray(_prefix_l1_list(a.tolist()))


def _prefix_l1_list(values: list[float]) -> list[float]:
    from heapq import heappush, heappushpop

    low: list[float] = []  # max-heap (negated): the lower half, its top the median
    high: list[float] = []  # min-heap: the upper half
    s_low = s_high = 0.0
    out = []
    for k, value in enumerate(values):
        if k % 2 == 0:  # halves equal: the value goes through the upper half, its least moves down
            moved = heappushpop(high, value) if high else value
            heappush(low, -moved)
            s_high += value - moved
            s_low += moved
            n_low = n_high = k // 2
            n_low += 1
        else:  # the lower half is one longer: the value goes through it, its greatest moves up
            moved = -heappushpop(low, -value)
            heappush(high, moved)
            s_low += value - moved
            s_high += moved
            n_low = n_high = (k + 1) // 2
        median = -low[0]
        out.append(median * n_low - s_low + s_high - median * n_high)
    return out


def _best_split(seg: np.ndarray, min_size: int) -> tuple[int, float]:
    """(split, gain): where two medians fit ``seg`` best (least absolute deviation), leaving
    ``min_size`` values on each side, and how much that beats one median. Medians, not means:
    an outlier night adds its distance whichever side it is on, so it cannot pull the split
    to itself; absolute deviations, not ranks: a rank statistic is largest at the middle of a
    perfectly separated series and put a step two nights late."""
    at, gain, _, _ = _search(seg, min_size)
    return at, gain


def _as_list(costs: Any) -> list[float]:
    return costs.tolist() if isinstance(costs, np.ndarray) else costs


def _search(
    seg: np.ndarray, min_size: int, ahead: Any = None, behind: Any = None
) -> tuple[int, float, Any, Any]:
    """``_best_split`` with its cost arrays: ``ahead[k-1]`` the cost of the first k values,
    ``behind[k]`` of the values from k on. A child segment shares one of them with its parent
    (the left child's costs ahead are the parent's, cut; the right child's behind too), so the
    top-down search passes them down and computes only the other: half the search's work, the
    same numbers. Long segments (``_long_split``) have none."""
    m = seg.size
    if m > EXACT_SPLIT_MAX:
        at, gain = _long_split(seg, min_size)
        return at, gain, None, None
    if m <= SMALL:  # most segments of a long series: lists, without numpy's cost per call
        values = seg.tolist()
        ahead = _prefix_l1_list(values) if ahead is None else _as_list(ahead)
        # behind[k] = cost of values[k:]
        behind = _prefix_l1_list(values[::-1])[::-1] if behind is None else _as_list(behind)
        at = min(range(min_size, m - min_size + 1), key=lambda k: ahead[k - 1] + behind[k])
        return at, ahead[-1] - (ahead[at - 1] + behind[at]), ahead, behind
    left = _prefix_l1(seg) if ahead is None else np.asarray(ahead)
    right = _prefix_l1(seg[::-1])[::-1] if behind is None else np.asarray(behind)  # right[k]: seg[k:]
    splits = np.arange(min_size, m - min_size + 1)
    cost = left[splits - 1] + right[splits]
    at = int(np.argmin(cost))
    return int(splits[at]), float(left[-1] - cost[at]), left, right


EXACT_SPLIT_MAX = 1024  # nights: the exact search above this is the detector's whole cost
COARSE_BLOCKS = 256


def _long_split(seg: np.ndarray, min_size: int) -> tuple[int, float]:
    """``_best_split`` of a long segment (years of nights) in numpy time: the exact search over
    ``COARSE_BLOCKS`` block medians places the split to a block, then two rounds over every
    split with each side's median held fixed (least absolute deviation again, so an outlier
    night still cannot pull it) place it to the night. Series up to ``EXACT_SPLIT_MAX`` nights,
    every Otava benchmark series among them, never come here."""
    m = seg.size
    width = -(-m // COARSE_BLOCKS)
    blocks = m // width
    medians = np.median(seg[: blocks * width].reshape(blocks, width), axis=1)
    at = _best_split(medians, 1)[0] * width
    splits = np.arange(min_size, m - min_size + 1)
    at = int(min(max(at, min_size), m - min_size))
    cost = np.zeros(1)
    for _ in range(2):
        left = np.concatenate(([0.0], np.cumsum(np.abs(seg - np.median(seg[:at])))))
        right = np.concatenate(([0.0], np.cumsum(np.abs(seg - np.median(seg[at:])))))
        cost = left[splits] + (right[-1] - right[splits])
        at = int(splits[int(np.argmin(cost))])
    whole = float(np.abs(seg - np.median(seg)).sum())
    return at, whole - float(cost.min())


BALANCED_MIN = 1024  # nights: a longer segment split near an edge is also halved
EDGE_PART = 8  # "near an edge": within 1/8 of the segment's length


def _candidates(x: np.ndarray, min_size: int) -> list[int]:
    """Every split of the top-down search, significant or not (sorted)."""
    found: list[int] = []
    # (lo, hi, costs ahead, costs behind): the costs a segment shares with its parent, or None
    stack: list[tuple[int, int, Any, Any]] = [(0, x.size, None, None)]
    while stack:
        lo, hi, ahead, behind = stack.pop()
        if hi - lo < 2 * min_size:
            continue
        m = hi - lo
        at, _, ahead, behind = _search(x[lo:hi], min_size, ahead, behind)
        found.append(lo + at)

        edge = min(at, m - at)
        if m > BALANCED_MIN and edge < m // EDGE_PART:
            # a split near an edge leaves one side almost as long as the segment: splitting off a
            # few nights at a time made the search quadratic (a 10,000-night series of rounded
            # or rippled values took a second). The long side is also halved, so every night
            # lies in O(log n) searched segments; the edge's own few nights are searched alone
            mid = m // 2
            if at < mid:
                parts = [(0, at), (at, mid), (mid, m)]
            else:
                parts = [(0, mid), (mid, at), (at, m)]
        else:
            parts = [(0, at), (at, m)]
        for a, b in parts:  # the first part shares the costs ahead, the last those behind
            stack.append((
                lo + a, lo + b,
                ahead[:b] if a == 0 and ahead is not None else None,
                behind[a:] if b == m and behind is not None else None,
            ))  # fmt: skip
    return sorted(found)


OUTLIER_MADS = 4.0  # a value this many robust standard deviations from its side's median


def _trimmed(a: np.ndarray, trim: float) -> tuple[float, float, int]:
    """(trimmed mean, winsorised variance, effective count) of ``a`` (Yuen 1974); trimmed only
    when ``a`` holds an outlier (beyond ``OUTLIER_MADS`` robust standard deviations of its
    median): clean data keeps the plain mean's full power."""
    n = a.size
    if n <= SMALL:
        return _trimmed_small(sorted(a.tolist()), trim)
    s = np.sort(a)
    median = _sorted_median(s)
    deviations = np.abs(s - median)
    mad = 1.4826 * _sorted_median(np.sort(deviations))
    clean = mad > 0 and float(deviations.max()) <= OUTLIER_MADS * mad
    g = 0 if clean else max(1 if n >= 5 else 0, math.floor(trim * n))
    mean = float(s[g : n - g].mean())
    if g:
        s[:g], s[n - g :] = s[g], s[n - g - 1]
    var = float(s.var(ddof=1)) if n > 1 else 0.0
    if var <= (1e-12 * max(1.0, abs(mean))) ** 2:
        var = 0.0  # rounding of equal values (2e-31 for ten equal logs): flat is flat
    return mean, var, n - 2 * g


SMALL = 48  # below this many values, plain Python beats numpy's per-call cost (most tests)


def _trimmed_small(s: list[float], trim: float) -> tuple[float, float, int]:
    """``_trimmed`` of a short sorted list, the same arithmetic without numpy."""
    n = len(s)
    half = n // 2
    median = s[half] if n % 2 else 0.5 * (s[half - 1] + s[half])
    deviations = sorted(abs(v - median) for v in s)
    mad = 1.4826 * (deviations[half] if n % 2 else 0.5 * (deviations[half - 1] + deviations[half]))
    clean = mad > 0 and deviations[-1] <= OUTLIER_MADS * mad
    g = 0 if clean else max(1 if n >= 5 else 0, math.floor(trim * n))
    kept = s[g : n - g]
    mean = math.fsum(kept) / len(kept)
    if g:
        s = [s[g]] * g + kept + [s[n - g - 1]] * g
    if n > 1:
        w_mean = math.fsum(s) / n
        var = math.fsum((v - w_mean) ** 2 for v in s) / (n - 1)
    else:
        var = 0.0
    if var <= (1e-12 * max(1.0, abs(mean))) ** 2:
        var = 0.0  # rounding of equal values (2e-31 for ten equal logs): flat is flat
    return mean, var, n - 2 * g


def _sorted_median(s: np.ndarray) -> float:
    n = s.size
    return float(s[n // 2]) if n % 2 else 0.5 * float(s[n // 2 - 1] + s[n // 2])


def _flat(difference: float, x: np.ndarray) -> bool:
    """Two levels (or a whole series) that differ by rounding alone: equal values whose trimmed
    means differ in the last bit (``detect([5.0] * 30)`` read a step at p = 0)."""
    return abs(float(difference)) <= 1e-12 * max(1.0, float(np.abs(x).max()))


def _test(left: np.ndarray, right: np.ndarray, trim: float, scale: str) -> tuple[float, float]:
    """(two-sided p-value, relative change of the level) of ``right`` against ``left``: a t test
    on trimmed means (Yuen's, trimmed only where a side holds an outlier) with one pooled
    winsorised variance. Two flat sides are decided exactly: the same level is p = 1, two
    different levels p = 0 (a NaN p-value must never read as a change)."""
    return _test_of((*_trimmed(left, trim), left.size), (*_trimmed(right, trim), right.size), scale)


Side = tuple[float, float, int, int]  # a segment's (trimmed mean, winsorised variance, h, n)


def _test_of(left: Side, right: Side, scale: str) -> tuple[float, float]:
    """``_test`` from each side's statistics (the merge computes a segment's once)."""
    from scipy.special import stdtr

    m1, v1, h1, n1 = left
    m2, v2, h2, n2 = right
    if v1 == 0 and v2 == 0 and abs(m2 - m1) <= 1e-12 * max(1.0, abs(m1), abs(m2)):
        return 1.0, 0.0
    if scale == "log":
        change = math.expm1(m2 - m1)
    elif m1 != 0:
        change = m2 / m1 - 1.0
    else:
        change = 0.0 if m2 == 0 else math.copysign(math.inf, m2)
    # one variance for both sides (pooled, as Otava's Student t): a short side whose few values
    # happen to lie close together must not make a chance difference "significant" (Welch's
    # separate variances did: 3 nights of 4 % noise read p = 5e-7 against 57 others)
    df = h1 + h2 - 2
    if df < 1:
        return 1.0, change
    pooled = ((n1 - 1) * v1 + (n2 - 1) * v2) / (n1 + n2 - 2)
    se2 = pooled * ((n1 - 1) / (h1 * (h1 - 1)) if h1 > 1 else 0.0) + pooled * (
        (n2 - 1) / (h2 * (h2 - 1)) if h2 > 1 else 0.0
    )
    if se2 <= 0:
        return (1.0 if m1 == m2 else 0.0), change
    t = abs(m2 - m1) / math.sqrt(se2)
    return float(2 * stdtr(df, -t)), change


def _searched_test(
    left: np.ndarray, right: np.ndarray, trim: float, scale: str, min_size: int
) -> tuple[float, float]:
    """``_test`` for a split that was searched for: the split is the best of every place it could
    have gone between its neighbours, so one test's p-value overstates it. It is multiplied by
    ``places ** SEARCH_EXPONENT``: neighbouring splits are strongly correlated, so the full
    Bonferroni factor (exponent 1) cost detection in heavy noise (190 of 200 steps at 12 %)
    and none at all let noise through (9 false change points in 200 flat series at 12 %);
    0.5 kept 193 of 200 with 2 (docs/measured.md)."""
    p, change = _test(left, right, trim, scale)
    return min(1.0, p * _places(left.size + right.size, min_size) ** SEARCH_EXPONENT), change


def _places(nights: int, min_size: int) -> int:
    """Where a split of ``nights`` could go, each side keeping ``min_size``."""
    return max(1, nights - 2 * min_size + 1)


def _magnitude(change: float) -> float:
    """Otava's: the larger of the forward and backward relative change."""
    if not math.isfinite(change):
        return math.inf
    return max(abs(change), abs(1 / (1 + change) - 1)) if change > -1 else math.inf


def _merge(
    x: np.ndarray,
    points: list[int],
    max_pvalue: float,
    min_magnitude: float,
    trim: float,
    scale: str,
    min_size: int,
) -> list[int]:
    """Remove the weakest point until every point left is significant and material. The points
    are a linked list and the weakest comes from two heaps (by p-value, by magnitude; stale
    entries skipped): a removal re-tests its two neighbours only, and finding the weakest is
    O(log n), where scanning every point made 20,000 nights quadratic."""
    from heapq import heappop, heappush

    n = len(points)
    bounds = [0, *points, x.size]  # node j in 1..n is points[j - 1]; 0 and n + 1 are the ends
    # a segment's statistics do not change until it is merged: computed once, shared by the
    # points either side of it (a removal computes one new segment, not four sides)
    sides: dict[tuple[int, int], Side] = {}

    def side(lo: int, hi: int) -> Side:
        found = sides.get((lo, hi))
        if found is None:
            found = sides[(lo, hi)] = (*_trimmed(x[lo:hi], trim), hi - lo)
        return found

    prev, after = list(range(-1, n + 1)), list(range(1, n + 3))
    alive = [True] * (n + 2)
    version = [0] * (n + 2)
    by_p: list[tuple[float, int, int]] = []  # (-p, node, version): the largest p first
    by_magnitude: list[tuple[float, int, int]] = []  # (magnitude, node, version): the smallest

    def score(j: int) -> None:
        lo, mid, hi = bounds[prev[j]], bounds[j], bounds[after[j]]
        p, change = _test_of(side(lo, mid), side(mid, hi), scale)
        p = min(1.0, p * _places(hi - lo, min_size) ** SEARCH_EXPONENT)  # as _searched_test
        version[j] += 1
        heappush(by_p, (-p, j, version[j]))
        heappush(by_magnitude, (_magnitude(change), j, version[j]))

    def top(heap: list[tuple[float, int, int]]) -> tuple[float, int]:
        while not alive[heap[0][1]] or heap[0][2] != version[heap[0][1]]:
            heappop(heap)
        return heap[0][0], heap[0][1]

    for j in range(1, n + 1):
        score(j)
    left = n
    while left:
        neg_p, weakest = top(by_p)
        if -neg_p < max_pvalue:
            magnitude, weakest = top(by_magnitude)
            if magnitude >= min_magnitude:
                break
        alive[weakest] = False
        left -= 1
        before, nxt = prev[weakest], after[weakest]
        after[before], prev[nxt] = nxt, before
        for j in (before, nxt):
            if 1 <= j <= n:
                score(j)
    return [bounds[j] for j in range(1, n + 1) if alive[j]]


REFINE_NIGHTS = 3  # how far a kept point may move when it is re-placed by the means


def _refine(x: np.ndarray, points: list[int], min_size: int) -> list[int]:
    """Each point re-placed: first where two medians fit best between its neighbours (robust:
    an outlier night cannot pull it), then, within ``REFINE_NIGHTS`` of that, where two means
    do (least squares locates a step in heavy noise better than absolute deviations; the short
    reach keeps an outlier night further away from capturing the step)."""
    points = list(points)
    for i in range(len(points)):
        lo = points[i - 1] if i else 0
        hi = points[i + 1] if i + 1 < len(points) else x.size
        if hi - lo < 2 * min_size:
            continue
        seg = x[lo:hi]
        at = _best_split(seg, min_size)[0]
        first, last = max(min_size, at - REFINE_NIGHTS), min(seg.size - min_size, at + REFINE_NIGHTS)
        splits = np.arange(first, last + 1)
        c1, c2 = np.cumsum(seg), np.cumsum(seg * seg)
        n_left, n_right = splits.astype(np.float64), (seg.size - splits).astype(np.float64)
        s_left = c1[splits - 1]
        sse = c2[-1] - s_left**2 / n_left - (c1[-1] - s_left) ** 2 / n_right
        points[i] = lo + int(splits[int(np.argmin(sse))])
    return points
