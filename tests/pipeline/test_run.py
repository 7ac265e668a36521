"""``llmslo run``: ingest and SLO jobs in one process on one DuckDB file, stopped cleanly."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from llmslo.run import Pipeline, load_model
from pipeline.broker import EmbeddedBroker, free_port
from pipeline.bus import Bus
from pipeline.config import parse_config
from pipeline.errors import BusError
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from tests.slo.factories import request, to_table

SPEC = {
    "version": "llmslo/v1",
    "service": "inference",
    "slos": [{"name": "availability", "objective": 0.99, "sli": {"kind": "availability"}}],
}


def _metric(url: str, prefix: str) -> float:
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def test_run_ingests_tap_records_and_evaluates_slos_until_sigterm(bus: Bus, tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    rows = [
        request(now_ms - 60_000 + i * 100, outcome="ok" if i % 10 else "upstream_timeout")
        for i in range(200)
    ]
    producer = bus.producer()
    producer.publish(REQUEST_RECORDS, to_table(REQUEST_RECORDS, rows))
    producer.flush()
    (tmp_path / "slo.yaml").write_text(yaml.safe_dump(SPEC))
    config = {
        "bus": {
            "bootstrap_servers": bus.bootstrap_servers,
            "topic_prefix": bus.prefix,
            "partitions": bus.config.partitions,
        },
        "store": {"path": str(tmp_path / "run.duckdb")},
        "ingest": {"group_id": f"run-{bus.prefix}", "batch_max_ms": 100},
        "slo": {"spec": str(tmp_path / "slo.yaml"), "interval_s": 1},
    }
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (tmp_path / "run.log").open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmslo",
                "run",
                "-c",
                str(tmp_path / "llmslo.yaml"),
                "--metrics-port",
                str(port),
                "--api-port",
                "0",  # any free port: parallel runs must not collide on the default 8190
            ],
            stdout=subprocess.PIPE,
            stderr=log,
        )
    metrics = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 120
        # Both halves work: rows are ingested and the SLO jobs compute a burn rate over them.
        while _metric(metrics, 'llmslo_ingest_rows_total{table="requests"}') < 200 or not _metric(
            metrics, "llmslo_slo_burn_rate{"
        ):
            assert process.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "llmslo run did not ingest and evaluate in time"
            time.sleep(0.2)
        # Where its memory is, for a reader telling DuckDB's filling cache from a leak.
        assert _metric(metrics, 'llmslo_memory_bytes{part="duckdb_limit"}') > 0
        assert _metric(metrics, 'llmslo_memory_bytes{part="duckdb"}') > 0
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    rows = json.loads(out.decode().strip().splitlines()[-1])["rows"]
    with Store(tmp_path / "run.duckdb", read_only=True) as store:
        assert store.count("requests") == 200
        # The run's own outputs come back through Kafka too: the alerts its jobs raised and
        # the heartbeats that tell consumers the jobs are alive.
        assert store.count("jobs_heartbeats") >= 1
        assert rows == 200 + store.count("alerts") + store.count("jobs_heartbeats")
        counts = store.con.execute("SELECT sum(bad), sum(total) FROM slo_minute").fetchone()
    assert counts == (20, 200)


def test_a_stopped_pipeline_leaves_no_kafka_client_behind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every client the pipeline made is closed by stop(): once the broker goes too, no
    background thread logs connection errors (the demo's output ended in those)."""
    # Clients an earlier test of this worker left behind log from their own threads: only
    # the threads this pipeline started are judged.
    earlier = {thread.ident for thread in threading.enumerate()}
    with EmbeddedBroker() as broker:
        config = parse_config(
            {
                "bus": {"bootstrap_servers": broker.bootstrap_servers, "partitions": 1},
                "store": {"path": str(tmp_path / "p.duckdb")},
            },
            source="test",
        )
        pipeline = Pipeline(config, load_model(None)).start()
        time.sleep(1.0)
        pipeline.stop()
    caplog.clear()  # closing itself may log (kafka-python reports its cancelled refresh)
    with caplog.at_level(logging.WARNING, logger="kafka"):
        time.sleep(3.0)  # a client left open would have failed to refresh metadata by now
    leaked = [r for r in caplog.records if r.name.startswith("kafka") and r.thread not in earlier]
    assert [f"{r.threadName}: {r.getMessage()}" for r in leaked] == []


def test_run_on_the_embedded_broker_prints_an_address_other_processes_can_join(
    tmp_path: Path,
) -> None:
    """The README's way to join processes: `llmslo run` prints its embedded broker's
    address, and a producer given it publishes into that pipeline's store."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmslo",
            "run",
            "--bootstrap-servers",
            "embedded",
            "--db",
            str(tmp_path / "run.duckdb"),
            "--no-api",
            "--metrics-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("Kafka: the embedded broker at "), line
        address = line.rsplit("--bootstrap-servers ", 1)[1].strip()
        now_ms = int(time.time() * 1000)
        with Bus(parse_config({"bus": {"bootstrap_servers": address}}).bus) as joined:
            producer = joined.producer()
            rows = [request(now_ms - 1000 + i, outcome="ok") for i in range(50)]
            producer.publish(REQUEST_RECORDS, to_table(REQUEST_RECORDS, rows))
            producer.flush()
            producer.close()
        metrics = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 120
        while _metric(metrics, 'llmslo_ingest_rows_total{table="requests"}') < 50:
            assert process.poll() is None
            assert time.monotonic() < deadline, "the joined producer's rows were not ingested"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    assert process.returncode == 0
    with Store(tmp_path / "run.duckdb", read_only=True) as store:
        assert store.count("requests") == 50


def test_an_unreachable_broker_says_where_the_address_comes_from() -> None:
    bus = Bus(parse_config({"bus": {"bootstrap_servers": f"127.0.0.1:{free_port()}"}}).bus)
    with pytest.raises(BusError, match="llmslo run") as raised:
        bus.ensure_topics()
    assert "--bootstrap-servers" in str(raised.value)
