"""A producer closed while no broker answers stops its client thread (the demo's and the
tests' output ended in that thread's connection errors)."""

from __future__ import annotations

import logging
import threading

import pytest

from pipeline.broker import EmbeddedBroker
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.schema import REQUEST_RECORDS


def test_a_producer_closed_after_its_broker_died_drops_what_is_queued_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = EmbeddedBroker().start()
    try:
        bus = Bus(BusConfig(bootstrap_servers=broker.bootstrap_servers, partitions=1)).start()
        bus.ensure_topics()
        earlier = set(threading.enumerate())
        producer = bus.producer()
        producer.send_raw(REQUEST_RECORDS.topic, b"delivered").get(timeout=60)
    finally:
        broker.stop()
    producer.send_raw(REQUEST_RECORDS.topic, b"undeliverable")
    with caplog.at_level(logging.WARNING, logger="pipeline.bus"):
        producer.close(timeout_s=1.0)  # returns: no exception for the caller to handle
    assert "undelivered" in caplog.text
    left = [t.name for t in set(threading.enumerate()) - earlier if t.is_alive()]
    assert left == []
