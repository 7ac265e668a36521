"""CPU hogs: busy processes beside a drill's fleets, so the matrix is judged on a node that
is never idle (DESIGN §8: no false positive with one hog per core, as with none).

Each hog is a child interpreter spinning in a pure-Python loop. It touches no network and no
file, and it is bounded three ways: it stops itself at its deadline, the kernel kills it when
its parent dies (:func:`pipeline.processes.die_with_parent`), and :func:`cpu_hogs` stops it on exit,
exception included.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.errors import ConfigError
from pipeline.processes import die_with_parent, stop_process

__all__ = ["MAX_HOGS", "cpu_hogs"]

#: More than this many busy processes is no longer "a busy node" on any machine we test on.
MAX_HOGS = 64

#: The child's whole program: spin until the deadline (a monotonic time, CLOCK_MONOTONIC is
#: shared by every process on Linux), checking the clock every 100,000 iterations.
_SPIN = """\
import sys, time
deadline = float(sys.argv[1])
while time.monotonic() < deadline:
    for _ in range(100_000):
        pass
"""


@contextmanager
def cpu_hogs(count: int, max_s: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``count`` busy processes for at most ``max_s`` seconds while the block runs.

    Yields the processes (for their pids); every one is stopped when the block exits.
    Raises :class:`ConfigError` for a count outside ``[0, MAX_HOGS]`` or a non-positive
    ``max_s``.
    """
    if not 0 <= count <= MAX_HOGS:
        raise ConfigError(f"hogs: must be in [0, {MAX_HOGS}], not {count}")
    if max_s <= 0:
        raise ConfigError(f"hogs: max_s must be > 0, not {max_s}")
    deadline = time.monotonic() + max_s
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            hogs.append(
                subprocess.Popen(
                    die_with_parent([sys.executable, "-S", "-c", _SPIN, repr(deadline)], "KILL"),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield hogs
    finally:
        for hog in hogs:
            stop_process(hog, timeout_s=2.0)
