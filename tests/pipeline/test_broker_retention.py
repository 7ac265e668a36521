"""The embedded broker keeps its log across its restart and stays under its bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

from pipeline.broker import EmbeddedBroker
from pipeline.errors import BusError

TOPIC = "retained"
PAYLOAD_BYTES = 1000


def _publish(broker: EmbeddedBroker, first: int, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5)
    for number in range(first, first + count):
        producer.send(TOPIC, str(number).encode().ljust(PAYLOAD_BYTES, b"."), partition=0)
    producer.flush()
    producer.close()


def _numbers(
    broker: EmbeddedBroker, group: str, want: int, commit_up_to: int | None = None
) -> list[int]:
    """Read ``want`` records as ``group`` from its committed offset; commit what was read
    (or only up to offset ``commit_up_to``)."""
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    numbers: list[int] = []
    for _ in range(60):
        if len(numbers) >= want:
            break
        for records in consumer.poll(timeout_ms=1000, max_records=5000).values():
            numbers += [int(r.value.rstrip(b".")) for r in records]
    if commit_up_to is None:
        consumer.commit()
    else:
        consumer.commit({tp: OffsetAndMetadata(commit_up_to, "", -1)})
    consumer.close()
    return numbers


def _rss_mb(broker: EmbeddedBroker) -> float:
    return sum(psutil.Process(pid).memory_info().rss for pid in broker.pids) / 1e6


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(
        data_dir=tmp_path / "log", max_bytes=3_000_000, retention_interval_s=3600
    ) as running:
        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap_servers)
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
        admin.close()
        yield running


def test_publishing_past_the_bound_keeps_the_log_under_it_and_every_uncommitted_record(
    broker: EmbeddedBroker,
) -> None:
    """20 MB through a 3 MB bound: what both groups committed goes, the rest stays."""
    assert broker.retention is not None
    rounds, per_round = 20, 1000  # 1 MB a round
    _numbers(broker, "slow", 0, commit_up_to=0)  # a group pins the log once it committed
    rss_start_mb = _rss_mb(broker)
    stored_bytes = []
    for round_ in range(rounds):
        _publish(broker, round_ * per_round, per_round)
        fast = _numbers(broker, "fast", per_round)
        assert fast == list(range(round_ * per_round, (round_ + 1) * per_round))
        if round_ % 2:  # the slow group catches up every other round, missing nothing
            slow = _numbers(broker, "slow", 2 * per_round)
            assert slow == list(range((round_ - 1) * per_round, (round_ + 1) * per_round))
        stored_bytes.append(broker.retention.run_once().stored_bytes)
    assert max(stored_bytes) <= 3_000_000
    assert broker.metrics.deleted_records.labels("committed")._value.get() >= 15 * per_round
    assert broker.metrics.deleted_records.labels("overflow")._value.get() == 0
    assert _rss_mb(broker) - rss_start_mb < 20  # the log is on disk, not in the broker


def test_a_group_far_behind_loses_only_the_counted_overflow(broker: EmbeddedBroker) -> None:
    assert broker.retention is not None
    _publish(broker, 0, 100)
    _numbers(broker, "slow", 100, commit_up_to=50)  # slow stays at offset 50
    for round_ in range(1, 8):
        _publish(broker, round_ * 1000, 1000)  # 7 MB more, never read by slow
        _numbers(broker, "fast", 1000)
        broker.retention.run_once()
    dropped = int(broker.metrics.deleted_records.labels("overflow")._value.get())
    assert dropped > 0
    produced = list(range(100)) + list(range(1000, 8000))
    read = _numbers(broker, "slow", 7050 - dropped)
    assert read == produced[-len(read) :]  # the newest records, in order, no gap, none twice
    # It lost no more than was counted (a dropped batch may straddle its committed offset).
    assert len(read) >= 7050 - dropped


def test_unread_records_survive_the_brokers_restart(tmp_path: Path) -> None:
    with EmbeddedBroker(data_dir=tmp_path / "log") as first:
        KafkaAdminClient(bootstrap_servers=first.bootstrap_servers).create_topics(
            [NewTopic(TOPIC, 1, 1)]
        )
        _publish(first, 0, 500)
        assert _numbers(first, "g", 200, commit_up_to=200)[:200] == list(range(200))
    with EmbeddedBroker(data_dir=tmp_path / "log") as second:
        assert _numbers(second, "g", 300) == list(range(200, 500))


def test_a_second_broker_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with (
        EmbeddedBroker(data_dir=tmp_path / "log"),
        pytest.raises(BusError, match="held by another embedded broker"),
    ):
        EmbeddedBroker(data_dir=tmp_path / "log").start()


def test_without_a_directory_the_log_is_temporary_and_removed() -> None:
    with EmbeddedBroker() as broker:
        assert broker.retention is not None
        root = broker.retention.topics_dir.parent.parent
        assert root.is_dir()
    assert not root.exists()


def test_a_deleted_topic_leaves_no_records_behind_and_its_successor_starts_empty(
    broker: EmbeddedBroker,
) -> None:
    """DeleteTopics on the durable log removes the topic's batches, keeps the broker up
    and answering, and a topic re-created under the same name starts a new log."""
    assert broker.retention is not None
    _publish(broker, 0, 500)
    records = broker.retention.topics_dir.glob(f"*/topics/{TOPIC}/partitions/*/records/*")
    assert list(records)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        answer = admin.delete_topics([TOPIC])  # on a failure the broker drops the connection
        assert [t["error_code"] for t in answer["topics"]] == [0]
        assert TOPIC not in admin.list_topics()
        batches = broker.retention.topics_dir.glob(f"*/topics/{TOPIC}/**/*.batch")
        assert list(batches) == []
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
    finally:
        admin.close()
    _publish(broker, 1000, 100)
    assert _numbers(broker, "after", 100) == list(range(1000, 1100))
