"""Busy processes beside the system under test: a production node is never idle.

Each hog spins on the CPU without touching the network (no loopback traffic to confuse
with the measured path) and stops by itself after ``max_s`` even if nobody stops it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from types import TracebackType
from typing import Any

__all__ = ["CpuHogs"]


def _spin(max_s: float) -> None:
    deadline = time.monotonic() + max_s
    x = 0
    while time.monotonic() < deadline:
        for _ in range(10_000):
            x += 1


class CpuHogs:
    """``with CpuHogs(n):`` runs ``n`` (default: one per core) spinning processes."""

    def __init__(self, n: int | None = None, *, max_s: float = 120.0, ctx: Any = None) -> None:
        self.n = (os.cpu_count() or 1) if n is None else n
        self.max_s = max_s
        self._ctx = ctx or mp.get_context("spawn")
        self._procs: list[Any] = []

    def __enter__(self) -> CpuHogs:
        for _ in range(self.n):
            proc = self._ctx.Process(target=_spin, args=(self.max_s,), daemon=True)
            proc.start()
            self._procs.append(proc)
        time.sleep(0.3)  # spawned and spinning before the measurement starts
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            proc.join(timeout=10)
        self._procs.clear()
