"""Object-store faults on real parts: moto's S3 server paused for 30 s (SIGSTOP, then
SIGCONT: the process keeps its state, and a client meets what an unreachable store does,
a connection that answers nothing) while the Iceberg lake commits and while the Parquet
export uploads. Both back off, say so, and end with every row once."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline._offsets import StoredOffset
from pipeline.iceberg.lake import CommitReport
from pipeline.lake import export_hours
from pipeline.store import Store
from pipeline.units import HOUR_MS
from tests.pipeline.lake_servers import S3Server, postgres, s3_server
from tests.pipeline.test_iceberg_lake import LOG, TOPIC, _batch, _config, _lake, _values
from tests.pipeline.test_lake import T0, _store_hours
from tests.pipeline.test_lake_s3 import LAKE, NOW_MS, _lake_values, _objects

__all__ = ["postgres", "s3_server"]  # fixtures

pytestmark = pytest.mark.slow

PAUSE_S = 30.0


def _during_pause(
    server: S3Server, work: Callable[[], object], meanwhile: Callable[[], None]
) -> object:
    """Run ``work`` on a thread while the server is stopped for :data:`PAUSE_S`; its result."""
    result: list[object] = []
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=lambda: result.append(work()))
        stopped = time.monotonic()
        thread.start()
        meanwhile()
        time.sleep(max(0.0, PAUSE_S - (time.monotonic() - stopped)))
        assert thread.is_alive(), "the work ended while the store was stopped"
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    thread.join(timeout=120)
    assert not thread.is_alive() and result, "the work did not end once the store was back"
    return result[0]


def test_an_iceberg_commit_backs_off_while_the_store_is_stopped_and_lands_once(
    s3_server: S3Server, postgres: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lake = _lake(_config(s3_server, postgres, s3_server.credentials_file(tmp_path / "creds")))
    lake.append_batch(_batch(0, 100), {(TOPIC, 0): StoredOffset(1, LOG)})
    caplog.set_level(logging.WARNING, logger="pipeline.iceberg.lake")
    report = _during_pause(
        s3_server,
        lambda: lake.append_batch(_batch(100, 100), {(TOPIC, 0): StoredOffset(2, LOG)}),
        lambda: None,
    )
    assert isinstance(report, CommitReport)
    assert report.retries > 0 and report.seconds >= PAUSE_S - 1
    assert "Iceberg object store unreachable" in caplog.text and "retrying in" in caplog.text
    assert _values(lake) == [float(v) for v in range(200)]  # none lost, none doubled
    assert lake.read_offsets() == {(TOPIC, 0): StoredOffset(2, LOG)}


def test_an_s3_export_backs_off_while_the_store_is_stopped_and_the_ingester_goes_on(
    s3_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = _objects(s3_server, s3_server.credentials_file(tmp_path / "creds"), timeout_s=2.0)
    caplog.set_level(logging.WARNING, logger="pipeline.s3")
    commit_s: list[float] = []
    with Store(tmp_path / "a.duckdb") as store:
        _store_hours(store, hours=2, per_hour=100)

        def ingest_meanwhile() -> None:  # the ingester commits through the same store
            time.sleep(3.0)  # the export is retrying by now
            started = time.monotonic()
            _store_hours_at(store, T0 + 2 * HOUR_MS, first=200)
            commit_s.append(time.monotonic() - started)

        written = _during_pause(
            s3_server,
            lambda: export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=objects),
            ingest_meanwhile,
        )
        assert isinstance(written, list) and [w.rows for w in written] == [100, 100]
        assert export_hours(store, LAKE, "ingest-a", now_ts_ms=NOW_MS, objects=objects) == []
    assert commit_s and commit_s[0] < 5.0  # the upload held no lock the ingester needs
    assert objects.retries > 0 and "retrying in" in caplog.text
    assert len(s3_server.objects()) == 2
    assert _lake_values(objects) == [float(v) for v in range(200)]


def _store_hours_at(store: Store, hour_ms: int, *, first: int) -> None:
    from pipeline.codec import conform
    from pipeline.schema import ENGINE_SAMPLES
    from tests.pipeline.ingest_helpers import numbered_samples

    table = numbered_samples(first, 10, "pod-x")
    table = table.set_column(0, "ts_ms", [[hour_ms + i for i in range(10)]])
    store.commit_batch(
        {"engine_samples": [conform(ENGINE_SAMPLES, table)]}, group_id="g", offsets={}, now_ts_ms=0
    )
