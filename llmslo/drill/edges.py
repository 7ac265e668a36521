"""The drill's edge of the pipeline in one process: a stream tap per pod, the collector, load,
and (for the modes in front of the taps) a synthetic prober through the fleet's gateway.

``llmslo demo`` runs these as child processes; on a shared 2-core machine each child costs
seconds of start-up (imports), so the drill runs the same classes (``TapProxy``,
``Collector`` with the one bounded publisher, ``run_load``, ``Prober``) on one event-loop
thread and one load thread. Records and samples still travel the embedded broker to the
ingester. The gateway (the fleet's, ``FleetConfig.gateway``) fronts every pod and is scraped
like an engine (dialect ``epp``); the load keeps going straight through the taps, so what the
gateway does shows only in its own scrape and in the probe records.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.metrics import CollectorMetrics
from collectors.probe import ProbeConfig, Prober
from collectors.tap.config import TapConfig
from collectors.tap.proxy import TapProxy
from collectors.tap.sinks import KafkaSink
from pipeline.bus import Bus
from pipeline.errors import ConfigError
from pipeline.publisher import KafkaPublisher, PublishBuffer, PublishMetrics
from simulator.load import LoadConfig, run_load_sync
from simulator.traces import poisson_arrivals

__all__ = ["CLIENT_DEADLINE_S", "DrillEdges"]

#: The load clients give up after this long (s): longer than any healthy stream, so a
#: client's deadline never counts against a healthy fleet (a 3,000-token answer, ~23 means
#: of the drill's exponential output length, streams in ~140 s at 70 % load), while a
#: stalled pod's clients still give up. The old 30 s cut ~0.7 % of healthy streams.
CLIENT_DEADLINE_S = 180.0

T = TypeVar("T")


class DrillEdges:
    """Taps (one per upstream, in order), the collector and Poisson load (context manager).

    ``tap_options`` are extra :class:`TapConfig` fields, ``load_options`` extra
    :class:`LoadConfig` fields; ``rate_per_s`` is spread over the taps. ``probe_url``
    (``None``: no prober): an entry point (the fleet's gateway) probed every
    ``probe_interval_s``, its records published with the taps'.
    """

    def __init__(
        self,
        bus: Bus,
        upstreams: Sequence[str],
        metrics_urls: Sequence[str],
        *,
        scrape_s: float,
        rate_per_s: float,
        duration_s: float,
        tap_options: Mapping[str, Any] | None = None,
        load_options: Mapping[str, Any] | None = None,
        probe_url: str | None = None,
        probe_interval_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.upstreams = list(upstreams)
        self.tap_urls: list[str] = []
        self._tap_options = dict(tap_options or {})
        self._load_options = dict(load_options or {})
        self._collect = CollectConfig(
            targets=[TargetConfig(url=url) for url in metrics_urls], interval_s=scrape_s
        )
        self._probe_url, self._probe_interval_s = probe_url, probe_interval_s
        self._prober: Prober | None = None
        self._prober_task: concurrent.futures.Future[None] | None = None
        self._rate, self._duration = rate_per_s, duration_s
        # Validate the options now (cold path): a bad one must fail the drill, not a thread.
        try:
            LoadConfig.model_validate({"targets": ["http://127.0.0.1:1"], **self._load_options})
            TapConfig.model_validate({"upstreams": self.upstreams, **self._tap_options})
        except ValueError as exc:
            raise ConfigError(f"drill mode options: {exc}") from exc
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="drill-edges", daemon=True
        )
        self._taps: list[TapProxy] = []
        self._sink: KafkaSink | None = None
        self._collector: Collector | None = None
        self._collector_task: concurrent.futures.Future[None] | None = None
        self._publisher: KafkaPublisher | None = None
        self._stop_load = threading.Event()
        # Set at exit: the run is scored by then, so the streams still open are cut rather
        # than waited for (a pod whose GPU fell off the bus holds them to the deadline).
        self._abort_load = threading.Event()
        self._extra: list[threading.Event] = []
        self._load: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The taps' and the collector's event loop."""
        return self._loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def __enter__(self) -> DrillEdges:
        self._thread.start()
        self._sink = KafkaSink(self.bus.producer, flush_interval_s=0.5)
        for upstream in self.upstreams:
            config = TapConfig.model_validate(
                {"listen": "127.0.0.1:0", "upstreams": [upstream], **self._tap_options}
            )
            proxy = TapProxy(config, self._sink)
            port = self._call(proxy.start())
            self._taps.append(proxy)
            self.tap_urls.append(f"http://127.0.0.1:{port}")
        buffer = PublishBuffer(100_000, PublishMetrics("collect"))
        self._publisher = KafkaPublisher(self.bus.producer, buffer, publish_timeout_s=10).start()
        if self._probe_url is not None:
            probe = ProbeConfig(url=self._probe_url, interval_s=self._probe_interval_s, timeout_s=5)
            self._prober = Prober(probe, buffer.put)
            self._prober_task = asyncio.run_coroutine_threadsafe(self._prober.run(), self._loop)
        self._collector = Collector(self._collect, buffer.put, metrics=CollectorMetrics())
        self._collector_task = asyncio.run_coroutine_threadsafe(self._collector.run(), self._loop)
        self._load = threading.Thread(target=self._run_load, name="drill-load", daemon=True)
        self._load.start()
        return self

    def extra_load(
        self,
        tap_index: int,
        rate_per_s: float,
        duration_s: float,
        options: Mapping[str, Any] | None = None,
    ) -> threading.Event:
        """Extra Poisson load at ``rate_per_s`` through tap ``tap_index`` only, for
        ``duration_s`` or until the returned event is set (a hot instance, injected);
        ``options``: more :class:`LoadConfig` fields (clients that cancel, for ghosts)."""
        stop = threading.Event()
        config = LoadConfig(
            targets=[self.tap_urls[tap_index]],
            deadline_s=CLIENT_DEADLINE_S,
            seed=tap_index + 1,
            **dict(options or {}),
        )
        requests = list(poisson_arrivals(rate_per_s, duration_s))
        threading.Thread(
            target=run_load_sync,
            args=(config, requests),
            kwargs={"stop": stop, "abort": self._abort_load, "keep_results": False},
            name="drill-extra-load",
            daemon=True,
        ).start()
        self._extra.append(stop)
        return stop

    def _run_load(self) -> None:
        config = LoadConfig(
            targets=self.tap_urls, deadline_s=CLIENT_DEADLINE_S, **self._load_options
        )
        run_load_sync(
            config,
            list(poisson_arrivals(self._rate, self._duration)),
            stop=self._stop_load,
            abort=self._abort_load,
            keep_results=False,
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._abort_load.set()
        for stop in self._extra:
            stop.set()
        if self._load is not None:
            self._load.join(timeout=40)
        if self._prober is not None:
            self._loop.call_soon_threadsafe(self._prober.stop)
        if self._prober_task is not None:
            with contextlib.suppress(Exception):  # shutting down, as for the collector
                self._prober_task.result(30)
        if self._collector is not None:
            self._loop.call_soon_threadsafe(self._collector.stop)
        if self._collector_task is not None:
            # Shutting down: a collector round that fails now loses nothing the store needs.
            with contextlib.suppress(Exception):
                self._collector_task.result(30)
        for proxy in self._taps:
            self._call(proxy.stop())
        if self._sink is not None:
            self._sink.close()
        if self._publisher is not None:
            self._publisher.stop(drain_timeout_s=10)
            self._publisher.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
