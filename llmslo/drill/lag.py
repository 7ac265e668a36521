"""How late the drill's own event loops run: the harness's share of what the taps measure.

The simulated pods (in a process of their own, :mod:`llmslo.drill.pods`), the taps and the
load generator are Python event loops; on a loaded machine they run late, and a pod's late
wake-up is a gap between tokens that no real engine made. :class:`LoopLag` samples a loop's lateness (``asyncio.sleep(period)``
overshoot, ms) so the report can say how much ITL jitter the harness itself adds.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import numpy as np

__all__ = ["LoopLag"]


class LoopLag:
    """Samples ``loop``'s wake-up lateness every ``period_s`` until :meth:`stop` (keeps the
    last ``keep`` samples).

    The sampler is a chain of ``call_later`` timers, not a task: a Ctrl-C that lands at any
    point, even before :meth:`stop` is registered, leaves at most a timer on the loop, which
    closes quietly (a pending task would be reported destroyed)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, period_s: float = 0.1, keep: int = 100_000
    ) -> None:
        self.period_s = period_s
        self._loop = loop
        self._samples: deque[float] = deque(maxlen=keep)
        self._stopped = False
        loop.call_soon_threadsafe(self._arm, time.monotonic())

    def _arm(self, now: float) -> None:
        if not self._stopped:
            self._loop.call_later(self.period_s, self._tick, now)

    def _tick(self, before: float) -> None:
        now = time.monotonic()
        self._samples.append((now - before - self.period_s) * 1000)
        self._arm(now)

    def stop(self) -> dict[str, float]:
        """Stop sampling; returns lateness p50 / p99 / max in ms (empty without samples)."""
        self._stopped = True
        return self.summary()

    def summary(self) -> dict[str, float]:
        samples = self._samples.copy()  # atomic: the loop's thread may still append one
        if not samples:
            return {}
        values = np.fromiter(samples, float)
        return {
            "p50_ms": round(float(np.percentile(values, 50)), 1),
            "p99_ms": round(float(np.percentile(values, 99)), 1),
            "max_ms": round(float(values.max()), 1),
        }
