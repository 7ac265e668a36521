"""Every instance of a pool against the rest of it, at once: the latency-shift test of
:mod:`slo.signals.latency`.

An instance is shifted when, against the other instances' samples of its pool (the
*rest*): it has ``min_samples`` samples and the rest as many; its median exceeds the rest's
by ``min_shift_s``; its median is ``median_ratio`` times the rest's, at equal prompt length
where every sample's prompt length is known (:class:`PromptCurve`), else of the raw values;
and a one-sided Mann–Whitney U test (scipy's, asymptotic with tie correction for samples of
more than 8 on each side, as ``scipy.stats.mannwhitneyu`` chooses) gives a p-value below
``p_value``.

Asked one instance at a time each step is a pass over the whole pool; here the pool is
sorted once and the rest's order statistics are read for every instance at once
(:mod:`slo.signals._order`), so only instances that may pass are tested one by one. An
instance is set aside early only where a bound proves it fails (a margin of 1e-9 against
rounding): at equal prompt length, its rest's median is at least the rest's median under one
reference curve divided by the most its own curve exceeds the reference over the pool's
prompt lengths (both curves positive, the samples not negative).

Samples that are not finite numbers are left out (the test is undefined on them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr
from scipy.stats import mannwhitneyu

from slo.signals._order import LeftOut, RangeSelect, median_of

__all__ = ["PromptCurve", "Shift", "ShiftTest", "shifted"]

#: Prompt-length bins of the pool's TTFT curve: its prompt-length deciles.
_PROMPT_BINS = 10
_DECILES = np.linspace(0, 1, _PROMPT_BINS + 1)[1:-1]
#: Relative margin of every early rejection against rounding.
_MARGIN = 1e-9


@dataclass(frozen=True)
class ShiftTest:
    """When an instance counts as shifted above the rest of its pool."""

    min_samples: int  # samples on each side
    p_value: float  # one-sided Mann–Whitney p-value below which the shift is significant
    median_ratio: float  # instance median / rest median (at equal prompt length if known)
    min_shift_s: float = 0.0  # raw instance median − rest median


@dataclass(frozen=True)
class Shift:
    """One instance shifted above the rest of its pool, and the numbers that say so."""

    instance: str
    basis: str  # mann_whitney, or mann_whitney_by_prompt_length
    median_s: float  # raw
    pool_median_s: float  # raw, of the rest
    median_ratio: float  # at equal prompt length where basis says so
    prob_superiority: float  # U / (n · pool_n)
    p_value: float
    n: int
    pool_n: int


@dataclass(frozen=True)
class PromptCurve:
    """What the rest of a pool takes for a prompt of a given length:
    ``max(intercept + slope · prompt_tokens, floor)``.

    The line runs through the rest's per-decile medians (prompt tokens, value): prefill
    grows with the prompt, and the medians keep one slow peer from bending it; a line also
    carries the curve past the longest prompt the pool saw. A falling line (prompt length
    does not explain this pool's values) is one level for all, the rest's median; the floor,
    a tenth of that median, is what a queue-free short prompt still takes.
    """

    slope: float
    intercept: float
    floor: float

    def expected(self, prompts: np.ndarray) -> np.ndarray:
        return np.maximum(self.intercept + self.slope * prompts, self.floor)

    @classmethod
    def through(cls, xs: np.ndarray, ys: np.ndarray, rest_median: float) -> PromptCurve:
        """The curve through the deciles' medians ``(xs, ys)`` (ascending deciles)."""
        slope, intercept = np.polyfit(xs, ys, 1) if len(xs) > 1 else (0.0, float(ys[0]))
        if slope < 0:
            slope, intercept = 0.0, rest_median
        return cls(slope, intercept, 0.1 * rest_median)


class _Pool:
    """One pool's samples of one metric, owner by owner (owner ``i`` is ``names[i]``)."""

    def __init__(
        self, samples: Mapping[str, np.ndarray], prompts: Mapping[str, np.ndarray | None] | None
    ) -> None:
        self.names = list(samples)
        arrays = [np.asarray(samples[i], float) for i in self.names]
        paired = prompts is not None and all(
            (p := prompts.get(i)) is not None and len(p) == len(a)
            for i, a in zip(self.names, arrays, strict=True)
        )
        sizes = [len(a) for a in arrays]
        values = np.concatenate(arrays) if arrays else np.empty(0)
        owner = np.repeat(np.arange(len(arrays)), sizes)
        finite = np.isfinite(values)
        self.values, self.owner = values[finite], owner[finite]
        self.prompts: np.ndarray | None = None
        if paired and prompts is not None:
            lengths = np.concatenate([np.asarray(prompts[i], float) for i in self.names])[finite]
            if len(lengths) and not (lengths < 0).any():  # every prompt length known
                self.prompts = lengths
        self.size = len(self.names)
        self.sizes = np.bincount(self.owner, minlength=self.size)
        self.raw = LeftOut(self.values, self.owner, self.size)
        small = np.int16 if self.size < 2**15 else np.int64
        self._by_owner = np.argsort(self.owner.astype(small), kind="stable")

    def own_median(self, who: np.ndarray) -> np.ndarray:
        """``numpy.median`` of each ``who``'s own samples (needs at least one)."""
        n = self.sizes[who]
        first = self.raw.starts[who]
        own = self.raw.own
        return median_of(
            n,
            self.raw.sorted[own[first + (n - 1) // 2]],
            self.raw.sorted[own[first + n // 2]],
        )

    def mine(self, i: int) -> np.ndarray:
        """Which samples are ``i``'s (a mask)."""
        return self.owner == i

    def own(self, i: int) -> np.ndarray:
        """Where ``i``'s samples are (indices)."""
        first = int(self.raw.starts[i])
        return self._by_owner[first : first + int(self.sizes[i])]


def _curves(pool: _Pool, who: np.ndarray, rest_median: np.ndarray) -> dict[int, PromptCurve]:
    """The rest's prompt curve of each ``who`` whose rest holds prompts of more than one length
    and a positive median; the others compare raw values."""
    assert pool.prompts is not None
    lengths = LeftOut(pool.prompts, pool.owner, pool.size)
    rest = lengths.rest(who)
    spread = lengths.kth(who, rest - 1) > lengths.kth(who, np.zeros_like(who))
    scaled = spread & (0.1 * rest_median > 0)  # else no floor: the raw values compare
    who, rest_median = who[scaled], rest_median[scaled]
    if not len(who):
        return {}
    # each one's bins: the rest's prompts in (edge b − 1, edge b], positions [at b, at b + 1)
    edges = lengths.quantiles(who, _DECILES)
    at = np.concatenate(
        (
            np.zeros((len(who), 1), np.int64),
            np.searchsorted(lengths.sorted, edges, side="right"),
            np.full((len(who), 1), lengths.n, np.int64),
        ),
        axis=1,
    )
    own = lengths.own_below(who[:, None], at)
    before = at - own  # the rest's samples below each boundary
    count = np.diff(before, axis=1)
    whose = np.broadcast_to(who[:, None], count.shape)
    low, high = before[:, :-1] + (count - 1) // 2, before[:, :-1] + count // 2
    inside = count > 0
    xs = np.zeros(count.shape)
    xs[inside] = median_of(
        count[inside],
        lengths.kth(whose[inside], low[inside]),
        lengths.kth(whose[inside], high[inside]),
    )
    ys = np.zeros(count.shape)
    ys[inside] = _bin_medians(pool, lengths, whose, at, own, count, inside)
    curves = {}
    for row, i in enumerate(who.tolist()):
        keep = inside[row]
        curves[i] = PromptCurve.through(xs[row, keep], ys[row, keep], float(rest_median[row]))
    return curves


def _bin_medians(
    pool: _Pool,
    lengths: LeftOut,
    whose: np.ndarray,
    at: np.ndarray,
    own: np.ndarray,
    count: np.ndarray,
    inside: np.ndarray,
) -> np.ndarray:
    """The median value of the rest's samples in each non-empty bin."""
    values = RangeSelect(pool.values[lengths.order])  # in prompt-length order
    lo, hi = at[:, :-1][inside], at[:, 1:][inside]
    first, last = own[:, :-1][inside], own[:, 1:][inside]
    who = whose[inside]
    left = last - first  # the owner's own samples inside each bin, left out
    query = np.repeat(np.arange(len(lo)), left)
    step = np.arange(left.sum()) - np.repeat(np.cumsum(left) - left, left)
    left_out = lengths.own[np.repeat(lengths.starts[who] + first, left) + step]
    n = count[inside]
    kth = values.kth(lo, hi, (n - 1) // 2, left_out, query)
    kth_next = values.kth(lo, hi, n // 2, left_out, query)
    return median_of(n, kth, kth_next)


def _bounded_out(
    pool: _Pool, curves: dict[int, PromptCurve], own_scaled: dict[int, float], ratio: float
) -> set[int]:
    """Owners whose scaled median ratio is proven below ``ratio``: the rest's median at equal
    prompt length is at least the rest's median under a reference curve divided by the most
    the owner's curve exceeds it (module docstring)."""
    if not curves or pool.prompts is None or (pool.values < 0).any():
        return set()
    reference = next(iter(curves.values()))
    who = np.array(list(curves))
    under_reference = LeftOut(
        pool.values / reference.expected(pool.prompts), pool.owner, pool.size
    ).median(who)
    lo, hi = float(pool.prompts.min()), float(pool.prompts.max())
    out = set()
    for i, bound in zip(who.tolist(), under_reference.tolist(), strict=True):
        curve = curves[i]
        points = [lo, hi]
        for c in (curve, reference):
            if c.slope != 0:
                points.append(min(max((c.floor - c.intercept) / c.slope, lo), hi))
        at = np.array(points)
        most = float((curve.expected(at) / reference.expected(at)).max())
        least = bound / most
        if least > 0 and own_scaled[i] < ratio * least * (1 - _MARGIN):
            out.add(i)
    return out


def _candidates(pool: _Pool, test: ShiftTest) -> tuple[list[int], dict[int, PromptCurve]]:
    """Owners that may be shifted (in order), and the prompt curve of those compared at
    equal prompt length; every owner left out provably fails the test."""
    n = len(pool.values)
    who = np.flatnonzero((pool.sizes >= test.min_samples) & (n - pool.sizes >= test.min_samples))
    if not len(who):
        return [], {}
    mine, rest = pool.own_median(who), pool.raw.median(who)
    margin = _MARGIN * (np.abs(mine) + np.abs(rest) + test.min_shift_s)
    raised = mine - rest >= test.min_shift_s - margin
    who, mine, rest = who[raised], mine[raised], rest[raised]
    curves = _curves(pool, who, rest) if pool.prompts is not None and len(who) else {}
    own_scaled = {
        i: float(np.median(pool.values[pool.own(i)] / c.expected(pool.prompts[pool.own(i)])))
        for i, c in curves.items()
        if pool.prompts is not None
    }
    out = _bounded_out(pool, curves, own_scaled, test.median_ratio)
    keep = []
    for i, m, r in zip(who.tolist(), mine.tolist(), rest.tolist(), strict=True):
        if i in curves:
            if i not in out:
                keep.append(i)
        elif not (r > 0 and m < test.median_ratio * r * (1 - _MARGIN)):
            keep.append(i)
    return keep, curves


class _Ranks:
    """A combined sample sorted, as Mann–Whitney reads it: average ranks and the tie term."""

    def __init__(self, combined: np.ndarray) -> None:
        self.sorted = np.sort(combined)
        starts = np.flatnonzero(np.diff(self.sorted, prepend=-np.inf) != 0)
        ties = np.diff(starts, append=len(self.sorted)).astype(float)
        self.tie_term = float(np.sum(ties**3 - ties))

    def rank_sum(self, values: np.ndarray) -> float:
        """Σ of the average ranks of ``values`` (members of the sample) in it."""
        below = np.searchsorted(self.sorted, values, side="left")
        through = np.searchsorted(self.sorted, values, side="right")
        return float(np.sum((below + 1 + through) / 2))


def _greater(combined: np.ndarray, mine: np.ndarray, ranks: _Ranks | None) -> tuple[float, float]:
    """One-sided (greater) Mann–Whitney U of ``combined[mine]`` against the rest, and its
    p-value, as ``scipy.stats.mannwhitneyu`` computes them (``ranks`` of ``combined`` if
    known)."""
    n1 = int(mine.sum())
    n2 = len(combined) - n1
    if n1 <= 8 or n2 <= 8:  # scipy may choose its exact distribution
        test = mannwhitneyu(combined[mine], combined[~mine], alternative="greater")
        return float(test.statistic), float(test.pvalue)
    ranks = ranks or _Ranks(combined)
    u = ranks.rank_sum(combined[mine]) - n1 * (n1 + 1) / 2
    n = n1 + n2
    s = np.sqrt(n1 * n2 / 12 * ((n + 1) - ranks.tie_term / (n * (n - 1))))
    z = (u - n1 * n2 / 2 - 0.5) / s
    return u, float(np.clip(ndtr(-z), 0.0, 1.0))


def shifted(
    samples: Mapping[str, np.ndarray],
    prompts: Mapping[str, np.ndarray | None] | None,
    test: ShiftTest,
) -> list[Shift]:
    """The instances of one pool (``samples``: instance → values) shifted above the rest,
    in ``samples``' order. With ``prompts`` (instance → each sample's prompt tokens) the
    values are compared at equal prompt length (:class:`PromptCurve`) where every sample's
    length is known."""
    pool = _Pool(samples, prompts)
    candidates, curves = _candidates(pool, test)
    raw_ranks: _Ranks | None = None
    found = []
    for i in candidates:
        mine = pool.mine(i)
        raw = float(np.median(pool.values[mine])), float(np.median(pool.values[~mine]))
        if raw[0] - raw[1] < test.min_shift_s:
            continue
        curve = curves.get(i)
        if curve is not None and pool.prompts is not None:
            combined = pool.values / curve.expected(pool.prompts)
        else:
            combined = pool.values
        own, rest = float(np.median(combined[mine])), float(np.median(combined[~mine]))
        if rest <= 0 or own / rest < test.median_ratio:
            continue
        if curve is None and raw_ranks is None and len(pool.values) - int(mine.sum()) > 8:
            raw_ranks = _Ranks(pool.values)
        u, p = _greater(combined, mine, raw_ranks if curve is None else None)
        if p >= test.p_value:
            continue
        n = int(mine.sum())
        found.append(
            Shift(
                pool.names[i],
                "mann_whitney" if curve is None else "mann_whitney_by_prompt_length",
                raw[0],
                raw[1],
                own / rest,
                u / (n * (len(combined) - n)),
                p,
                n,
                len(combined) - n,
            )
        )
    return found
