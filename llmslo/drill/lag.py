"""How late the drill's own event loops run: the harness's share of what the taps measure.

The simulated pods, the taps and the load generator are Python event loops in the drill's
process; on a loaded machine they run late, and every late wake-up is a gap between tokens
that no engine made. :class:`LoopLag` samples a loop's lateness (``asyncio.sleep(period)``
overshoot, ms) so the report can say how much ITL jitter the harness itself adds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections import deque

import numpy as np

__all__ = ["LoopLag"]


class LoopLag:
    """Samples ``loop``'s wake-up lateness every ``period_s`` until :meth:`stop` (keeps the
    last ``keep`` samples)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, period_s: float = 0.1, keep: int = 100_000
    ) -> None:
        self.period_s = period_s
        self._samples: deque[float] = deque(maxlen=keep)
        self._stopped = False
        self._task: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
            self._sample(), loop
        )

    async def _sample(self) -> None:
        while not self._stopped:
            before = time.monotonic()
            await asyncio.sleep(self.period_s)
            self._samples.append((time.monotonic() - before - self.period_s) * 1000)

    def stop(self) -> dict[str, float]:
        """Stop sampling; returns lateness p50 / p99 / max in ms (empty without samples)."""
        self._stopped = True
        with contextlib.suppress(Exception):
            self._task.result(2 * self.period_s + 5)
        return self.summary()

    def summary(self) -> dict[str, float]:
        if not self._samples:
            return {}
        values = np.fromiter(self._samples, float)
        return {
            "p50_ms": round(float(np.percentile(values, 50)), 1),
            "p99_ms": round(float(np.percentile(values, 99)), 1),
            "max_ms": round(float(values.max()), 1),
        }
