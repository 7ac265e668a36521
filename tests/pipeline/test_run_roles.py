"""``llmslo run --role ingest|jobs``: fleet ingesters feed the lake, the jobs read it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import yaml

from pipeline.bus import Bus
from pipeline.lake import lake_view_sql
from pipeline.schema import ENGINE_SAMPLES
from tests.pipeline.ingest_helpers import numbered_samples, start_run, wait_for_log

pytestmark = pytest.mark.slow


def _config(
    tmp_path: Path, bus: Bus, slo: dict[str, object] | None = None, **store: object
) -> Path:
    path = tmp_path / "llmslo.yaml"
    config = {
        "bus": {
            "bootstrap_servers": bus.bootstrap_servers,
            "topic_prefix": bus.prefix,
            "partitions": bus.config.partitions,
        },
        "store": store,
        "ingest": {"group_id": f"group-{uuid.uuid4().hex[:8]}", "batch_max_ms": 100},
        "slo": slo or {},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _run(config: Path, db: Path, role: str, log: Path) -> subprocess.Popen[bytes]:
    return start_run(log, "-c", str(config), "--db", str(db), "--role", role)


def _lake_rows(lake: Path) -> list[tuple[int, int, float]]:
    if not any(lake.glob("engine_samples/*/*/*.parquet")):
        return [(0, 0, 0.0)]
    with duckdb.connect() as con:
        return con.execute(
            f"SELECT count(*), count(DISTINCT value), coalesce(max(value), 0) "
            f"FROM ({lake_view_sql(lake, 'engine_samples')})"
        ).fetchall()


def test_the_jobs_role_without_a_lake_is_refused(bus: Bus, tmp_path: Path) -> None:
    config = _config(tmp_path, bus)
    process = _run(config, tmp_path / "jobs.duckdb", "jobs", tmp_path / "jobs.log")
    process.communicate(timeout=60)
    assert process.returncode != 0
    assert "store.lake_dir" in (tmp_path / "jobs.log").read_text()


def test_two_ingest_roles_fill_the_lake_and_the_jobs_role_reads_it(
    bus: Bus, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    config = _config(
        tmp_path, bus, slo={"interval_s": 0.5}, lake_dir=str(lake), lake_export_interval_s=1.0
    )
    members = [
        _run(config, tmp_path / f"ingest-{name}.duckdb", "ingest", tmp_path / f"{name}.log")
        for name in "ab"
    ]
    # Samples of the current hour: an hour older than the grace period would be frozen at
    # the first export round, and rows of it arriving later would never reach the lake.
    now_ms = int(time.time() * 1000)
    producer = bus.producer()
    for start in range(0, 20_000, 500):
        table = numbered_samples(start, 500, f"pod-{start // 500 % 8}")
        ts_ms = pa.array(np.arange(start, start + 500, dtype=np.int64) + now_ms)
        producer.publish(ENGINE_SAMPLES, table.set_column(0, "ts_ms", ts_ms))
    producer.flush()
    producer.close()
    deadline = time.monotonic() + 120
    while _lake_rows(lake) != [(20_000, 20_000, 19_999.0)]:
        assert all(m.poll() is None for m in members), (tmp_path / "a.log").read_text()[-2000:]
        assert time.monotonic() < deadline, _lake_rows(lake)
        time.sleep(0.5)
    for member in members:
        member.send_signal(signal.SIGTERM)
        out, _ = member.communicate(timeout=60)
        assert member.returncode == 0
        assert b'"role": "ingest"' in out
    # Both exported their own share, each under its own file name.
    assert len({p.name for p in lake.glob("engine_samples/*/*/*.parquet")}) == 2
    assert _lake_rows(lake) == [(20_000, 20_000, 19_999.0)]

    # The jobs role evaluates over that lake from its own file, never opening the ingesters'.
    jobs = _run(config, tmp_path / "jobs.duckdb", "jobs", tmp_path / "jobs.log")
    wait_for_log(jobs, tmp_path / "jobs.log", "first SLO cycle over")
    time.sleep(3)  # the next cycle starts 0.5 s after it; a stop lets a started cycle end
    assert jobs.poll() is None, (tmp_path / "jobs.log").read_text()[-2000:]
    jobs.send_signal(signal.SIGTERM)
    out, _ = jobs.communicate(timeout=60)
    assert jobs.returncode == 0, (tmp_path / "jobs.log").read_text()[-2000:]
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["role"] == "jobs" and summary["cycles"] >= 2
    with duckdb.connect(str(tmp_path / "jobs.duckdb"), read_only=True) as con:
        newest = con.execute("SELECT max(ts_ms) FROM engine_samples").fetchall()
    assert newest == [(now_ms + 19_999,)]  # the views over the lake persist in the jobs' file


def _iceberg_rows(config: Path) -> int:
    from pipeline.config import StoreConfig
    from pipeline.iceberg.lake import open_iceberg_lake

    store = StoreConfig.model_validate(yaml.safe_load(config.read_text())["store"])
    lake = open_iceberg_lake(store, "reader", "")
    assert lake is not None
    table = lake.table("engine_samples")
    return int(table.scan(selected_fields=("value",)).to_arrow().num_rows)


def test_ingest_roles_append_to_the_iceberg_lake_and_the_jobs_role_mirrors_it(
    bus: Bus, tmp_path: Path
) -> None:
    iceberg = {
        "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": str(tmp_path / "warehouse"),
    }
    config = _config(tmp_path, bus, slo={"interval_s": 0.5}, lake="iceberg", iceberg=iceberg)
    members = [
        _run(config, tmp_path / f"ingest-{name}.duckdb", "ingest", tmp_path / f"{name}.log")
        for name in "ab"
    ]
    now_ms = int(time.time() * 1000)
    producer = bus.producer()
    for start in range(0, 20_000, 500):
        table = numbered_samples(start, 500, f"pod-{start // 500 % 8}")
        ts_ms = pa.array(np.arange(start, start + 500, dtype=np.int64) + now_ms)
        producer.publish(ENGINE_SAMPLES, table.set_column(0, "ts_ms", ts_ms))
    producer.flush()
    producer.close()
    deadline = time.monotonic() + 120
    # Nothing is exported: each committed batch is an Iceberg commit.
    while not (tmp_path / "catalog.db").exists() or _iceberg_rows(config) < 20_000:
        assert all(m.poll() is None for m in members), (tmp_path / "a.log").read_text()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.5)
    for member in members:
        member.send_signal(signal.SIGTERM)
        member.communicate(timeout=60)
        assert member.returncode == 0, (tmp_path / "a.log").read_text()[-2000:]
    assert _iceberg_rows(config) == 20_000  # once each, from two members
    assert not (tmp_path / "lake").exists()

    jobs = _run(config, tmp_path / "jobs.duckdb", "jobs", tmp_path / "jobs.log")
    wait_for_log(jobs, tmp_path / "jobs.log", "first SLO cycle over the Iceberg lake")
    time.sleep(2)
    assert jobs.poll() is None, (tmp_path / "jobs.log").read_text()[-2000:]
    jobs.send_signal(signal.SIGTERM)
    out, _ = jobs.communicate(timeout=60)
    assert jobs.returncode == 0, (tmp_path / "jobs.log").read_text()[-2000:]
    assert json.loads(out.decode().strip().splitlines()[-1])["cycles"] >= 2
    with duckdb.connect(str(tmp_path / "jobs.duckdb"), read_only=True) as con:
        found = con.execute(
            "SELECT count(*), count(DISTINCT value), max(ts_ms) FROM engine_samples"
        ).fetchall()
    assert found == [(20_000, 20_000, now_ms + 19_999)]
