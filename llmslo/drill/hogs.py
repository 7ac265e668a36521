"""CPU hogs: busy processes beside a drill's fleets, so the matrix is judged on a node that
is never idle (DESIGN §8: no false positive with one hog per core, as with none).

A hog is a noisy neighbour, and its CPU weight says which kind. ``besteffort`` (the
default) runs it ``SCHED_IDLE``, Linux's lowest weight: the analogue of a Kubernetes
BestEffort pod (cgroup ``cpu.weight`` 1) beside a Guaranteed inference pod, whose weight
follows its CPU request. ``equal`` runs it at the fleets' own weight (nice 0): a neighbour
as entitled to the CPU as the engine. The simulated engines stand in for GPUs, but they are
Python event loops on the host: beside ``equal`` hogs they are descheduled themselves and
emit late (steps 100–260 ms late), a stutter their clients really see and the taps rightly
measure, so ``equal`` judges the harness, not the pipeline (``docs/drills.md``).

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

__all__ = ["HOG_CLASSES", "MAX_HOGS", "cpu_hogs"]

#: More than this many busy processes is no longer "a busy node" on any machine we test on.
MAX_HOGS = 64

#: A hog's CPU weight: ``besteffort`` (SCHED_IDLE, nice 19 where that policy is missing) or
#: ``equal`` (the fleets' own).
HOG_CLASSES = ("besteffort", "equal")

#: The child's whole program: take its class's CPU weight, then spin until the deadline (a
#: monotonic time, CLOCK_MONOTONIC is shared by every process on Linux), checking the clock
#: every 100,000 iterations.
_SPIN = """\
import os, sys, time
deadline = float(sys.argv[1])
if sys.argv[2] == "besteffort":
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
while time.monotonic() < deadline:
    for _ in range(100_000):
        pass
"""


@contextmanager
def cpu_hogs(
    count: int, max_s: float, hog_class: str = "besteffort"
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``count`` busy processes of ``hog_class`` (:data:`HOG_CLASSES`) for at most
    ``max_s`` seconds while the block runs.

    Yields the processes (for their pids); every one is stopped when the block exits.
    Raises :class:`ConfigError` for a count outside ``[0, MAX_HOGS]``, a non-positive
    ``max_s`` or an unknown class.
    """
    if hog_class not in HOG_CLASSES:
        raise ConfigError(f"hogs: class must be one of {HOG_CLASSES}, not {hog_class!r}")
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
                    die_with_parent(
                        [sys.executable, "-S", "-c", _SPIN, repr(deadline), hog_class], "KILL"
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield hogs
    finally:
        for hog in hogs:
            stop_process(hog, timeout_s=2.0)
