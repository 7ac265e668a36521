"""The pipeline of one drill fleet (``llmslo run``: ingest, SLO jobs, alert pusher) in a
process of its own.

The drill times what the taps see, and the taps share their process with the simulated
pods, the collector and the load. In that process the pipeline's CPU (decoding fetched
batches, DuckDB appends, a detector cycle every 2 s) held the interpreter lock for tens to
hundreds of milliseconds at a time, so the taps measured token gaps the engines never made
and the healthy pods burned the ITL-jitter SLO. In production the pipeline runs apart from
the taps too (``llmslo run`` and ``llmslo tap`` are separate processes), which this restores.

The child is started with ``spawn`` (the parent has threads), reports when it runs, and on
:meth:`PipelineProcess.finish` runs a last SLO cycle, lets its flag transitions and alerts
travel into the store and to Alertmanager, and stops; the parent then opens the DuckDB file
(DuckDB lets one process at a time open it for writing).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from multiprocessing.connection import Connection
from types import TracebackType

import duckdb

from llmslo.run import Pipeline, load_model
from pipeline.config import LlmsloConfig
from pipeline.errors import LlmsloError
from slo.flags import FlagPolicy
from slo.jobs import JobsConfig

__all__ = ["PipelineProcess"]

log = logging.getLogger(__name__)

#: After the last cycle: its flag transitions travel the bus into the store and its alerts
#: are posted before the pipeline stops.
SETTLE_S = 3.0


class DrillPipelineError(LlmsloError):
    """The drill's pipeline process failed to start, failed, or did not answer."""


def _serve(config: LlmsloConfig, commands: Connection, log_level: int) -> None:
    """The child: run the pipeline until told to finish (or the parent goes away).

    It ignores SIGINT: a Ctrl-C in the terminal reaches every process of the group, and the
    worker that owns this child stops it (a ``KeyboardInterrupt`` here only printed a
    traceback in the middle of the teardown)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        pipeline = Pipeline(config, load_model(None)).start()
    except BaseException as exc:
        commands.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    try:
        commands.send(("started", ""))
        try:
            command = commands.recv()
        except EOFError:  # the parent is gone (the drill was stopped): tear down quietly,
            # kafka-python logs sockets it closes under a pending read as ERROR tracebacks
            logging.getLogger("kafka").setLevel(logging.CRITICAL)
            return
        if command == "finish":
            pipeline.final_cycle()
            time.sleep(SETTLE_S)
            failure = pipeline.failure
            commands.send(("failed", repr(failure)) if failure else ("finished", ""))
    finally:
        pipeline.stop()


class PipelineProcess:
    """``with PipelineProcess(config) as pipeline: …; pipeline.finish()``: the drill
    pipeline in a child process. Raises :class:`DrillPipelineError` when the child fails to
    start within ``start_timeout_s`` or fails; leaving the block kills a child still running."""

    def __init__(self, config: LlmsloConfig, *, start_timeout_s: float = 60.0) -> None:
        self.config = config
        self._start_timeout_s = start_timeout_s
        context = multiprocessing.get_context("spawn")
        self._commands, self._child_end = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(config, self._child_end, logging.getLogger().getEffectiveLevel()),
            name="drill-pipeline",
            daemon=True,
        )

    def __enter__(self) -> PipelineProcess:
        self._process.start()
        self._child_end.close()  # the child's end lives in the child: its death reads as EOF
        try:
            self._expect("started", self._start_timeout_s)
        except BaseException:  # no __exit__ follows a failed __enter__
            self.__exit__(None, None, None)
            raise
        return self

    def finish(self, timeout_s: float = 120.0) -> None:
        """Run the last SLO cycle, let its rows and alerts settle, stop the pipeline and wait
        for the process to end (its DuckDB file is then free to open)."""
        try:
            self._commands.send("finish")
        except OSError:  # the child is gone: say how it ended
            self._process.join(5)
            raise self._exited("finished") from None
        self._expect("finished", timeout_s)
        self._process.join(timeout_s)
        if self._process.is_alive():
            raise DrillPipelineError(f"drill pipeline did not stop within {timeout_s:g} s")
        if self._process.exitcode != 0:  # stopping failed: the last rows may be missing
            raise self._exited("stopped")

    @property
    def pid(self) -> int | None:
        """The child's process id (``None`` before it started)."""
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        """The child's exit code, ``None`` while it runs (negative: killed by that signal)."""
        return self._process.exitcode

    @property
    def flag_policy(self) -> FlagPolicy:
        """The flag lines and dwell the pipeline's jobs run with."""
        return self.config.section("slo", JobsConfig).flags

    def stored(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to the pipeline's DuckDB file (after :meth:`finish`)."""
        return duckdb.connect(str(self.config.store.path), read_only=True)

    def _expect(self, state: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._commands.poll(0.2):
            if not self._process.is_alive():
                raise self._exited(state)
            if time.monotonic() > deadline:
                raise DrillPipelineError(f"drill pipeline not {state} within {timeout_s:g} s")
        try:
            got, detail = self._commands.recv()
        except (EOFError, OSError):  # it died between poll and recv
            self._process.join(5)
            raise self._exited(state) from None
        if got != state:
            raise DrillPipelineError(f"drill pipeline {got}: {detail}")

    def _exited(self, state: str) -> DrillPipelineError:
        return DrillPipelineError(
            f"drill pipeline exited with code {self._process.exitcode} before {state!r}"
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._commands.close()  # the child's recv() sees EOF and stops the pipeline
        if self._process.pid is None:  # never started
            return
        self._process.join(30)
        if self._process.is_alive():
            log.warning("drill pipeline still running 30 s after the drill ended: killed")
            self._process.kill()
            self._process.join(5)
