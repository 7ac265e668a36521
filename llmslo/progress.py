"""What a command shows while it works, on stderr (stdout keeps the commands' JSON summaries).

* Progress bars for work of known size (history generation, replay, lake export, drills):
  rich's, with the rate and the time left, drawn only when stderr is a terminal and the
  command was not given ``--quiet``; piped or logged output gets no bar and no escape codes.
* Status lines for the long-running processes (``ingest``, ``collect``, ``probe``, ``run``):
  one plain line every :data:`STATUS_EVERY_TTY_S` on a terminal, every
  :data:`STATUS_EVERY_S` otherwise (a pod's log), none with ``--quiet``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = [
    "STATUS_EVERY_S",
    "STATUS_EVERY_TTY_S",
    "Advance",
    "add_quiet_option",
    "progress",
    "status_lines",
]

#: ``advance(n)`` moves a bar on by ``n`` of its units.
Advance = Callable[[float], None]


def add_quiet_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``-q/--quiet``: no progress bar (none is drawn when stderr is not a terminal anyway)."""
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress bar or periodic status line on stderr (a bar is drawn only on a "
        "terminal)",
    )


#: Seconds between status lines on a terminal, and in a log (stderr not a terminal).
STATUS_EVERY_TTY_S = 10.0
STATUS_EVERY_S = 60.0


@contextmanager
def status_lines(
    describe: Callable[[], str],
    *,
    quiet: bool = False,
    every_s: float | None = None,
    stream: TextIO | None = None,
) -> Iterator[None]:
    """While the block runs, write ``describe()`` as one line to ``stream`` (default stderr)
    every ``every_s`` seconds (default :data:`STATUS_EVERY_TTY_S` when it is a terminal,
    else :data:`STATUS_EVERY_S`); nothing with ``quiet``. ``describe`` runs on a thread of
    its own: it should only read counters. An error in it is logged and the lines stop."""
    out = sys.stderr if stream is None else stream
    if quiet:
        yield
        return
    interval_s = every_s or (STATUS_EVERY_TTY_S if out.isatty() else STATUS_EVERY_S)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                line = describe()
            except Exception:  # a status line is no reason to stop the work it describes
                logging.getLogger(__name__).exception("status line failed; no more of them")
                return
            out.write(line + "\n")
            out.flush()

    thread = threading.Thread(target=loop, name="llmslo-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


class _RateColumn(ProgressColumn):
    """Units per second over the recent steps (rich's own speed estimate)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(
            "" if speed is None else f"{speed:,.1f} {self.unit}/s", style="progress.data.speed"
        )


@contextmanager
def progress(
    description: str,
    total: float | None,
    unit: str,
    *,
    quiet: bool = False,
    stream: TextIO | None = None,
) -> Iterator[Advance]:
    """A bar of ``total`` ``unit`` s (``None``: unknown, no time left shown) for the block.

    Yields ``advance(n)``; when no bar is drawn (``quiet``, or ``stream``, default stderr,
    is not a terminal) it does nothing.
    """
    out = sys.stderr if stream is None else stream
    if quiet or not out.isatty():
        yield lambda n: None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        _RateColumn(unit),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=Console(file=out),
        transient=False,
    )
    with bar, _logs_above(bar, out):
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def _logs_above(bar: Progress, out: TextIO) -> Iterator[None]:
    """Log lines written to the bar's stream go above the bar instead of through it: the
    handlers that hold ``out`` write to the bar's console while it runs."""
    handlers = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and h.stream is out
    ]
    above = _ConsoleWriter(bar.console)
    for handler in handlers:
        handler.setStream(above)
    try:
        yield
    finally:
        for handler in handlers:
            handler.setStream(out)


class _ConsoleWriter:
    """A text stream that prints whole lines through a rich console (above a live bar)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def write(self, text: str) -> int:
        line = text.rstrip("\n")
        if line:
            self.console.print(line, markup=False, highlight=False, emoji=False)
        return len(text)

    def flush(self) -> None:
        pass
