"""The one publishing path: bounded, retrying with back-off, every drop counted by component and reason."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry

from pipeline.bus import Bus, BusProducer
from pipeline.codec import decode_message
from pipeline.errors import BusError
from pipeline.publisher import KafkaPublisher, PublishBuffer, Publisher, PublishMetrics
from pipeline.schema import FLAG_TRANSITIONS


def _flags(count: int, ts_ms: int = 1_000) -> pa.Table:
    rows = [
        {
            "ts_ms": ts_ms + i,
            "scope": "instance",
            "scope_id": f"pod-{i % 3}",
            "pool": "p",
            "from_level": 0,
            "to_level": 1,
            "kv_free_ratio": 0.05,
            "reason": "kv",
            "evidence_json": "{}",
        }
        for i in range(count)
    ]
    return pa.Table.from_pylist(rows, schema=FLAG_TRANSITIONS.storage_arrow)


def _dropped(registry: CollectorRegistry, component: str, reason: str) -> float:
    value = registry.get_sample_value(
        "llmslo_dropped_total", {"component": component, "reason": reason}
    )
    return value or 0.0


def test_a_full_buffer_drops_the_oldest_and_counts_them() -> None:
    registry = CollectorRegistry()
    hooked: list[tuple[str, int]] = []
    buffer = PublishBuffer(
        10, PublishMetrics("unit", registry), on_drop=lambda r, n: hooked.append((r, n))
    )
    for ts in (1_000, 2_000, 3_000):
        buffer.put(FLAG_TRANSITIONS, _flags(4, ts))
    assert buffer.rows == 8 and buffer.dropped_rows == 4
    assert _dropped(registry, "unit", "buffer_full") == 4 and hooked == [("buffer_full", 4)]
    batch = buffer.take(0)
    assert batch is not None and isinstance(batch.table, pa.Table)
    assert batch.table["ts_ms"][0].as_py() == 2_000  # the oldest left
    assert registry.get_sample_value("llmslo_publish_buffered_rows", {"component": "unit"}) == 4


def test_failures_back_off_exponentially_and_what_is_left_at_stop_is_counted() -> None:
    attempts: list[float] = []

    def unreachable() -> BusProducer:
        attempts.append(time.monotonic())
        raise BusError("no broker")

    registry = CollectorRegistry()
    buffer = PublishBuffer(100, PublishMetrics("unit", registry))
    publisher = KafkaPublisher(unreachable, buffer, backoff_s=0.05, backoff_max_s=0.4).start()
    buffer.put(FLAG_TRANSITIONS, _flags(5))
    time.sleep(1.6)
    publisher.stop(drain_timeout_s=0.1)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) >= 4
    assert gaps[0] < 0.2 and gaps[2] > 1.5 * gaps[0]  # 0.05, 0.1, 0.2, 0.4, 0.4, …
    assert max(gaps) < 0.4 + 0.3
    assert (
        registry.get_sample_value("llmslo_publish_errors_total", {"component": "unit"})
        == len(attempts)
        or len(attempts) - 1
    )
    assert _dropped(registry, "unit", "shutdown") == 5
    assert buffer.rows == 0 and publisher.in_flight_rows == 0


def test_components_share_one_registry_and_one_metric(bus: Bus) -> None:
    registry = CollectorRegistry()
    first = Publisher(bus.producer, component="collect", registry=registry, max_rows=3)
    second = Publisher(bus.producer, component="slo-jobs", registry=registry)
    try:
        second.put(FLAG_TRANSITIONS, _flags(6))
        assert second.flush(30)
        assert first.put(FLAG_TRANSITIONS, _flags(5)) == 5  # larger than its whole bound
    finally:
        first.close()
        second.close()
    assert second.published_rows == 6
    published = registry.get_sample_value(
        "llmslo_published_rows_total", {"component": "slo-jobs", "topic": "flags"}
    )
    assert published == 6
    assert _dropped(registry, "collect", "buffer_full") == 5
    consumer = bus.consumer(None)
    consumer.subscribe([bus.prefix + FLAG_TRANSITIONS.topic])
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(rows) < 6 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                rows += decode_message(record.value, record.headers).table.to_pylist()
    consumer.close()
    assert sorted(r["ts_ms"] for r in rows) == list(range(1_000, 1_006))


def test_batches_queued_together_travel_in_one_message_per_key_in_order(bus: Bus) -> None:
    buffer = PublishBuffer(1_000, PublishMetrics("unit"))
    for ts in (1_000, 2_000, 3_000):  # three batches, each of pod-0, pod-1 and pod-2
        buffer.put(FLAG_TRANSITIONS, _flags(6, ts))
    publisher = KafkaPublisher(bus.producer, buffer).start()  # all three already queued
    try:
        assert publisher.flush(60)
    finally:
        publisher.stop()
        publisher.close()
    assert publisher.published_rows == 18
    # one message per key, the batches' rows in the order they were put
    assert _messages(bus, 3) == _one_message_per_pod((1_000, 2_000, 3_000))


def _messages(bus: Bus, count: int) -> dict[bytes, list[list[int]]]:
    """The flag-transition messages on the bus (``count`` of them, or what came in 60 s):
    by key, each message's ``ts_ms``, every row checked to be of its message's key."""
    consumer = bus.consumer(None)
    consumer.subscribe([bus.prefix + FLAG_TRANSITIONS.topic])
    messages: dict[bytes, list[list[int]]] = {}
    deadline = time.monotonic() + 60
    while sum(map(len, messages.values())) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                rows = decode_message(record.value, record.headers).table.to_pylist()
                assert {r["scope_id"] for r in rows} == {record.key.decode()}
                messages.setdefault(record.key, []).append([int(r["ts_ms"]) for r in rows])
    consumer.close()
    return messages


def _one_message_per_pod(batches: tuple[int, ...]) -> dict[bytes, list[list[int]]]:
    """:func:`_messages` of ``_flags(6, ts)`` batches, ``ts`` in ``batches``, sent together."""
    return {
        f"pod-{pod}".encode(): [[ts + i for ts in batches for i in (pod, pod + 3)]]
        for pod in range(3)
    }


def test_a_gathering_publisher_sends_the_batches_put_within_its_window_together(
    bus: Bus,
) -> None:
    # the receiver's publisher: a delivery waits up to gather_s for more rows to go with it
    buffer = PublishBuffer(1_000, PublishMetrics("unit"))
    publisher = KafkaPublisher(bus.producer, buffer, gather_s=5.0).start()
    try:
        for ts in (1_000, 2_000, 3_000):  # put one after another, the publisher already waiting
            buffer.put(FLAG_TRANSITIONS, _flags(6, ts))
            time.sleep(0.2)
        assert publisher.flush(60)
    finally:
        publisher.stop()
        publisher.close()
    assert _messages(bus, 3) == _one_message_per_pod((1_000, 2_000, 3_000))


def test_a_gathering_publisher_sends_at_once_when_its_delivery_is_full(bus: Bus) -> None:
    buffer = PublishBuffer(1_000, PublishMetrics("unit"))
    publisher = KafkaPublisher(bus.producer, buffer, gather_s=600.0, max_delivery_rows=12).start()
    try:
        for ts in (1_000, 2_000):
            buffer.put(FLAG_TRANSITIONS, _flags(6, ts))
        assert publisher.flush(60)  # 12 rows: sent without waiting out the 600 s
    finally:
        publisher.stop()
        publisher.close()
    assert _messages(bus, 3) == _one_message_per_pod((1_000, 2_000))


def test_a_keys_message_carries_its_own_rows_and_names_alone(bus: Bus) -> None:
    # batches of one key each, the key column dictionary-encoded (as a scrape's or a pushed
    # target's rows): each key's message holds its rows, and no other key's name
    buffer = PublishBuffer(1_000, PublishMetrics("unit"))
    for ts in (1_000, 2_000):
        for pod in range(3):
            table = _flags(1, ts + 10 * pod).set_column(
                2, "scope_id", pa.array([f"pod-{pod}"]).dictionary_encode()
            )
            buffer.put(FLAG_TRANSITIONS, table)
    publisher = KafkaPublisher(bus.producer, buffer).start()
    try:
        assert publisher.flush(60)
    finally:
        publisher.stop()
        publisher.close()
    consumer = bus.consumer(None)
    consumer.subscribe([bus.prefix + FLAG_TRANSITIONS.topic])
    names: dict[bytes, list[str]] = {}
    ts_ms: dict[bytes, list[int]] = {}
    deadline = time.monotonic() + 60
    while sum(map(len, ts_ms.values())) < 6 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                table = decode_message(record.value, record.headers).table
                column = table.column("scope_id").combine_chunks()
                names[record.key] = column.dictionary.to_pylist()
                ts_ms.setdefault(record.key, []).extend(table.column("ts_ms").to_pylist())
    consumer.close()
    assert names == {f"pod-{pod}".encode(): [f"pod-{pod}"] for pod in range(3)}
    assert ts_ms == {
        f"pod-{pod}".encode(): [1_000 + 10 * pod, 2_000 + 10 * pod] for pod in range(3)
    }
