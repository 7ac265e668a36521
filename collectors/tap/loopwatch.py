"""How late the tap's own event loop is: the error bound of every timestamp the tap takes
from its loop — chunks without a kernel receive stamp (:mod:`collectors.tap.rxstamp`), and
the earliest arrival a stamped read can have had.

Without a kernel stamp the tap times a chunk when its event loop reads it, not when the
bytes reached the socket. On a busy node the loop is late: descheduled by other work, held by a GC pause, or
busy with other streams' chunks. Bytes that arrived meanwhile wait in the kernel and are
read together, so without a correction a 150 ms stall of the *tap* would be recorded as a
150 ms gap of the *engine*.

:class:`LoopWatch` runs a tick every ``interval_s`` on the loop and keeps the due time of the
last tick that ran. Bytes read at ``now_s`` were not there when the loop last polled before
that tick ran, so they arrived after it was due, or less than one interval before (the
tick was scheduled one interval after its predecessor ran; uvloop runs due timers before
the poll's reads): their read delay is at most :meth:`LoopWatch.late_s` = ``now_s`` − that
due time + ``interval_s``. On a healthy loop that is one or two intervals plus the tick's
lateness; after a stall, the whole stall, since no tick ran during it. Per request the tap keeps the
largest bound of its token-bearing chunks, ``D``: every recorded gap, and each of the ITL
p50/p90/p99/max/mean, is within ± ``D`` of the gap at the socket; the jitter (p99 − p50)
within ± 2 ``D``; TTFT is late by at most the first token chunk's bound and TPOT is off by at
most ``D`` / (N − 1). A process the kernel did not run is a stall like any other: no tick ran meanwhile.

It also times the interpreter's garbage collections (``gc.callbacks``) and reads the
cgroup's CPU throttling, the two usual reasons a healthy loop is late, so the tap's health
is exported beside what it measured (``TapMetrics``, and ``ENGINE_SAMPLES`` rows).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CGROUP_CPU_STAT", "LoopWatch", "read_throttled_s"]

#: cgroup v2's CPU statistics of this container (``throttled_usec``).
CGROUP_CPU_STAT = Path("/sys/fs/cgroup/cpu.stat")


class LoopWatch:
    """Ticks on the loop; :meth:`late_s` bounds how late bytes read now were read.

    ``clock`` is the monotonic clock (seconds) the tap timestamps chunks with, so bounds and
    timestamps share one time base. ``on_lag`` is called with each tick's lateness and
    ``on_gc`` with each collection's pause (seconds); both must be cheap.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        interval_s: float = 0.001,
        *,
        on_lag: Callable[[float], None] | None = None,
        on_gc: Callable[[float], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._on_lag = on_lag
        self._on_gc = on_gc
        self._due_s = clock()  # when the next tick is due
        self._ran_due_s = self._due_s  # when the last tick that ran was due
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._gc_start_s: float | None = None
        #: the largest tick lateness since :meth:`take_max_lag_s` last ran (seconds)
        self.max_lag_s = 0.0
        #: garbage-collection pauses seen, total seconds
        self.gc_pause_s = 0.0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start ticking on ``loop`` (the running loop by default) and timing collections."""
        self._loop = loop or asyncio.get_running_loop()
        now = self._clock()
        self._ran_due_s = now
        self._due_s = now + self.interval_s
        self._handle = self._loop.call_later(self.interval_s, self._tick)
        if self._gc_callback not in gc.callbacks:
            gc.callbacks.append(self._gc_callback)

    def stop(self) -> None:
        """Stop ticking and timing collections."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)

    def late_s(self, now_s: float) -> float:
        """The most that bytes read at ``now_s`` can have waited for the loop, seconds."""
        late = now_s - self._ran_due_s
        return (late if late > 0.0 else 0.0) + self.interval_s

    def take_max_lag_s(self) -> float:
        """The largest tick lateness since the previous call (seconds), and reset it."""
        lag, self.max_lag_s = self.max_lag_s, 0.0
        return lag

    def _tick(self) -> None:
        now = self._clock()
        lag = now - self._due_s
        self._ran_due_s = self._due_s
        self._due_s = now + self.interval_s
        assert self._loop is not None
        self._handle = self._loop.call_later(self.interval_s, self._tick)
        if lag < 0.0:  # the loop's timer fired early against our clock
            lag = 0.0
        if lag > self.max_lag_s:
            self.max_lag_s = lag
        if self._on_lag is not None:
            self._on_lag(lag)

    def _gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start_s = self._clock()
        elif self._gc_start_s is not None:
            pause = self._clock() - self._gc_start_s
            self._gc_start_s = None
            self.gc_pause_s += pause
            if self._on_gc is not None:
                self._on_gc(pause)


def read_throttled_s(path: Path = CGROUP_CPU_STAT) -> float | None:
    """Seconds this cgroup was CPU-throttled, cumulative (cgroup v2 ``throttled_usec``);
    ``None`` where the file or the field is missing (no cgroup v2, no CPU limit)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "throttled_usec" and value.strip().isdigit():
            return int(value) / 1e6
    return None
