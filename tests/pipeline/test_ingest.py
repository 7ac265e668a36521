"""Ingest into a real DuckDB file from the real embedded broker."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest
from kafka import TopicPartition

from pipeline.bus import DEADLETTER_TOPIC, Bus
from pipeline.codec import JSON_CONTENT_TYPE, encode_arrow, headers_for
from pipeline.config import IngestConfig
from pipeline.ingest import Ingester
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS
from pipeline.store import Store
from tests.pipeline.ingest_helpers import (
    numbered_samples,
    produce_numbered,
    start_ingest,
    wait_for_log,
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
    assert sum(offsets.values()) == 10  # ten messages, offsets are next-to-read
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


def test_third_party_json_records_are_ingested(bus: Bus, store: Store) -> None:
    record = {
        "request_id": "r-1",
        "attempt": 1,
        "instance": "10.0.0.1:8000",
        "received_ts_ms": 1_700_000_000_000,
        "outcome": "ok",
        "ttft_s": 0.08,
        "itl_gaps_s": [0.01, 0.02],
    }
    producer = bus.producer()
    producer.send_raw(
        "requests",
        json.dumps(record).encode(),
        key=b"10.0.0.1:8000",
        headers=headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
    )
    producer.flush()
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
    while ingester.stats.messages < 20:
        worker.join(0.1)
    assert store.count("engine_samples") == 0
    ingester.stop()
    worker.join(30)
    assert store.count("engine_samples") == 2_000


def test_sigterm_finishes_the_batch_and_exits_zero(bus: Bus, tmp_path: Path) -> None:
    produce_numbered(bus, total=20_000, per_message=1_000)
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_rows=10**9, batch_max_ms=10**9)
    db = tmp_path / "sigterm.duckdb"
    log = tmp_path / "ingest.log"
    process = start_ingest(config, db, log)
    wait_for_log(process, log, "starts at offset")
    time.sleep(2.0)  # consuming; nothing is committed yet (batches are never due by size or age)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    summary = json.loads(out.strip().splitlines()[-1])
    with Store(db, read_only=True) as store:
        stored = store.count("engine_samples")
    assert stored == summary["rows"] == 20_000
