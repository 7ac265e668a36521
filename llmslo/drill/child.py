"""A part of a drill fleet in a spawned process of its own, driven over a pipe.

The drill's pipeline (:mod:`llmslo.drill.pipeline`) and its simulated pods
(:mod:`llmslo.drill.pods`) each run apart from the taps and the load, as they do in
production: on one interpreter lock, the pipeline's appends and the pods' token streams
delayed each other and the taps' measurements (a stutter no engine made).

Both talk the same small protocol. The child says ``("started", detail)`` or
``("failed", message)`` once; then for each ``(command, args)`` it receives it answers
``("ok", value)``, ``("refused", message)`` (a :class:`ConfigError`: bad names or params,
the child keeps serving) or ``("failed", message)``. It is started with ``spawn`` (the
parent has threads) and ignores SIGINT: a Ctrl-C in the terminal reaches every process of
the group, and the worker that owns the child stops it. Closing the parent's end (or the
parent's death) reads as EOF in the child, which then tears down and exits.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, Self

from pipeline.errors import ConfigError, LlmsloError

__all__ = ["DrillChild", "DrillChildError", "child_setup", "serve_commands"]

log = logging.getLogger(__name__)


class DrillChildError(LlmsloError):
    """A drill child (the pipeline, the pods) failed to start, failed, or did not answer."""


def child_setup(log_level: int) -> None:
    """What every drill child does first: ignore SIGINT, log at the parent's level."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve_commands(
    commands: Connection,
    handlers: dict[str, Callable[..., Any]],
    last: Iterable[str] = (),
) -> bool:
    """Answer commands until the parent goes away (returns ``False``; also when it went
    away before reading an answer, as a Ctrl-C'd parent does) or a command of ``last`` has
    been answered (returns ``True``)."""
    last = frozenset(last)
    while True:
        try:
            command, args = commands.recv()
        except (EOFError, OSError):  # closed; reset when it closed before reading an answer
            return False
        try:
            answer = ("ok", handlers[command](*args))
        except ConfigError as exc:
            answer = ("refused", str(exc))
        except Exception as exc:
            with contextlib.suppress(OSError):
                commands.send(("failed", f"{type(exc).__name__}: {exc}"))
            raise
        try:
            commands.send(answer)
        except OSError:
            return False
        if command in last:
            return True


class DrillChild:
    """``with DrillChild(name, target, args) as child: child.call(...)``: ``target(commands,
    *args)`` in a spawned child, which must report ``started`` within ``start_timeout_s``.

    Raises :class:`DrillChildError` (naming ``name``) when the child fails to start, fails,
    dies or does not answer; leaving the block closes the pipe, waits 30 s for the child to
    end and kills it if it does not.
    """

    def __init__(
        self,
        name: str,
        target: Callable[..., None],
        args: tuple[Any, ...],
        *,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.name = name
        self.started: Any = None  # the child's "started" detail, while it runs
        self._start_timeout_s = start_timeout_s
        context = multiprocessing.get_context("spawn")
        self._commands, self._child_end = context.Pipe()
        self._process = context.Process(
            target=target,
            args=(self._child_end, *args, logging.getLogger().getEffectiveLevel()),
            name=name.replace(" ", "-"),
            daemon=True,
        )

    def __enter__(self) -> Self:
        self._process.start()
        self._child_end.close()  # the child's end lives in the child: its death reads as EOF
        try:
            self.started = self._expect("started", self._start_timeout_s)
        except BaseException:  # no __exit__ follows a failed __enter__
            self.__exit__(None, None, None)
            raise
        return self

    def call(self, command: str, *args: Any, timeout_s: float = 60.0) -> Any:
        """Run ``command`` in the child; returns its value. Raises :class:`ConfigError` when
        the child refuses it, :class:`DrillChildError` when the child failed or is gone."""
        try:
            self._commands.send((command, args))
        except OSError:  # the child is gone: say how it ended
            self._process.join(5)
            raise self._exited(command) from None
        return self._expect("ok", timeout_s)

    def join(self, timeout_s: float) -> None:
        """Wait for the child to end; raises :class:`DrillChildError` if it does not end in
        time or ends with a non-zero code."""
        self._process.join(timeout_s)
        if self._process.is_alive():
            raise DrillChildError(f"{self.name} did not stop within {timeout_s:g} s")
        if self._process.exitcode != 0:
            raise self._exited("stopped")

    @property
    def pid(self) -> int | None:
        """The child's process id (``None`` before it started)."""
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        """The child's exit code, ``None`` while it runs (negative: killed by that signal)."""
        return self._process.exitcode

    def _expect(self, state: str, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while not self._commands.poll(0.2):
            if not self._process.is_alive():
                raise self._exited(state)
            if time.monotonic() > deadline:
                raise DrillChildError(f"{self.name} not {state} within {timeout_s:g} s")
        try:
            got, detail = self._commands.recv()
        except (EOFError, OSError):  # it died between poll and recv
            self._process.join(5)
            raise self._exited(state) from None
        if got == "refused":
            raise ConfigError(detail)
        if got != state:
            raise DrillChildError(f"{self.name} {got}: {detail}")
        return detail

    def _exited(self, state: str) -> DrillChildError:
        return DrillChildError(
            f"{self.name} exited with code {self._process.exitcode} before {state!r}"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._commands.close()  # the child's recv() sees EOF and stops
        self.started = None
        if self._process.pid is None:  # never started
            return
        self._process.join(30)
        if self._process.is_alive():
            log.warning("%s still running 30 s after the drill ended: killed", self.name)
            self._process.kill()
            self._process.join(5)
