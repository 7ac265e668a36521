"""The receiver as a running service: HTTP door, receiver, publish buffer and Kafka publisher.

Both ``llmslo receive`` and ``llmslo run`` (section ``receive`` with ``enabled: true``) run
one :class:`ReceiveService`: :meth:`ReceiveService.run` serves until its stop event is set,
then drains the buffer to Kafka (up to ``publish_timeout_s``) and closes the producer.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from collectors.receive.config import ReceiveConfig
from collectors.receive.receiver import Receiver
from collectors.receive.server import ReceiveMetrics, receive_app
from pipeline.bus import BusProducer
from pipeline.publisher import KafkaPublisher, PublishBuffer, PublishMetrics

__all__ = ["DELIVERY_ROWS", "YOUNG_GC_THRESHOLD", "ReceiveService", "raise_young_gc_threshold"]

log = logging.getLogger(__name__)

#: Rows one delivery to Kafka holds at most (the publisher's default is 20,000): with
#: ``publish_gather_s`` a delivery spans several writes, and a target's rows of those writes
#: travel as one message (at 100,000 rows, a few MB of Arrow at most).
DELIVERY_ROWS = 100_000
#: Allocations between two young-generation collections while receiving (CPython's is 700).
YOUNG_GC_THRESHOLD = 100_000


def raise_young_gc_threshold() -> None:
    """Collect the young generation every :data:`YOUNG_GC_THRESHOLD` allocations, not 700.

    A write of 10,000 samples makes a few objects per sample that live until the write is
    stored; at CPython's threshold each is traversed by several young collections, and the
    collections that follow rescan the receiver's long-lived caches (label sets, series,
    deduplication keys): about a third of the receiver's time at 2,000 samples per request.
    With the larger threshold most of a write's objects are freed before any collection sees
    them. Process-wide, so ``llmslo receive`` and the benchmark call it, the library never
    does; only ever raised.
    """
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), middle, old)


class ReceiveService:
    """Serves ``config`` and publishes through ``producer_factory``'s producers."""

    def __init__(
        self,
        config: ReceiveConfig,
        producer_factory: Callable[[], BusProducer],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.metrics = ReceiveMetrics(registry)
        self.buffer = PublishBuffer(
            config.buffer_max_rows, PublishMetrics("receive", self.metrics.registry)
        )
        self.receiver = Receiver(
            self.buffer.put, max_tracked_series=config.limits.max_tracked_series
        )
        self._producer_factory = producer_factory
        self.port: int | None = None  # the bound port, once serving
        self.ready = threading.Event()
        self.published_rows = 0

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (blocking; call from a thread or the main thread)."""
        publisher = KafkaPublisher(
            self._producer_factory,
            self.buffer,
            publish_timeout_s=self.config.publish_timeout_s,
            max_delivery_rows=DELIVERY_ROWS,
            gather_s=self.config.publish_gather_s,
        ).start()
        try:
            asyncio.run(self._serve(stop))
        finally:
            publisher.stop(drain_timeout_s=self.config.publish_timeout_s)
            publisher.close()
            self.published_rows = publisher.published_rows

    async def _serve(self, stop: threading.Event) -> None:
        app = receive_app(self.config, self.receiver, self.buffer, self.metrics)
        # bodies are inflated by the doors themselves, within max_decompressed_bytes: aiohttp's
        # own gzip would hand them an unbounded stream (a gzip bomb) as if it were the body
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.config.port
        log.info(
            "receiving remote-write on http://%s:%d/api/v1/write and OTLP on /v1/metrics",
            self.config.host,
            self.port,
        )
        self.ready.set()
        try:
            while not stop.is_set():
                await asyncio.sleep(0.1)
        finally:
            await runner.cleanup()
