"""Where the tap's rows go: the Kafka bus, a JSON-lines file or stdout, or memory.

A sink receives request records (rows of ``REQUEST_RECORDS``) and engine samples (rows
of ``ENGINE_SAMPLES``: the tap's in-flight and disconnect gauges) as plain dicts. Adding
a row never blocks the event loop and never raises: a full buffer drops the row and counts
it (``on_drop(reason)``).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from pipeline.bus import BusProducer
from pipeline.errors import BusError
from pipeline.publisher import JsonRows, Publisher
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS, RecordSchema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["JsonLinesSink", "KafkaSink", "ListSink", "MultiSink", "RecordSink", "rows_to_table"]

log = logging.getLogger(__name__)

Row = dict[str, Any]


class RecordSink(Protocol):
    """Destination of tap rows; implementations must not block or raise."""

    def add_request(self, row: Row) -> None: ...

    def add_samples(self, rows: list[Row]) -> None: ...

    def close(self) -> None: ...


def rows_to_table(schema: RecordSchema, rows: list[Row]) -> pa.Table:
    """Rows (plain Python values) as a table of ``schema``'s storage types (for readers and
    tests: the tap itself publishes JSON rows and never loads pyarrow)."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=schema.storage_arrow)


class ListSink:
    """Keeps everything in memory: the sink tests and embedders read from."""

    def __init__(self) -> None:
        self.requests: list[Row] = []
        self.samples: list[Row] = []

    def add_request(self, row: Row) -> None:
        self.requests.append(row)

    def add_samples(self, rows: list[Row]) -> None:
        self.samples.extend(rows)

    def close(self) -> None:
        pass


class JsonLinesSink:
    """One JSON object per line (request records only) to a file, or ``-`` for stdout."""

    def __init__(self, target: str) -> None:
        self._own = target != "-"
        self._out: IO[str] = (
            Path(target).open("a", encoding="utf-8", buffering=1)  # noqa: SIM115 (lives as long as the sink)
            if self._own
            else sys.stdout
        )

    def add_request(self, row: Row) -> None:
        self._out.write(json.dumps(row, sort_keys=True, allow_nan=False, default=str) + "\n")
        if not self._own:
            self._out.flush()

    def add_samples(self, rows: list[Row]) -> None:
        pass

    def close(self) -> None:
        if self._own:
            self._out.close()


class MultiSink:
    """Fans rows out to several sinks."""

    def __init__(self, sinks: list[RecordSink]) -> None:
        self.sinks = sinks

    def add_request(self, row: Row) -> None:
        for sink in self.sinks:
            sink.add_request(row)

    def add_samples(self, rows: list[Row]) -> None:
        for sink in self.sinks:
            sink.add_samples(rows)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def _first_use_only(producer: BusProducer) -> Callable[[], BusProducer]:
    """A producer factory over one given producer: after it failed (and was closed) there is
    no other, so later calls raise and the publisher keeps the rows until it stops."""
    given = [producer]

    def factory() -> BusProducer:
        if not given:
            raise BusError("the tap's given Kafka producer failed; pass a factory to reconnect")
        return given.pop()

    return factory


class KafkaSink:
    """Batches rows and hands them to the one bounded, retrying publisher (``pipeline.publisher``).

    The event loop only appends to a deque (no encoding, no Kafka): a background thread
    encodes rows as one JSON message (:class:`~pipeline.publisher.JsonRows`, the wire
    format's JSON form, so the sidecar never loads pyarrow) every ``flush_interval_s`` (or
    once ``batch_max_rows`` wait) and puts them on the :class:`~pipeline.publisher.Publisher`, which re-sends through broker
    outages with back-off. At most ``max_pending`` rows wait here, beyond which new rows are
    dropped with reason ``sink_full``; the publisher holds at most ``max_pending`` more and
    drops its oldest with ``buffer_full`` (``shutdown`` for what is left unpublished at
    close). Every drop is reported to ``on_drop(reason, rows)``, never raised.
    """

    def __init__(
        self,
        producer: BusProducer | Callable[[], BusProducer],
        *,
        batch_max_rows: int = 2000,
        flush_interval_s: float = 0.5,
        max_pending: int = 100_000,
        on_drop: Callable[[str, int], None] = lambda reason, rows: None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        factory = producer if callable(producer) else _first_use_only(producer)
        self._batch = batch_max_rows
        self._interval_s = flush_interval_s
        self._max_pending = max_pending
        self._on_drop = on_drop
        self._queues: dict[str, deque[Row]] = {"requests": deque(), "samples": deque()}
        self._wake = threading.Event()
        self._stop = threading.Event()
        # The tap's own registry already has llmslo_dropped_total{reason}: drops reach it
        # through on_drop; the publisher's families live in ``registry`` (default: its own).
        self.publisher = Publisher(
            factory, component="tap", max_rows=max_pending, registry=registry, on_drop=on_drop
        )
        self._thread = threading.Thread(target=self._run, name="tap-kafka-sink", daemon=True)
        self._thread.start()

    @property
    def published_rows(self) -> int:
        """Rows acknowledged by Kafka."""
        return self.publisher.published_rows

    def _add(self, queue: str, rows: list[Row]) -> None:
        pending = sum(len(q) for q in self._queues.values())
        room = max(self._max_pending - pending, 0)
        if room < len(rows):
            self._on_drop("sink_full", len(rows) - room)
            rows = rows[:room]
        self._queues[queue].extend(rows)  # deque.extend is atomic under the GIL
        if len(self._queues[queue]) >= self._batch:
            self._wake.set()

    def add_request(self, row: Row) -> None:
        self._add("requests", [row])

    def add_samples(self, rows: list[Row]) -> None:
        self._add("samples", rows)

    def _take(self, queue: deque[Row]) -> list[Row]:
        rows: list[Row] = []
        while queue and len(rows) < self._batch:
            rows.append(queue.popleft())
        return rows

    def _flush_once(self) -> None:
        for name, schema in (("requests", REQUEST_RECORDS), ("samples", ENGINE_SAMPLES)):
            queue = self._queues[name]
            while queue:
                rows = self._take(queue)
                try:
                    batch = JsonRows(rows)
                except (TypeError, ValueError) as exc:  # never raise: count
                    log.warning("dropping %d %s rows: not convertible: %s", len(rows), name, exc)
                    self._on_drop("unconvertible", len(rows))
                    continue
                self.publisher.put(schema, batch)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._flush_once()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Hand over what is pending and wait for Kafka's acks; returns whether all arrived."""
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while any(self._queues.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.publisher.flush(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Publish what is pending (waiting for the broker's acks, up to 30 s), then stop."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self._flush_once()
        self.publisher.close()
