"""Ingest into a real DuckDB file from the real embedded broker."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from kafka import TopicPartition

from pipeline.broker import free_port
from pipeline.bus import DEADLETTER_TOPIC, Bus
from pipeline.codec import JSON_CONTENT_TYPE, encode_arrow, headers_for
from pipeline.config import IngestConfig
from pipeline.errors import StoreError
from pipeline.ingest import Ingester
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS
from pipeline.store import Store
from tests.pipeline.ingest_helpers import (
    numbered_samples,
    produce_numbered,
    start_ingest,
    write_config,
)


def _ingest_until_idle(bus: Bus, store: Store, idle_s: float = 2.0) -> Ingester:
    ingester = Ingester(bus, store, IngestConfig(group_id=bus.prefix, batch_max_ms=100))
    ingester.run(max_idle_s=idle_s)
    return ingester


def test_samples_land_in_duckdb_with_offsets_stored(bus: Bus, store: Store) -> None:
    produce_numbered(bus, total=5_000, per_message=500)
    ingester = _ingest_until_idle(bus, store)
    values = store.con.execute("SELECT value FROM engine_samples ORDER BY value").fetchall()
    assert [v for (v,) in values] == list(range(5_000))
    offsets = store.read_offsets(bus.prefix)
    assert sum(o.next_offset for o in offsets.values()) == 10  # offsets are next-to-read
    # Each names the log it indexes: the broker's cluster and this topic's UUID.
    assert {(o.log.cluster_id, o.log.topic_id is not None) for o in offsets.values()} == {
        ("tansu_cluster", True)
    }
    assert ingester.stats.deadletters == 0


def test_poison_messages_are_dead_lettered_and_good_ones_around_them_kept(
    bus: Bus, store: Store
) -> None:
    producer = bus.producer()
    good = lambda first: encode_arrow(ENGINE_SAMPLES, numbered_samples(first, 10, "pod-0"))  # noqa: E731
    arrow = headers_for(ENGINE_SAMPLES)
    truncated = good(1000)[:-40]
    poison = [
        (b"\x00\x01garbage", arrow, "not_arrow"),
        (truncated, arrow, "truncated_arrow"),
        (good(2000), [("llmslo-schema", b"engine_sample.v9")], "unknown_schema"),
        (b"x" * 3_000_000, arrow, "oversized"),
        (b'{"request_id": 1}', headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE), "schema_mismatch"),
    ]
    producer.send_raw("engine", good(0), key=b"pod-0", headers=arrow)
    for payload, headers, _ in poison:
        producer.send_raw("engine", payload, key=b"pod-0", headers=headers)
    producer.send_raw("engine", good(10), key=b"pod-0", headers=arrow)
    producer.flush()

    ingester = Ingester(
        bus, store, IngestConfig(group_id=bus.prefix, batch_max_ms=100, max_message_bytes=2_000_000)
    )
    ingester.run(max_idle_s=2.0)

    values = [
        v
        for (v,) in store.con.execute("SELECT value FROM engine_samples ORDER BY value").fetchall()
    ]
    assert values == list(range(20))
    letters = store.con.execute(
        'SELECT reason, error, payload_bytes FROM deadletter ORDER BY "offset"'
    ).fetchall()
    assert [reason for reason, _, _ in letters] == [reason for _, _, reason in poison]
    assert all(error for _, error, _ in letters)
    assert (
        letters[3][2] == 3_000_000
    )  # the oversized payload's length is kept even though its bytes are cut

    consumer = bus.consumer(None)
    parts = [TopicPartition(bus.prefix + DEADLETTER_TOPIC, p) for p in range(bus.config.partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    republished = []
    for _ in range(50):
        for records in consumer.poll(timeout_ms=200).values():
            republished += [dict(r.headers)["llmslo-deadletter-reason"].decode() for r in records]
        if len(republished) == len(poison):
            break
    consumer.close()
    assert sorted(republished) == sorted(reason for _, _, reason in poison)


def _send_json_request_record(
    bus: Bus, request_id: str, *, compression_type: str | None = None, **fields: object
) -> None:
    """One REQUEST_RECORDS row as a third-party producer sends it: JSON, with its own
    choice of Kafka compression."""
    record = {
        "request_id": request_id,
        "attempt": 1,
        "instance": "10.0.0.1:8000",
        "received_ts_ms": 1_700_000_000_000,
        "outcome": "ok",
        **fields,
    }
    producer = bus.producer(compression_type=compression_type)
    producer.send_raw(
        "requests",
        json.dumps(record).encode(),
        key=b"10.0.0.1:8000",
        headers=headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
    )
    producer.close()


def test_third_party_json_records_are_ingested(bus: Bus, store: Store) -> None:
    _send_json_request_record(bus, "r-1", ttft_s=0.08, itl_gaps_s=[0.01, 0.02])
    _ingest_until_idle(bus, store)
    row = store.con.execute(
        "SELECT request_id, outcome, ttft_s, itl_gaps_s FROM requests"
    ).fetchall()
    assert row == [("r-1", "ok", 0.08, [pytest.approx(0.01), pytest.approx(0.02)])]


def test_stop_commits_the_batch_in_hand(bus: Bus, store: Store) -> None:
    produce_numbered(bus, total=2_000, per_message=100)
    ingester = Ingester(
        bus, store, IngestConfig(group_id=bus.prefix, batch_max_rows=10**9, batch_max_ms=10**9)
    )
    worker = threading.Thread(target=ingester.run)
    worker.start()
    # Batches never become due by size or age here: only stop() makes the rows durable.
    deadline = time.monotonic() + 120
    while ingester.stats.messages < 20:
        assert worker.is_alive() and time.monotonic() < deadline, "the ingester stopped consuming"
        worker.join(0.1)
    assert store.count("engine_samples") == 0
    ingester.stop()
    worker.join(30)
    assert store.count("engine_samples") == 2_000


def _metric(url: str, name: str) -> float:
    """Sum of a metric's samples on a /metrics page (0 if absent or unreachable)."""
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.slow
def test_sigterm_finishes_the_batch_and_exits_zero(bus: Bus, tmp_path: Path) -> None:
    produce_numbered(bus, total=20_000, per_message=1_000)
    port = free_port()
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_rows=10**9, batch_max_ms=10**9)
    db = tmp_path / "sigterm.duckdb"
    log = tmp_path / "ingest.log"
    process = start_ingest(config, db, log, "--metrics-port", str(port))
    metrics = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 120
    # All 20 messages consumed, none committed (batches are never due by size or age).
    while _metric(metrics, "llmslo_ingest_messages_total") < 20:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)
    assert _metric(metrics, "llmslo_ingest_rows_total") == 0
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    summary = json.loads(out.strip().splitlines()[-1])
    with Store(db, read_only=True) as store:
        stored = store.count("engine_samples")
    assert stored == summary["rows"] == 20_000


@pytest.mark.slow
def test_metrics_endpoint_reports_rows_dead_letters_and_commit_latency(
    bus: Bus, tmp_path: Path
) -> None:
    produce_numbered(bus, total=3_000, per_message=1_000)
    producer = bus.producer()
    producer.send_raw("engine", b"not arrow", key=b"pod-0", headers=headers_for(ENGINE_SAMPLES))
    producer.flush()
    port = free_port()
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_ms=50)
    process = start_ingest(
        config, tmp_path / "m.duckdb", tmp_path / "ingest.log", "--metrics-port", str(port)
    )
    metrics = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 120
    while _metric(metrics, 'llmslo_ingest_rows_total{table="engine_samples"}') < 3_000:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    while _metric(metrics, 'llmslo_ingest_deadletters_total{reason="not_arrow"}') < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert _metric(metrics, "llmslo_ingest_commit_seconds_count") >= 1
    assert _metric(metrics, "llmslo_ingest_last_commit_timestamp_seconds") > 1_700_000_000


def test_an_empty_message_is_stored_as_nothing_and_consumed(bus: Bus, store: Store) -> None:
    producer = bus.producer()
    good = encode_arrow(ENGINE_SAMPLES, numbered_samples(0, 10, "pod-0"))
    producer.send_raw("engine", good, key=b"pod-0", headers=headers_for(ENGINE_SAMPLES))
    producer.send_raw(
        "engine", b"[]", key=b"pod-0", headers=headers_for(ENGINE_SAMPLES, JSON_CONTENT_TYPE)
    )
    producer.flush()
    ingester = _ingest_until_idle(bus, store)
    assert store.count("engine_samples") == 10
    assert ingester.stats.messages == 2 and ingester.stats.deadletters == 0
    assert sum(o.next_offset for o in store.read_offsets(bus.prefix).values()) == 2


class _FailingStore(Store):
    """A real store whose first commit fails, as a full disk would."""

    commits = 0

    def commit_batch(self, *args: object, **kwargs: object) -> None:
        self.commits += 1
        if self.commits == 1:
            raise StoreError("disk full (simulated)")
        super().commit_batch(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_failed_commit_stops_ingest_without_skipping_its_rows(bus: Bus, tmp_path: Path) -> None:
    produce_numbered(bus, total=500, per_message=100)
    path = tmp_path / "failing.duckdb"
    config = IngestConfig(group_id=bus.prefix, batch_max_ms=10)
    with _FailingStore(path) as store:
        ingester = Ingester(bus, store, config)
        with pytest.raises(StoreError, match="disk full"):
            ingester.run(max_idle_s=30)
        # Nothing after the failed batch was committed either (its offsets would skip it).
        assert store.count("engine_samples") == 0
        assert store.read_offsets(bus.prefix) == {}
    with Store(path) as store:
        Ingester(bus, store, config).run(max_idle_s=3)
        values = [
            v
            for (v,) in store.con.execute(
                "SELECT value FROM engine_samples ORDER BY value"
            ).fetchall()
        ]
    assert values == list(range(500))


def test_records_compressed_by_third_party_producers_are_ingested(bus: Bus, store: Store) -> None:
    """Other teams' producers pick their own Kafka compression; every codec Kafka defines
    must decode (a missing codec library stops the consumer at the first such batch)."""
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    for codec in codecs:
        _send_json_request_record(bus, f"r-{codec}", compression_type=codec)
    _ingest_until_idle(bus, store)
    stored = store.con.execute("SELECT request_id FROM requests ORDER BY request_id").fetchall()
    assert stored == sorted((f"r-{codec}",) for codec in codecs)
