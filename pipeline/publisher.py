"""The one way llmslo publishes to Kafka: a bounded buffer drained by a retrying thread.

Producers of rows (the collector's scrape loop, the tap's sink thread, the SLO jobs' flag
transitions, the history generator) :meth:`Publisher.put` one Arrow table and go on: ``put``
never waits for Kafka and never raises. A background thread takes the oldest batch — with
the Arrow batches of the same schema queued right behind it, up to
:data:`MAX_DELIVERY_ROWS` rows — sends it one message per instance key and waits for every
acknowledgement (each batch is split by key on its own and a key's parts joined, so a batch
of one key, as a scrape's, is never copied to be split); parts that fail are re-sent with a
fresh producer after an exponential back-off (``backoff_s`` doubling up to
``backoff_max_s``) until they are acknowledged, so a broker outage only delays data. A key's rows keep their order: they
travel in one message per delivery, and deliveries follow one another. A publisher made
with ``gather_s`` lets a delivery wait that long for more rows to travel with it (up to its
``max_delivery_rows``): fewer, larger messages cost less CPU per row in the publisher and in
kafka-python's I/O thread, for a publish that much later (the receiver's choice).

When the buffer would exceed ``max_rows``, the *oldest* batches are dropped (the newest
state of the fleet is worth more than the oldest); rows still unpublished when the
publisher is stopped are dropped too. Every drop is logged and counted under the one
metric ``llmslo_dropped_total{component, reason}`` (reasons ``buffer_full``, ``shutdown``),
next to ``llmslo_published_rows_total{component, topic}``,
``llmslo_publish_errors_total{component}`` and ``llmslo_publish_buffered_rows{component}``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Counter, Gauge

from pipeline._lazy import on_first_use
from pipeline.bus import BusProducer, split_by_key
from pipeline.codec import (
    JSON_CONTENT_TYPE,
    encode_arrow,
    encode_json_object,
    headers_for,
    join_json_objects,
    join_tables,
)
from pipeline.errors import BusError
from pipeline.schema import RecordSchema

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = on_first_use("pyarrow")

__all__ = [
    "MAX_DELIVERY_ROWS",
    "JsonRows",
    "KafkaPublisher",
    "PendingBatch",
    "PublishBuffer",
    "PublishMetrics",
    "Publisher",
]

log = logging.getLogger(__name__)

#: Called with (reason, rows) on every drop, besides the counter (a component's own metric).
DropHook = Callable[[str, int], None]
#: Rows sent in one delivery at most, by default (batches queued behind one another, merged): one
#: round trip to the brokers for many batches, and a key's message stays far below the
#: largest message (``pipeline.bus.MAX_MESSAGE_BYTES``).
MAX_DELIVERY_ROWS = 20_000


@dataclass(frozen=True)
class _Families:
    dropped: Counter
    published: Counter
    errors: Counter
    buffered: Gauge


#: One set of metric families per registry: several components may share a registry.
_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_FAMILIES_LOCK = threading.Lock()


def _families(registry: CollectorRegistry) -> _Families:
    with _FAMILIES_LOCK:
        families = _FAMILIES.get(registry)
        if families is None:
            families = _Families(
                Counter(
                    "llmslo_dropped",
                    "Rows dropped, by component and reason (buffer_full, shutdown)",
                    ["component", "reason"],
                    registry=registry,
                ),
                Counter(
                    "llmslo_published_rows",
                    "Rows acknowledged by Kafka, by component and topic",
                    ["component", "topic"],
                    registry=registry,
                ),
                Counter(
                    "llmslo_publish_errors",
                    "Failed publish attempts (retried after a back-off), by component",
                    ["component"],
                    registry=registry,
                ),
                Gauge(
                    "llmslo_publish_buffered_rows",
                    "Rows waiting for Kafka, by component",
                    ["component"],
                    registry=registry,
                ),
            )
            _FAMILIES[registry] = families
        return families


class PublishMetrics:
    """The publisher's metrics for one ``component`` (collect, tap, slo-jobs, sim-history)."""

    def __init__(self, component: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.component = component
        families = _families(self.registry)
        self._dropped = families.dropped
        self._published = families.published
        self._errors = families.errors
        self._buffered = families.buffered

    def dropped(self, reason: str, rows: int) -> None:
        self._dropped.labels(self.component, reason).inc(rows)

    def published(self, topic: str, rows: int) -> None:
        self._published.labels(self.component, topic).inc(rows)

    def publish_error(self) -> None:
        self._errors.labels(self.component).inc()

    def buffered(self, rows: int) -> None:
        self._buffered.labels(self.component).set(rows)


class JsonRows:
    """Rows as plain dicts, published in the wire format's JSON form (``application/json``).

    Every consumer decodes it exactly as it decodes Arrow (``pipeline.codec``: same schema
    header, same conforming, same value rules), so a producer that must stay small (the tap
    sidecar) publishes without loading pyarrow. Each row is encoded once, here, so rows that
    cannot be JSON (``NaN``, an unknown type) raise ``ValueError``/``TypeError`` to the
    producer, not in the publisher's thread, and splitting by key re-encodes nothing.
    """

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self._objects = [encode_json_object(row) for row in rows]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def payload(self) -> bytes:
        return join_json_objects(self._objects)

    def by_key(self, key_field: str) -> list[tuple[bytes, JsonRows]]:
        """One part per value of ``key_field``, rows in order (like :func:`split_by_key`)."""
        groups: dict[str, JsonRows] = {}
        for row, encoded in zip(self.rows, self._objects, strict=True):
            part = groups.get(key := str(row.get(key_field)))
            if part is None:
                part = groups[key] = JsonRows([])
            part.rows.append(row)
            part._objects.append(encoded)
        if len(groups) == 1:
            return [(next(iter(groups)).encode(), self)]
        return [(key.encode(), part) for key, part in groups.items()]


#: What the publisher carries: an Arrow table, or JSON rows from a producer without Arrow.
Batch: TypeAlias = "pa.Table | JsonRows"


def _split(schema: RecordSchema, batch: Batch) -> list[tuple[bytes, Batch]]:
    if isinstance(batch, JsonRows):
        return list(batch.by_key(schema.key_field))
    return list(split_by_key(schema, batch))


def _by_key(schema: RecordSchema, batches: list[PendingBatch]) -> list[tuple[bytes, Batch]]:
    """The rows of ``batches`` (queued one after the other) as one part per key, each key's
    rows in the order they were put. Each batch is split on its own (a batch of one key, as
    a scrape's or a pushed target's, is not split at all) and only a key's own parts are
    joined: the rows are copied at most once, never gathered from a merge of every key."""
    parts: dict[bytes, list[Batch]] = {}
    for batch in batches:
        for key, rows in _split(schema, batch.table):
            parts.setdefault(key, []).append(rows)
    return [(key, _joined(rows)) for key, rows in parts.items()]


def _joined(parts: list[Batch]) -> Batch:
    """A key's parts as one: Arrow tables of one Arrow schema joined into one chunk per
    column (JSON rows never travel with others: :meth:`PublishBuffer.take_following`)."""
    if len(parts) == 1:
        return parts[0]
    tables = cast("list[pa.Table]", parts)
    return join_tables(tables)


def _encode(schema: RecordSchema, rows: Batch) -> tuple[bytes, list[tuple[str, bytes]]]:
    if isinstance(rows, JsonRows):
        return rows.payload, headers_for(schema, JSON_CONTENT_TYPE)
    return encode_arrow(schema, rows), headers_for(schema)


@dataclass
class PendingBatch:
    """One table (or JSON rows) waiting for Kafka."""

    schema: RecordSchema
    table: Batch
    enqueued_s: float = field(default_factory=time.monotonic)


class PublishBuffer:
    """A FIFO of batches bounded by their total rows (thread-safe; ``put`` never blocks)."""

    def __init__(
        self,
        max_rows: int,
        metrics: PublishMetrics | None = None,
        *,
        on_drop: DropHook | None = None,
    ) -> None:
        self.max_rows = max_rows
        self.metrics = metrics or PublishMetrics("unnamed")
        self.on_drop = on_drop
        self.dropped_rows = 0
        self._queue: deque[PendingBatch] = deque()
        self._rows = 0
        self._cond = threading.Condition()
        self._awaited = 1  # rows the waiting publisher needs queued to go on (put wakes it then)

    @property
    def rows(self) -> int:
        return self._rows

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, schema: RecordSchema, table: Batch) -> int:
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
            if self._rows >= self._awaited:
                self._cond.notify_all()
        if dropped:
            log.warning(
                "%s publish buffer full (%d rows): dropped the oldest %d rows",
                self.metrics.component,
                self.max_rows,
                dropped,
            )
            self.count_drop("buffer_full", dropped)
        self.metrics.buffered(self._rows)
        return dropped

    def count_drop(self, reason: str, rows: int) -> None:
        """Count ``rows`` dropped for ``reason`` (the metric, the hook and ``dropped_rows``)."""
        self.dropped_rows += rows
        self.metrics.dropped(reason, rows)
        if self.on_drop is not None:
            self.on_drop(reason, rows)

    def take(self, timeout_s: float) -> PendingBatch | None:
        """The oldest batch, removed from the buffer; ``None`` after ``timeout_s`` without one."""
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout_s)
            if not self._queue:
                return None
            batch = self._queue.popleft()
            self._rows -= batch.table.num_rows
        self.metrics.buffered(self._rows)
        return batch

    def wait_for_rows(self, rows: int, timeout_s: float) -> None:
        """Wait until ``rows`` rows are queued, or ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._awaited = rows  # the puts before that many rows do not wake the publisher
            try:
                while self._rows < rows:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._cond.wait(left)
            finally:
                self._awaited = 1

    def take_following(self, first: PendingBatch, max_rows: int) -> list[PendingBatch]:
        """The Arrow batches queued first that ``first`` (just taken) can travel with: of its
        schema and Arrow schema, ``max_rows`` rows in all at most; removed from the buffer."""
        if isinstance(first.table, JsonRows):
            return []
        taken: list[PendingBatch] = []
        with self._cond:
            rows = 0
            while self._queue:
                head = self._queue[0]
                if (
                    head.schema is not first.schema
                    or isinstance(head.table, JsonRows)
                    or rows + head.table.num_rows > max_rows
                    or not head.table.schema.equals(first.table.schema)
                ):
                    break
                taken.append(self._queue.popleft())
                rows += head.table.num_rows
            self._rows -= rows
        if taken:
            self.metrics.buffered(self._rows)
        return taken

    def drain(self) -> int:
        """Remove every batch; returns their rows (not counted: the caller says why)."""
        with self._cond:
            rows, self._rows = self._rows, 0
            self._queue.clear()
        self.metrics.buffered(0)
        return rows


class KafkaPublisher:
    """Drains a :class:`PublishBuffer` into Kafka on a background thread, retrying with back-off.

    A delivery holds up to ``max_delivery_rows`` rows; with ``gather_s`` it waits up to that
    long for them to be queued before it is sent (see the module docstring)."""

    def __init__(
        self,
        producer_factory: Callable[[], BusProducer],
        buffer: PublishBuffer,
        *,
        publish_timeout_s: float = 10.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        max_delivery_rows: int = MAX_DELIVERY_ROWS,
        gather_s: float = 0.0,
    ) -> None:
        self.producer_factory = producer_factory
        self.producer: BusProducer | None = None
        self.buffer = buffer
        self.metrics = buffer.metrics
        self.publish_timeout_s = publish_timeout_s
        self.max_delivery_rows = max_delivery_rows
        self.gather_s = gather_s
        self.backoff_s = backoff_s
        self.backoff_max_s = max(backoff_max_s, backoff_s)
        self.published_rows = 0
        self.in_flight_rows = 0
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"llmslo-{self.metrics.component}-publish", daemon=True
        )

    def start(self) -> KafkaPublisher:
        self._thread.start()
        return self

    def idle(self) -> bool:
        """Nothing buffered and nothing in flight: everything put so far is acked or dropped."""
        return len(self.buffer) == 0 and self.in_flight_rows == 0

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until :meth:`idle`; returns whether it got there."""
        deadline = time.monotonic() + timeout_s
        while not self.idle():
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.01)
        return True

    def stop(self, drain_timeout_s: float = 10.0) -> None:
        """Publish what is buffered (up to ``drain_timeout_s``), then stop the thread; what is
        left is dropped with reason ``shutdown``."""
        self._stop.set()
        self._thread.join(drain_timeout_s)
        if self._thread.is_alive():
            self._abandon.set()
            self._thread.join(self.publish_timeout_s + 5)
            left = self.buffer.drain() + self.in_flight_rows
            self.in_flight_rows = 0
            if left:
                log.warning("%s: stopped with %d rows unpublished", self.metrics.component, left)
                self.buffer.count_drop("shutdown", left)

    def _run(self) -> None:
        while not self._abandon.is_set():
            batch = self.buffer.take(0.2)
            if batch is None:
                if self._stop.is_set():
                    return
                continue
            self.in_flight_rows = batch.table.num_rows
            room = self.max_delivery_rows - batch.table.num_rows
            if room > 0 and self.gather_s > 0 and not self._stop.is_set():
                self.buffer.wait_for_rows(room, self.gather_s)
            following = self.buffer.take_following(batch, room) if room > 0 else []
            self.in_flight_rows += sum(b.table.num_rows for b in following)
            self._deliver(batch.schema, _by_key(batch.schema, [batch, *following]))
            if not self._abandon.is_set():
                self.in_flight_rows = 0

    def _deliver(self, schema: RecordSchema, pieces: list[tuple[bytes, Batch]]) -> None:
        backoff_s = self.backoff_s
        while pieces and not self._abandon.is_set():
            pieces = self._send(schema, pieces)
            if pieces:
                # A producer that failed may be wedged for good (e.g. its idempotent producer
                # id is unknown to a restarted broker): start over with a fresh one.
                self.metrics.publish_error()
                self._close_producer()
                self._abandon.wait(backoff_s)
                backoff_s = min(backoff_s * 2, self.backoff_max_s)

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
        self, schema: RecordSchema, pieces: list[tuple[bytes, Batch]]
    ) -> list[tuple[bytes, Batch]]:
        """Send every piece and wait for the acks; returns the pieces that failed."""
        sent: list[tuple[tuple[bytes, Batch], Any]] = []
        failed: list[tuple[bytes, Batch]] = []
        if self.producer is None:
            try:
                self.producer = self.producer_factory()
            except (KafkaError, BusError) as exc:
                log.debug("cannot create a producer: %s", exc)
                return pieces
        for piece in pieces:
            key, rows = piece
            try:
                payload, headers = _encode(schema, rows)
                future = self.producer.send_raw(schema.topic, payload, key=key, headers=headers)
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
            self.metrics.published(schema.topic, piece[1].num_rows)
        if failed:
            log.warning(
                "%s: %d of %d messages to %s not acknowledged; retrying",
                self.metrics.component,
                len(failed),
                len(pieces),
                schema.topic,
            )
        return failed


class Publisher:
    """A :class:`PublishBuffer` and its :class:`KafkaPublisher`, started: what components hold.

    ``put(schema, table)`` never blocks or raises; ``flush(timeout_s)`` waits for the acks
    of everything put so far; ``close()`` drains (up to ``drain_timeout_s``) and stops.
    """

    def __init__(
        self,
        producer_factory: Callable[[], BusProducer],
        *,
        component: str,
        max_rows: int = 1_000_000,
        registry: CollectorRegistry | None = None,
        on_drop: DropHook | None = None,
        publish_timeout_s: float = 10.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        drain_timeout_s: float = 30.0,
    ) -> None:
        self.metrics = PublishMetrics(component, registry)
        self.buffer = PublishBuffer(max_rows, self.metrics, on_drop=on_drop)
        self.drain_timeout_s = drain_timeout_s
        self.kafka = KafkaPublisher(
            producer_factory,
            self.buffer,
            publish_timeout_s=publish_timeout_s,
            backoff_s=backoff_s,
            backoff_max_s=backoff_max_s,
        ).start()

    def put(self, schema: RecordSchema, table: Batch) -> int:
        """Queue ``table`` for Kafka; returns rows dropped to stay within ``max_rows``."""
        return self.buffer.put(schema, table)

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything put so far to be acknowledged (or dropped)."""
        return self.kafka.flush(timeout_s)

    @property
    def published_rows(self) -> int:
        return self.kafka.published_rows

    @property
    def unpublished_rows(self) -> int:
        return self.buffer.rows + self.kafka.in_flight_rows

    def close(self) -> None:
        """Publish what is buffered (up to ``drain_timeout_s``), stop, close the producer."""
        self.kafka.stop(self.drain_timeout_s)
        self.kafka.close()
