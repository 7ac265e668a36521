"""Looking at child processes from a test (Linux /proc): alive, gone, CPU spent."""

from __future__ import annotations

import os
import re
import time
from typing import IO


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after waiting up to ``timeout_s`` for all of them to end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a live process has spent."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def line_matching(
    stream: IO[str], pattern: str, max_lines: int = 10
) -> tuple[re.Match[str] | None, list[str]]:
    """The first of a child's next ``max_lines`` output lines that matches ``pattern``
    (``re.search``), and the lines read (for the failure message)."""
    seen: list[str] = []
    for _ in range(max_lines):
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found, seen
    return None, seen
