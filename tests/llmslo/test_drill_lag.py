"""The drill's harness lateness probe: a blocked event loop shows as lateness."""

from __future__ import annotations

import asyncio
import threading
import time

from llmslo.drill.lag import LoopLag


def test_a_loop_blocked_for_300_ms_shows_that_lateness() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        lag = LoopLag(loop, period_s=0.05)
        time.sleep(0.5)
        quiet = lag.summary()
        loop.call_soon_threadsafe(time.sleep, 0.3)  # a callback that hogs the loop
        time.sleep(0.6)
        late = lag.stop()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert quiet["p50_ms"] < 100  # the median wake-up is on time even on a loaded machine
    assert late["max_ms"] >= 250  # the 300 ms hog, less the sampling period
    assert set(late) == {"p50_ms", "p99_ms", "max_ms"}
