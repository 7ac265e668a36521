"""Order statistics of a pool with one instance's samples left out, for every instance at once.

The latency shifts (:mod:`slo.signals.latency`) compare each instance with the rest of its
pool: medians, prompt-length deciles and per-decile medians of *the others' samples*. Taken
one instance at a time that is a pass over the whole pool per instance (a pool of 512
instances × 300 requests is 150,000 samples, 512 times). Here the pool is sorted once, and
the *k*-th smallest of the rest of the pool is found from the positions of the left-out
instance's own samples in that order (:class:`LeftOut`), and the *k*-th smallest inside a
range of positions, some left out, from a wavelet matrix (:class:`RangeSelect`). Both return
samples of the pool itself, so a median is ``(a + b) / 2`` of the same two values
``numpy.median`` picks, and a quantile the same interpolation as ``numpy.quantile``
(:meth:`LeftOut.quantiles`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LeftOut", "RangeSelect", "lerp", "median_of"]


def median_of(count: np.ndarray, kth: np.ndarray, kth_next: np.ndarray) -> np.ndarray:
    """``numpy.median`` from the two middle order statistics of ``count`` values (the
    ``(count − 1) // 2``-th and ``count // 2``-th smallest): their mean when ``count`` is
    even, else the middle one."""
    return np.where(count % 2 == 0, (kth + kth_next) / 2, kth)


def lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``numpy.quantile``'s linear interpolation between neighbours ``a`` and ``b``."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)


class LeftOut:
    """A pool's values, sorted once, asked for the order statistics of the rest of the pool
    when one owner's values are left out.

    ``owner[j]`` says whose ``values[j]`` is (0 … ``owners`` − 1). The *k*-th smallest of
    the others is at sorted position ``k + t``, ``t`` the owner's own samples before it:
    those whose position minus their rank among the owner's is at most ``k`` (that
    difference counts the others before them).
    """

    def __init__(self, values: np.ndarray, owner: np.ndarray, owners: int) -> None:
        n = len(values)
        self.n = n
        self.order = np.argsort(values)  # ties in any order: only values are read back
        self.sorted = values[self.order]
        self.sizes = np.bincount(owner, minlength=owners).astype(np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        #: Each owner's own sorted positions, ascending, owner after owner (a stable sort of
        #: the owners in sorted order; a radix sort where they fit 16 bits).
        small = np.int16 if owners < 2**15 else np.int64
        self.own = np.argsort(owner[self.order].astype(small), kind="stable").astype(np.int64)
        offset = np.repeat(np.arange(owners, dtype=np.int64) * (n + 1), self.sizes)
        self._own_key = self.own + offset
        within = np.arange(n, dtype=np.int64) - np.repeat(self.starts, self.sizes)
        self._rest_key = self.own - within + offset

    def rest(self, who: np.ndarray) -> np.ndarray:
        """How many values the others hold."""
        return self.n - self.sizes[who]

    def position(self, who: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Sorted position of the ``k``-th smallest (from 0) of the values not ``who``'s."""
        key = k + who * (self.n + 1)
        return k + np.searchsorted(self._rest_key, key, side="right") - self.starts[who]

    def kth(self, who: np.ndarray, k: np.ndarray) -> np.ndarray:
        return self.sorted[self.position(who, k)]

    def own_below(self, who: np.ndarray, position: np.ndarray) -> np.ndarray:
        """How many of ``who``'s values sit at sorted positions below ``position``."""
        key = position + who * (self.n + 1)
        return np.searchsorted(self._own_key, key, side="left") - self.starts[who]

    def median(self, who: np.ndarray) -> np.ndarray:
        """``numpy.median`` of the others' values (needs at least one)."""
        rest = self.rest(who)
        return median_of(rest, self.kth(who, (rest - 1) // 2), self.kth(who, rest // 2))

    def quantiles(self, who: np.ndarray, q: np.ndarray) -> np.ndarray:
        """``numpy.quantile(others, q)`` (linear), one row per ``who``."""
        rest = self.rest(who)[:, None]
        virtual = (rest - 1) * q[None, :]
        below = np.floor(virtual).astype(np.int64)
        last = virtual >= rest - 1
        below = np.where(last, rest - 1, below)
        above = np.where(last, rest - 1, below + 1)
        who2 = np.broadcast_to(who[:, None], below.shape)
        return lerp(self.kth(who2, below), self.kth(who2, above), virtual - below)


class RangeSelect:
    """The *k*-th smallest of ``values[lo:hi]`` with some positions left out, many ranges at
    once: a wavelet matrix over the values' ranks (one bit level per step, each query
    narrowing its range to the half its answer is in)."""

    def __init__(self, values: np.ndarray) -> None:
        n = len(values)
        order = np.argsort(values)
        self.sorted = values[order]
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        self.levels = max(1, int(n - 1).bit_length())
        self._zeros_before: list[np.ndarray] = []  # per level: zero bits before each position
        self._bits: list[np.ndarray] = []
        for level in reversed(range(self.levels)):
            bit = ((rank >> level) & 1).astype(bool)
            self._bits.append(bit)
            self._zeros_before.append(np.concatenate(([0], np.cumsum(~bit))).astype(np.int64))
            rank = np.concatenate((rank[~bit], rank[bit]))

    def kth(
        self,
        lo: np.ndarray,
        hi: np.ndarray,
        k: np.ndarray,
        left_out: np.ndarray,
        left_out_query: np.ndarray,
    ) -> np.ndarray:
        """Per query, the ``k``-th smallest (from 0) of ``values[lo:hi]`` without the
        positions ``left_out`` (``left_out_query``: whose; each inside its query's range,
        fewer than ``hi − lo − k`` per query)."""
        lo, hi, k = lo.astype(np.int64), hi.astype(np.int64), k.astype(np.int64)
        found = np.zeros(len(lo), np.int64)
        out, whose = left_out.astype(np.int64), left_out_query.astype(np.int64)
        for bit, zeros_before in zip(self._bits, self._zeros_before, strict=True):
            zeros = zeros_before[-1]
            out_bit = bit[out]
            out_zeros = np.bincount(whose[~out_bit], minlength=len(lo))
            zeros_lo, zeros_hi = zeros_before[lo], zeros_before[hi]
            in_zeros = zeros_hi - zeros_lo - out_zeros
            one = k >= in_zeros
            k = np.where(one, k - in_zeros, k)
            lo = np.where(one, zeros + lo - zeros_lo, zeros_lo)
            hi = np.where(one, zeros + hi - zeros_hi, zeros_hi)
            found = found * 2 + one
            keep = out_bit == one[whose]  # left-out values on the side the answer is on
            out, whose = out[keep], whose[keep]
            moved = zeros_before[out]
            out = np.where(out_bit[keep], zeros + out - moved, moved)
        return self.sorted[found]
