"""One signal's samples over time (:class:`Series`), shared by the snapshot's loaders."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Series"]


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

    def increase(self) -> float:
        """Counter increase over the series, resets taken as restarts from 0."""
        if len(self.values) < 2:
            return 0.0
        deltas = np.diff(self.values)
        return float(np.where(deltas < 0, self.values[1:], deltas).sum())

    def last(self) -> float:
        return float(self.values[-1])
