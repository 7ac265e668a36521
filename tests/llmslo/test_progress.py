"""Progress bars on long commands: drawn on a terminal, never in piped output or with -q."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmslo.progress import progress

END_MS = 1_780_000_000_000


def _history(tmp_path: Path, *extra: str, terminal: bool) -> tuple[dict[str, object], str]:
    """``llmslo sim history`` on a small fleet; (its JSON summary, what it wrote on stderr),
    stderr a pseudo-terminal when ``terminal``."""
    argv = [
        sys.executable,
        "-m",
        "llmslo",
        "sim",
        "history",
        "--days",
        "0.25",
        "--pods",
        "2",
        "--end-ts-ms",
        str(END_MS),
        "--replay-last",
        "1h",
        "--db",
        str(tmp_path / "h.duckdb"),
        *extra,
    ]
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    if not terminal:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr
    master, slave = pty.openpty()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal's last writer
            break
        if not chunk:
            break
        seen += chunk
    out = child.stdout.read() if child.stdout else b""
    assert child.wait(timeout=60) == 0, seen.decode(errors="replace")
    os.close(master)
    return json.loads(out), seen.decode(errors="replace")


def test_a_terminal_sees_history_and_replay_bars_with_rate_and_time_left(tmp_path: Path) -> None:
    summary, stderr = _history(tmp_path, terminal=True)
    assert summary["replay"] is not None  # stdout is still the JSON summary, whole
    assert "history" in stderr and "6/6" in stderr  # six simulated hours
    assert "sim h/s" in stderr and "left" in stderr
    assert "replay" in stderr and "steps/s" in stderr


@pytest.mark.parametrize(
    ("extra", "terminal"),
    [((), False), (("--quiet",), True)],
    ids=["stderr piped", "quiet on a terminal"],
)
def test_no_bar_when_piped_or_quiet(tmp_path: Path, extra: tuple[str, ...], terminal: bool) -> None:
    summary, stderr = _history(tmp_path, *extra, terminal=terminal)
    assert summary["rows"]
    assert "sim h/s" not in stderr and "steps/s" not in stderr
    assert "\x1b[" not in stderr  # no escape codes in a log


def test_the_bar_counts_what_the_block_advanced() -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal, progress("work", 4, "items", stream=terminal) as step:
        for _ in range(4):
            step(1)
    drawn = _read_all(master).decode(errors="replace")
    assert "work" in drawn and "4/4" in drawn


def _read_all(master: int) -> bytes:
    """Everything written to a pty whose other end is closed: one read may return only the
    first frames (Linux then raises EIO once it is drained)."""
    chunks = []
    try:
        while chunk := os.read(master, 65536):
            chunks.append(chunk)
    except OSError:
        pass
    finally:
        os.close(master)
    return b"".join(chunks)
