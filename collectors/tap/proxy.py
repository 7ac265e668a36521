"""The tap itself: an aiohttp reverse proxy that measures the OpenAI streaming path.

``/v1/chat/completions`` and ``/v1/completions`` (configurable) are measured: each attempt
becomes one ``REQUEST_RECORDS`` row handed to the sink. Every other path is passed through
untouched. Handlers are cancelled when the client disconnects, which is how the tap closes
the upstream at once (or drains it, bounded, in drain mode).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import time
import uuid
from collections.abc import Coroutine
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from collectors.tap.config import TapConfig
from collectors.tap.contract import RetryBudget, UpstreamPool, parse_deadline_s
from collectors.tap.downstream import HOP_BY_HOP, ClientGone, Downstream
from collectors.tap.exchange import Exchange, RequestContext
from collectors.tap.inflight import InFlightTracker
from collectors.tap.records import record_row
from collectors.tap.sinks import RecordSink
from collectors.tap.telemetry import GenAiTelemetry, TapMetrics
from pipeline.errors import ConfigError

__all__ = ["Clock", "SystemClock", "TapProxy", "freeze_startup_heap", "run_event_loop"]

log = logging.getLogger(__name__)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (about half the per-chunk loop cost on
    the forwarding path), else on the standard asyncio loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def freeze_startup_heap() -> None:
    """Exempt everything alive now (imports, config, registries) from the cyclic GC.

    Call once the tap is serving. Without it every full collection rescans ~90k startup
    objects: a 20–50 ms stop-the-world pause under load, which lands straight in the TTFT
    tail of every stream whose first token arrives meanwhile. Process-wide, so the CLI and
    the benchmark call it, the library never does.
    """
    gc.collect()
    gc.freeze()


class Clock(Protocol):
    """Time source: a monotonic clock for durations and the wall clock for timestamps."""

    def monotonic_s(self) -> float: ...

    def wall_s(self) -> float: ...


class SystemClock:
    def monotonic_s(self) -> float:
        return time.perf_counter()

    def wall_s(self) -> float:
        return time.time()


class TapProxy:
    """A running tap: ``await start()`` binds ``config.listen``; ``await stop()`` flushes."""

    def __init__(
        self,
        config: TapConfig,
        sink: RecordSink,
        *,
        metrics: TapMetrics | None = None,
        genai: GenAiTelemetry | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not config.upstreams:
            raise ConfigError("tap.upstreams: at least one upstream URL is required")
        self.config = config
        self.sink = sink
        self.metrics = metrics or TapMetrics()
        self.genai = genai
        self.clock = clock or SystemClock()
        self.pool = UpstreamPool(config.upstreams)
        self.budget = RetryBudget(config.retry_budget_ratio, config.retry_budget_min_per_s)
        self.inflight = InFlightTracker([u.instance for u in self.pool.upstreams])
        self.tap_id = config.tap_id or f"{socket.gethostname()}:{config.listen.rpartition(':')[2]}"
        self.port: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gauges: asyncio.Task[None] | None = None
        self._measured = set(config.measured_routes)
        self._bytes_upstream = self.metrics.bytes.labels("upstream")
        self._bytes_client = self.metrics.bytes.labels("client")

    # ------------------------------------------------------------------ lifecycle
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_route("*", "/{tail:.*}", self._route)
        return app

    async def start(self) -> int:
        """Bind and serve; returns the port (``listen`` may say port 0)."""
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.config.connect_timeout_s,
            sock_read=self.config.read_timeout_s,
        )
        connector = aiohttp.TCPConnector(limit=self.config.max_connections, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        host, _, port = self.config.listen.rpartition(":")
        site = web.TCPSite(self._runner, host, int(port), backlog=1024)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._gauges = asyncio.create_task(self._gauge_loop())
        return self.port

    async def stop(self) -> None:
        """Stop serving, wait for drains, publish a last gauge sample, close the sink."""
        if self._gauges is not None:
            self._gauges.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.drain_max_s + 5)
        if self._session is not None:
            await self._session.close()
        self.publish_gauges()

    def publish_gauges(self) -> None:
        """Hand the current in-flight and disconnect counts to the sink."""
        self.sink.add_samples(self.inflight.samples(int(self.clock.wall_s() * 1000), self.tap_id))

    async def _gauge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gauge_interval_s)
            self.publish_gauges()

    # ------------------------------------------------------------------ hooks (used by Exchange)
    def wall_s(self) -> float:
        return self.clock.wall_s()

    def opened(self, ex: Exchange) -> None:
        self.inflight.opened(ex.upstream.instance, self.config.pool or ex.ctx.model)
        self.metrics.in_flight.labels(ex.upstream.instance).inc()

    def closed(self, ex: Exchange) -> None:
        self.inflight.closed(ex.upstream.instance)
        self.metrics.in_flight.labels(ex.upstream.instance).dec()

    def disconnected(self, ex: Exchange) -> None:
        self.inflight.disconnected(ex.upstream.instance)
        self.metrics.disconnects.labels(ex.upstream.instance).inc()

    def dropped(self, reason: str, count: int = 1) -> None:
        self.metrics.dropped.labels(reason).inc(count)

    def bytes_in(self, count: int) -> None:
        self._bytes_upstream.inc(count)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def drained(self, ex: Exchange) -> None:
        self._emit(ex.ctx, [ex], None)

    # ------------------------------------------------------------------ handlers
    async def _route(self, request: web.Request) -> web.StreamResponse:
        if request.path in self._measured and request.method == "POST":
            return await self._measure(request)
        return await self._passthrough(request)

    async def _measure(self, request: web.Request) -> web.StreamResponse:
        t0_s, wall_s = self.clock.monotonic_s(), self.clock.wall_s()
        body = await request.read()
        ctx = self._context(request, body, t0_s, wall_s)
        down = Downstream(request, self.config.client_write_timeout_s)
        exchanges: list[Exchange] = []
        self.budget.deposit(t0_s)
        try:
            await self._attempts(ctx, down, exchanges)
        except asyncio.CancelledError:
            if exchanges and exchanges[-1].outcome != "client_cancelled":
                exchanges[-1].client_gone("client_disconnected")
            self._emit(ctx, exchanges, down)
            raise
        self._emit(ctx, exchanges, down)
        self._bytes_client.inc(down.bytes_sent)
        return down.response or web.Response(status=500)

    async def _attempts(
        self, ctx: RequestContext, down: Downstream, exchanges: list[Exchange]
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = None
        if ctx.deadline_wall_s is not None:
            deadline = loop.time() + (ctx.deadline_wall_s - self.clock.wall_s())
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    ex = self._exchange(ctx, len(exchanges) + 1, exchanges)
                    exchanges.append(ex)
                    if deadline is not None and deadline <= loop.time():
                        raise TimeoutError  # already expired on arrival
                    await ex.run(down)
                    if not self._retry(ex, down, len(exchanges)):
                        break
                await ex.deliver(down)
        except TimeoutError:
            last = exchanges[-1]
            last.deadline_passed()
            await last.deliver(down)

    def _exchange(self, ctx: RequestContext, attempt: int, previous: list[Exchange]) -> Exchange:
        upstream = self.pool.pick({ex.upstream.instance for ex in previous})
        session = self._session
        assert session is not None
        return Exchange(ctx, upstream, attempt, self.config, session, self.clock.monotonic_s, self)

    def _retry(self, ex: Exchange, down: Downstream, attempts: int) -> bool:
        if ex.outcome == "ok" or not ex.retryable or down.committed:
            return False
        if attempts >= self.config.max_attempts:
            return False
        if not self.budget.try_withdraw(self.clock.monotonic_s()):
            self.metrics.retries.labels("budget_exhausted").inc()
            return False
        self.metrics.retries.labels("attempted").inc()
        return True

    async def _passthrough(self, request: web.Request) -> web.StreamResponse:
        """Any other path: forwarded untouched, not measured."""
        assert self._session is not None
        upstream = self.pool.pick()
        headers = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
        )
        down = Downstream(request, self.config.client_write_timeout_s)
        try:
            async with self._session.request(
                request.method,
                upstream.url + request.path_qs,
                headers=headers,
                data=request.content if request.body_exists else None,
                allow_redirects=False,
            ) as resp:
                await down.commit(resp.status, resp.headers)
                async for chunk in resp.content.iter_any():
                    await down.write(chunk)
                await down.end()
        except ClientGone:
            pass
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not down.committed:
                return web.json_response(
                    {
                        "error": {
                            "message": f"upstream failed: {type(exc).__name__}",
                            "type": "upstream_error",
                        }
                    },
                    status=502,
                )
            down.abort()
        return down.response or web.Response(status=502)

    # ------------------------------------------------------------------ request context
    def _context(
        self, request: web.Request, body: bytes, t0_s: float, wall_s: float
    ) -> RequestContext:
        cfg = self.config
        parsed: dict[str, Any] | None
        try:
            loaded = json.loads(body) if body else None
            parsed = loaded if isinstance(loaded, dict) else None
        except (ValueError, UnicodeDecodeError):
            parsed = None
        streamed = bool(parsed and parsed.get("stream") is True)
        strip = False
        if parsed is not None and streamed:
            options = parsed.get("stream_options")
            if options is None or (
                isinstance(options, dict) and options.get("include_usage") is not True
            ):
                parsed["stream_options"] = {**(options or {}), "include_usage": True}
                body = json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode()
                strip = True
        model = parsed.get("model") if parsed else None
        deadline, problem = parse_deadline_s(
            request.headers,
            now_wall_s=wall_s,
            deadline_header=cfg.deadline_header,
            timeout_header=cfg.timeout_header,
            default_timeout_s=cfg.default_timeout_s,
        )
        if problem:
            self.dropped(problem)
        headers: CIMultiDict[str] = CIMultiDict(
            (k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP
        )
        headers["Accept-Encoding"] = "identity"
        tenant = request.headers.get(cfg.tenant_header)
        rid = request.headers.get(cfg.request_id_header) or uuid.uuid4().hex
        return RequestContext(
            route=request.path,
            method=request.method,
            path_qs=request.path_qs,
            headers=headers,
            body=body,
            streamed=streamed,
            strip_usage=strip,
            model=model[:200] if isinstance(model, str) else None,
            tenant=tenant[:200] if tenant else None,
            original_id=rid[:200],
            t0_s=t0_s,
            received_wall_s=wall_s,
            deadline_wall_s=deadline,
        )

    # ------------------------------------------------------------------ records
    def _emit(
        self, ctx: RequestContext, exchanges: list[Exchange], down: Downstream | None
    ) -> None:
        for index, ex in enumerate(exchanges):
            if down is not None and index == len(exchanges) - 1:
                ex.http_status = down.status
            if ex.draining or ex.emitted:
                continue  # a draining attempt is emitted by drained() once the drain ends
            ex.emitted = True
            row = record_row(ctx, ex, tap_id=self.tap_id, pool=self.config.pool)
            self.sink.add_request(row)
            self._observe(row)

    def _observe(self, row: dict[str, Any]) -> None:
        labels = (row["instance"], row.get("model") or "")
        metrics = self.metrics
        metrics.requests.labels(row["instance"], row["outcome"]).inc()
        if row["ttft_s"] is not None:
            metrics.ttft.labels(*labels).observe(row["ttft_s"])
        if row["tpot_s"] is not None:
            metrics.tpot.labels(*labels).observe(row["tpot_s"])
        if row["e2e_s"] is not None:
            metrics.e2e.labels(*labels).observe(row["e2e_s"])
        itl = metrics.itl.labels(*labels)
        for gap in row["itl_gaps_s"] or ():
            itl.observe(gap)
        if self.genai is not None:
            start_ns = int(row["received_ts_ms"] * 1_000_000)
            end_ns = start_ns + int((row["e2e_s"] or 0.0) * 1e9)
            self.genai.record(row, start_ns, end_ns)
