"""Publish scrape rounds to Kafka through a bounded buffer that rides out broker outages.

The scrape loop never waits for Kafka: it :meth:`PublishBuffer.put` s one Arrow table per
topic per round and goes on. :class:`KafkaPublisher` (a thread) takes the oldest batch,
sends it one message per instance key and waits for every acknowledgement; parts that
fail are re-sent after a back-off until they are acknowledged, so an outage only delays
data. When the buffer would exceed ``max_rows``, the *oldest* batches are dropped and
counted (``llmslo_collect_dropped_total{reason="buffer_full"}``): the newest state of the
fleet is worth more than the oldest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from kafka.errors import KafkaError

from collectors.metrics import CollectorMetrics
from pipeline.bus import BusProducer, split_by_key
from pipeline.codec import encode_arrow, headers_for
from pipeline.errors import BusError
from pipeline.schema import RecordSchema

__all__ = ["KafkaPublisher", "PendingBatch", "PublishBuffer"]

log = logging.getLogger(__name__)


@dataclass
class PendingBatch:
    """One table waiting for Kafka."""

    schema: RecordSchema
    table: pa.Table
    enqueued_s: float = field(default_factory=time.monotonic)


class PublishBuffer:
    """A FIFO of batches bounded by their total rows (thread-safe)."""

    def __init__(self, max_rows: int, metrics: CollectorMetrics | None = None) -> None:
        self.max_rows = max_rows
        self.metrics = metrics
        self.dropped_rows = 0
        self._queue: deque[PendingBatch] = deque()
        self._rows = 0
        self._cond = threading.Condition()

    @property
    def rows(self) -> int:
        return self._rows

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, schema: RecordSchema, table: pa.Table) -> int:
        """Queue ``table``; returns rows dropped (oldest first) to stay within the bound."""
        if table.num_rows == 0:
            return 0
        dropped = 0
        with self._cond:
            self._queue.append(PendingBatch(schema, table))
            self._rows += table.num_rows
            while self._rows > self.max_rows and self._queue:
                old = self._queue.popleft()
                self._rows -= old.table.num_rows
                dropped += old.table.num_rows
            self._cond.notify()
        if dropped:
            self.dropped_rows += dropped
            log.warning(
                "publish buffer full (%d rows): dropped the oldest %d rows", self.max_rows, dropped
            )
            if self.metrics is not None:
                self.metrics.dropped.labels("buffer_full").inc(dropped)
        self._gauge()
        return dropped

    def take(self, timeout_s: float) -> PendingBatch | None:
        """The oldest batch, removed from the buffer; ``None`` after ``timeout_s`` without one."""
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout_s)
            if not self._queue:
                return None
            batch = self._queue.popleft()
            self._rows -= batch.table.num_rows
        self._gauge()
        return batch

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.buffered_rows.set(self._rows)


class KafkaPublisher:
    """Drains a :class:`PublishBuffer` into Kafka on a background thread."""

    def __init__(
        self,
        producer_factory: Callable[[], BusProducer],
        buffer: PublishBuffer,
        *,
        metrics: CollectorMetrics | None = None,
        publish_timeout_s: float = 10.0,
        backoff_s: float = 0.5,
    ) -> None:
        self.producer_factory = producer_factory
        self.producer: BusProducer | None = None
        self.buffer = buffer
        self.metrics = metrics or buffer.metrics or CollectorMetrics()
        self.publish_timeout_s = publish_timeout_s
        self.backoff_s = backoff_s
        self.published_rows = 0
        self.in_flight_rows = 0
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="llmslo-collect-publish", daemon=True
        )

    def start(self) -> KafkaPublisher:
        self._thread.start()
        return self

    def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Publish what is buffered (up to ``drain_timeout_s``), then stop the thread."""
        self._stop.set()
        self._thread.join(drain_timeout_s)
        if self._thread.is_alive():
            self._abandon.set()
            self._thread.join(self.publish_timeout_s + 5)
            log.warning(
                "stopped with %d rows still unpublished", self.buffer.rows + self.in_flight_rows
            )

    def _run(self) -> None:
        while not self._abandon.is_set():
            batch = self.buffer.take(0.2)
            if batch is None:
                if self._stop.is_set():
                    return
                continue
            self.in_flight_rows = batch.table.num_rows
            self._deliver(batch)
            self.in_flight_rows = 0

    def _deliver(self, batch: PendingBatch) -> None:
        pieces = list(split_by_key(batch.schema, batch.table))
        while pieces and not self._abandon.is_set():
            pieces = self._send(batch.schema, pieces)
            if pieces:
                # A producer that failed may be wedged for good (e.g. its idempotent producer
                # id is unknown to a restarted broker): start over with a fresh one.
                self.metrics.publish_errors.inc()
                self._close_producer()
                self._abandon.wait(self.backoff_s)

    def close(self) -> None:
        """Close the current producer (after :meth:`stop`)."""
        self._close_producer()

    def _close_producer(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(timeout_s=0)
            except KafkaError as exc:  # closing a broken producer may complain; it is gone anyway
                log.debug("closing producer: %s", exc)
            self.producer = None

    def _send(
        self, schema: RecordSchema, pieces: list[tuple[bytes, pa.Table]]
    ) -> list[tuple[bytes, pa.Table]]:
        """Send every piece and wait for the acks; returns the pieces that failed."""
        sent: list[tuple[tuple[bytes, pa.Table], Any]] = []
        failed: list[tuple[bytes, pa.Table]] = []
        if self.producer is None:
            try:
                self.producer = self.producer_factory()
            except (KafkaError, BusError) as exc:
                log.debug("cannot create a producer: %s", exc)
                return pieces
        for piece in pieces:
            key, rows = piece
            try:
                future = self.producer.send_raw(
                    schema.topic, encode_arrow(schema, rows), key=key, headers=headers_for(schema)
                )
                sent.append((piece, future))
            except KafkaError as exc:
                log.debug("send to %s failed: %s", schema.topic, exc)
                failed.append(piece)
        for piece, future in sent:
            try:
                future.get(timeout=self.publish_timeout_s + 5)
            except (KafkaError, TimeoutError) as exc:
                log.debug("delivery to %s failed: %s", schema.topic, exc)
                failed.append(piece)
                continue
            self.published_rows += piece[1].num_rows
            self.metrics.published_rows.labels(schema.topic).inc(piece[1].num_rows)
        if failed:
            log.warning(
                "%d of %d messages to %s not acknowledged; retrying",
                len(failed),
                len(pieces),
                schema.topic,
            )
        return failed
