"""One signal's samples over time, and the counter arithmetic every detector shares."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Series"]


def _steps(values: np.ndarray) -> np.ndarray:
    """What a counter grew by between consecutive samples, with Prometheus' reset rule: a
    value below the one before means the counter restarted from 0 (a process restart), so
    the new value is all increase."""
    deltas = np.diff(values)
    return np.where(deltas < 0, values[1:], deltas)


@dataclass(frozen=True)
class Series:
    """Timestamps (ms, ascending) and values of one signal of one scope."""

    ts_ms: np.ndarray
    values: np.ndarray

    def since(self, start_ms: int) -> Series:
        keep = self.ts_ms >= start_ms
        return Series(self.ts_ms[keep], self.values[keep])

    def __len__(self) -> int:
        return len(self.ts_ms)

    def increase(
        self,
        start_ms: int | None = None,
        end_ms: int | None = None,
        *,
        interpolate: bool = False,
        from_zero: bool = False,
    ) -> float:
        """A counter's increase over ``[start_ms, end_ms]`` (each bound open when ``None``),
        counter resets as in Prometheus' ``increase()``: a drop is a restart from 0.

        By default the increase between the first and the last sample inside the window
        (no extrapolation to its edges, unlike Prometheus: 0 with fewer than two samples).
        ``interpolate``: linear between samples at both bounds instead, so that counters
        scraped at different moments compare fairly over the same span (bounds outside the
        samples are clamped to the first and last). ``from_zero``: the counter was created
        at its first sample (client libraries add a labelled child on first use), so when
        that sample lies in the window its value counts as increase too (not with
        ``interpolate``, whose cumulative curve starts at the first sample).
        """
        if len(self.values) == 0:
            return 0.0
        if interpolate:
            cumulative = np.concatenate(([0.0], np.cumsum(_steps(self.values))))
            ts = self.ts_ms.astype(float)
            lo = float(ts[0]) if start_ms is None else start_ms
            hi = float(ts[-1]) if end_ms is None else end_ms
            return float(np.interp(hi, ts, cumulative) - np.interp(lo, ts, cumulative))
        keep = np.ones(len(self.ts_ms), bool)
        if start_ms is not None:
            keep &= self.ts_ms >= start_ms
        if end_ms is not None:
            keep &= self.ts_ms <= end_ms
        inside = np.flatnonzero(keep)
        if not len(inside):
            return 0.0
        first, last = int(inside[0]), int(inside[-1])
        grown = float(_steps(self.values[first : last + 1]).sum())
        return grown + (float(self.values[0]) if from_zero and first == 0 else 0.0)

    def last(self) -> float:
        return float(self.values[-1])
