"""The drill's pipeline in a child process: it runs, finishes with a last cycle and frees
its DuckDB file; a child that cannot start or dies is a clear error, never a hang."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from llmslo.drill.child import DrillChildError
from llmslo.drill.pipeline import PipelineProcess
from llmslo.sections import parse_config
from pipeline.broker import EmbeddedBroker
from pipeline.config import LlmsloConfig


def _config(broker: EmbeddedBroker, db: Path) -> LlmsloConfig:
    return parse_config(
        {
            "bus": {
                "bootstrap_servers": broker.bootstrap_servers,
                "topic_prefix": f"dp{uuid.uuid4().hex[:10]}.",
            },
            "store": {"path": str(db)},
            "slo": {"interval_s": 0.5},
        },
        source="test",
    )


def test_finish_runs_the_last_cycle_and_frees_the_store(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    db = tmp_path / "drill.duckdb"
    with PipelineProcess(_config(broker, db)) as pipeline:
        pipeline.finish()
        assert pipeline.exitcode == 0
        with pipeline.stored() as con:
            tables = {row[0] for row in con.execute("SHOW TABLES").fetchall()}
    assert {"engine_samples", "requests", "slo_findings", "flag_transitions"} <= tables
    assert pipeline.flag_policy.l1_free == pytest.approx(0.10)


def test_a_child_that_cannot_start_is_a_clear_error(broker: EmbeddedBroker, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    started = time.monotonic()
    with (
        pytest.raises(DrillChildError, match="drill pipeline failed: FileExistsError"),
        PipelineProcess(_config(broker, blocker / "drill.duckdb")),
    ):
        pass
    assert time.monotonic() - started < 60


def test_a_child_that_dies_is_reported_by_finish(broker: EmbeddedBroker, tmp_path: Path) -> None:
    with PipelineProcess(_config(broker, tmp_path / "drill.duckdb")) as pipeline:
        assert pipeline.pid is not None
        os.kill(pipeline.pid, signal.SIGKILL)
        with pytest.raises(DrillChildError, match="exited with code -9"):
            pipeline.finish(timeout_s=20)


def test_leaving_without_finish_stops_the_child(broker: EmbeddedBroker, tmp_path: Path) -> None:
    with PipelineProcess(_config(broker, tmp_path / "drill.duckdb")) as pipeline:
        assert pipeline.exitcode is None  # running
    assert pipeline.exitcode == 0
