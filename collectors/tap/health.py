"""The tap's own health: how late its event loop runs, its GC pauses, its CPU throttling.

Why it is a signal: the tap is a sidecar on the engine's node, and on a busy node it is
descheduled, collects garbage or is throttled by its cgroup quota. Each of those delays
the moment the tap reads the engine's bytes. Kernel receive stamps
(:mod:`collectors.tap.stamped`) take most of that out of the measurement; what is left
(bursts read at once, TLS upstreams, platforms without stamps) is judged against the stalls
recorded here, so a record measured while the tap was late says so (``timing_uncertain``)
instead of passing the tap's lateness off as the engine's jitter.

* :class:`LoopMonitor` — a timer every ``interval_s``; how late it fires is the loop's lag
  (histogram ``llmslo_tap_loop_lag_seconds``). Lateness over ``bound_s`` and GC pauses
  over ``bound_s`` are kept as *stalls* (start, end on the tap's monotonic clock; the last
  :data:`STALLS_KEPT`), which :meth:`LoopMonitor.stall_within` looks up for a request.
  A stall shorter than ``interval_s`` can hide between two ticks; one longer than
  ``bound_s + interval_s`` cannot.
* GC pauses through ``gc.callbacks`` (``llmslo_tap_gc_pause_seconds{generation}``).
* CPU throttling from the cgroup's ``cpu.stat`` (v2 ``nr_throttled``/``throttled_usec``, v1
  ``throttled_time``) read at scrape time: ``llmslo_tap_cpu_throttled_periods_total``,
  ``llmslo_tap_cpu_throttled_seconds_total``; absent when the file is.

:meth:`LoopMonitor.samples` gives the same figures as ``ENGINE_SAMPLES`` rows (dialect
``tap``, signals ``tap_loop_lag_max``, ``tap_gc_pause_max``, ``tap_cpu_throttled``), so
they are stored beside the tap's in-flight gauges and a burn can be read against them.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["STALLS_KEPT", "CgroupThrottling", "LoopMonitor"]

#: Stalls remembered for :meth:`LoopMonitor.stall_within` (older ones are forgotten).
STALLS_KEPT = 4096
_LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_CPU_STAT_PATHS = (Path("/sys/fs/cgroup/cpu.stat"), Path("/sys/fs/cgroup/cpu/cpu.stat"))


class CgroupThrottling(Collector):
    """The tap cgroup's CPU throttling, read from ``cpu.stat`` at each scrape."""

    def __init__(self, paths: tuple[Path, ...] = _CPU_STAT_PATHS) -> None:
        self.paths = paths

    def read(self) -> tuple[int, float] | None:
        """(throttled periods, throttled seconds), or ``None`` without a readable cpu.stat."""
        for path in self.paths:
            try:
                text = path.read_text()
            except OSError:
                continue
            stat = dict(
                (parts[0], int(parts[1]))
                for line in text.splitlines()
                if len(parts := line.split()) == 2 and parts[1].isdigit()
            )
            if "nr_throttled" not in stat:
                continue
            if "throttled_usec" in stat:
                return stat["nr_throttled"], stat["throttled_usec"] / 1e6
            return stat["nr_throttled"], stat.get("throttled_time", 0) / 1e9
        return None

    def collect(self) -> Iterator[CounterMetricFamily]:
        stat = self.read()
        if stat is None:
            return
        periods, seconds = stat
        yield CounterMetricFamily(
            "llmslo_tap_cpu_throttled_periods",
            "CFS periods in which the tap's cgroup was throttled (cpu.stat nr_throttled)",
            value=periods,
        )
        yield CounterMetricFamily(
            "llmslo_tap_cpu_throttled_seconds",
            "Time the tap's cgroup was throttled (cpu.stat throttled_usec)",
            value=seconds,
        )


class LoopMonitor:
    """Samples the running loop's lag and the GC's pauses; remembers stalls over ``bound_s``.

    ``clock`` is the tap's monotonic clock (the one records are measured on). Start inside
    the running loop with :meth:`start`; :meth:`stop` removes the timer and GC hook.
    """

    def __init__(
        self,
        *,
        bound_s: float,
        interval_s: float,
        clock: Callable[[], float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.bound_s = bound_s
        self.interval_s = interval_s
        self.clock = clock
        self.stalls: deque[tuple[float, float]] = deque(maxlen=STALLS_KEPT)
        self.throttling = CgroupThrottling()
        self.max_lag_s = 0.0  # since the last samples(); published then reset
        self.max_gc_s = 0.0
        registry = registry if registry is not None else CollectorRegistry()
        self.loop_lag = Histogram(
            "llmslo_tap_loop_lag_seconds",
            "How late the tap's event-loop timer fired (the tap's own lateness)",
            buckets=_LAG_BUCKETS_S,
            registry=registry,
        )
        self.gc_pause = Histogram(
            "llmslo_tap_gc_pause_seconds",
            "Garbage-collection pauses of the tap process",
            ["generation"],
            buckets=_LAG_BUCKETS_S,
            registry=registry,
        )
        self._gc_children = [self.gc_pause.labels(str(g)) for g in range(3)]
        registry.register(self.throttling)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due_s = 0.0
        self._gc_start_s = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._due_s = self.clock() + self.interval_s
        self._timer = self._loop.call_later(self.interval_s, self._tick)
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _tick(self) -> None:
        now = self.clock()
        late = max(now - self._due_s, 0.0)
        self.loop_lag.observe(late)
        self.max_lag_s = max(self.max_lag_s, late)
        if late > self.bound_s:
            self.stalls.append((self._due_s, now))
        assert self._loop is not None
        self._due_s = now + self.interval_s
        self._timer = self._loop.call_later(self.interval_s, self._tick)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start_s = self.clock()
            return
        end = self.clock()
        pause = end - self._gc_start_s
        self._gc_children[min(int(info.get("generation", 0)), 2)].observe(pause)
        self.max_gc_s = max(self.max_gc_s, pause)
        if pause > self.bound_s:
            self.stalls.append((self._gc_start_s, end))

    def note_stall(self, start_s: float, end_s: float) -> None:
        """Record a stall seen elsewhere (a read that came ``end_s - start_s`` late)."""
        if end_s - start_s > self.bound_s:
            self.stalls.append((start_s, end_s))

    def stall_within(self, start_s: float, end_s: float) -> float:
        """The longest recorded stall overlapping [``start_s``, ``end_s``] (0.0 if none)."""
        longest = 0.0
        for stall_start, stall_end in reversed(self.stalls):
            if stall_end < start_s - 60.0:
                break  # stalls are recorded about in time order; far older ones cannot overlap
            if stall_end >= start_s and stall_start <= end_s:
                longest = max(longest, stall_end - stall_start)
        return longest

    def samples(self, ts_ms: int, tap_id: str, instances: list[str]) -> list[dict[str, Any]]:
        """``ENGINE_SAMPLES`` rows (per fronted instance) of the worst lag and GC pause
        since the last call, and the cgroup's throttled seconds (a counter), then resets."""
        labels = json.dumps({"tap_id": tap_id}, sort_keys=True)
        figures = [
            ("llmslo_tap_loop_lag_max_seconds", "tap_loop_lag_max", "gauge", self.max_lag_s),
            ("llmslo_tap_gc_pause_max_seconds", "tap_gc_pause_max", "gauge", self.max_gc_s),
        ]
        throttled = self.throttling.read()
        if throttled is not None:
            figures.append(
                (
                    "llmslo_tap_cpu_throttled_seconds_total",
                    "tap_cpu_throttled",
                    "counter",
                    throttled[1],
                )
            )
        self.max_lag_s = self.max_gc_s = 0.0
        return [
            {
                "ts_ms": ts_ms,
                "instance": instance,
                "pool": None,
                "dialect": "tap",
                "model": None,
                "engine": "",
                "metric": metric,
                "signal": signal,
                "kind": kind,
                "le": None,
                "labels_json": labels,
                "value": float(value),
                "address": None,
            }
            for instance in instances
            for metric, signal, kind, value in figures
        ]
