"""The pipeline of one drill fleet (``llmslo run``: ingest, SLO jobs, alert pusher) in a
process of its own.

The drill times what the taps see, and the taps share their process with the collector and
the load. In that process the pipeline's CPU (decoding fetched batches, DuckDB appends, a
detector cycle every 2 s) held the interpreter lock for tens to hundreds of milliseconds at
a time, so the taps measured token gaps the engines never made and the healthy pods burned
the ITL-jitter SLO. In production the pipeline runs apart from
the taps too (``llmslo run`` and ``llmslo tap`` are separate processes), which this restores.

The child (:mod:`llmslo.drill.child`) reports when it runs, and on
:meth:`PipelineProcess.finish` runs a last SLO cycle, lets its flag transitions and alerts
travel into the store and to Alertmanager, and stops; the parent then opens the DuckDB file
(DuckDB lets one process at a time open it for writing).
"""

from __future__ import annotations

import logging
import time
from multiprocessing.connection import Connection

import duckdb

from llmslo.drill.child import DrillChild, child_setup, serve_commands
from llmslo.run import Pipeline, load_model
from pipeline.config import LlmsloConfig
from slo.flags import FlagPolicy
from slo.jobs import JobsConfig

__all__ = ["PipelineProcess"]

#: After the last cycle: its flag transitions travel the bus into the store and its alerts
#: are posted before the pipeline stops.
SETTLE_S = 3.0


def _serve(commands: Connection, config: LlmsloConfig, log_level: int) -> None:
    """The child: run the pipeline until told to finish (or the parent goes away)."""
    child_setup(log_level)
    try:
        pipeline = Pipeline(config, load_model(None)).start()
    except BaseException as exc:
        commands.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    try:
        commands.send(("started", ""))

        def finish() -> None:
            pipeline.final_cycle()
            time.sleep(SETTLE_S)
            if pipeline.failure:
                raise RuntimeError(repr(pipeline.failure))

        if not serve_commands(commands, {"finish": finish}, last=("finish",)):
            # the parent is gone (the drill was stopped): tear down quietly, kafka-python
            # logs sockets it closes under a pending read as ERROR tracebacks
            logging.getLogger("kafka").setLevel(logging.CRITICAL)
    finally:
        pipeline.stop()


class PipelineProcess(DrillChild):
    """``with PipelineProcess(config) as pipeline: …; pipeline.finish()``: the drill
    pipeline in a child process (a :class:`~llmslo.drill.child.DrillChild`). Raises
    :class:`~llmslo.drill.child.DrillChildError` when the child fails to start within
    ``start_timeout_s`` or fails; leaving the block stops a child still running."""

    def __init__(self, config: LlmsloConfig, *, start_timeout_s: float = 60.0) -> None:
        super().__init__("drill pipeline", _serve, (config,), start_timeout_s=start_timeout_s)
        self.config = config

    def finish(self, timeout_s: float = 120.0) -> None:
        """Run the last SLO cycle, let its rows and alerts settle, stop the pipeline and wait
        for the process to end (its DuckDB file is then free to open)."""
        self.call("finish", timeout_s=timeout_s)
        self.join(timeout_s)  # stopping failed: the last rows may be missing

    @property
    def flag_policy(self) -> FlagPolicy:
        """The flag lines and dwell the pipeline's jobs run with."""
        return self.config.section("slo", JobsConfig).flags

    def stored(self) -> duckdb.DuckDBPyConnection:
        """A read-only connection to the pipeline's DuckDB file (after :meth:`finish`)."""
        return duckdb.connect(str(self.config.store.path), read_only=True)
