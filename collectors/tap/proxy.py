"""The tap itself: a reverse proxy that measures the OpenAI streaming path.

``/v1/chat/completions`` and ``/v1/completions`` (configurable) are measured: each attempt
becomes one ``REQUEST_RECORDS`` row handed to the sink. Every other path is passed through
untouched. Both sides speak HTTP/1.1 through the tap's own lean protocols
(:mod:`collectors.tap.server`, :mod:`collectors.tap.upstream`). Handlers are cancelled when
the client disconnects, which is how the tap closes the upstream at once (or drains it,
bounded, in drain mode).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from multidict import CIMultiDict

from collectors.tap.config import TapConfig
from collectors.tap.contract import RetryBudget, Upstream, UpstreamPool, parse_deadline_s
from collectors.tap.degradation import (
    DEGRADATION_HEADER,
    ECONOMY_HEADER,
    Degrader,
    Enforcement,
    FlagSnapshot,
    with_model,
)
from collectors.tap.downstream import HOP_BY_HOP, ClientGone, Downstream
from collectors.tap.exchange import Exchange, RequestContext
from collectors.tap.inflight import InFlightTracker
from collectors.tap.labels import MAX_MODEL_NAME_CHARS, ModelLabels
from collectors.tap.loopwatch import LoopWatch, read_throttled_s
from collectors.tap.records import header_label, record_row, tenant_label
from collectors.tap.server import IncomingRequest, TapServer
from collectors.tap.sinks import RecordSink
from collectors.tap.targets import MAX_TARGET_MS, OwnTargets, parse_own_targets
from collectors.tap.telemetry import GenAiTelemetry, TapMetrics
from collectors.tap.upstream import UpstreamClient, UpstreamError
from pipeline.errors import ConfigError

__all__ = ["Clock", "SystemClock", "TapProxy", "run_event_loop"]

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
        flags: Callable[[], FlagSnapshot] | None = None,
    ) -> None:
        """``flags`` returns the current degradation-flag snapshot (a
        :class:`~collectors.tap.degradation.FlagFollower`'s ``current``); with it the tap
        enforces L1–L3 per ``config.degradation``, without it it never acts on flags."""
        if not config.upstreams:
            raise ConfigError("tap.upstreams: at least one upstream URL is required")
        self.config = config
        self.sink = sink
        self.metrics = metrics or TapMetrics()
        self.genai = genai
        self.clock = clock or SystemClock()
        self.pool = UpstreamPool(config.upstreams, config.instance)
        self.budget = RetryBudget(config.retry_budget_ratio, config.retry_budget_min_per_s)
        self.inflight = InFlightTracker(
            [u.instance for u in self.pool.upstreams],
            addresses={u.instance: u.address for u in self.pool.upstreams},
        )
        self.model_labels = ModelLabels(config.models, max_labels=config.max_model_labels)
        self._models_loop: asyncio.Task[None] | None = None
        self.tap_id = config.tap_id or f"{socket.gethostname()}:{config.listen.rpartition(':')[2]}"
        self.port: int | None = None
        self._client: UpstreamClient | None = None
        self._server: TapServer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gauges: asyncio.Task[None] | None = None
        self._measured = set(config.measured_routes)
        self._tenants = frozenset(config.tenants)
        self._label_problems_logged: set[str] = set()
        self._bytes_upstream = self.metrics.bytes.labels("upstream")
        self._bytes_client = self.metrics.bytes.labels("client")
        self._degrader = (
            Degrader(config.degradation, flags, self.clock.monotonic_s) if flags else None
        )
        self._instances = tuple(u.instance for u in self.pool.upstreams)
        #: how late the loop is: every chunk's read-delay bound, the tap's lag and GC pauses
        self.loop_watch = LoopWatch(
            self.clock.monotonic_s,
            config.loop_watch_interval_s,
            on_lag=self.metrics.loop_lag.observe,
            on_gc=self.metrics.gc_pause.observe,
        )
        fallback = config.degradation.fallback_upstream
        self._fallback = Upstream.from_url(fallback) if fallback else None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Bind and serve; returns the port (``listen`` may say port 0)."""
        self._client = UpstreamClient(
            connect_timeout_s=self.config.connect_timeout_s,
            read_timeout_s=self.config.read_timeout_s,
            max_connections=self.config.max_connections,
            keepalive_s=self.config.upstream_keepalive_s,
            clock=self.clock.monotonic_s if self.config.kernel_timestamps else None,
            late_s=self.loop_watch.late_s,
        )
        self._server = TapServer(
            self._route,
            max_body_bytes=self.config.max_request_bytes,
            write_timeout_s=self.config.client_write_timeout_s,
            idle_timeout_s=self.config.client_idle_timeout_s,
            head_timeout_s=self.config.client_head_timeout_s,
            body_timeout_s=self.config.client_body_timeout_s,
        )
        await self.refresh_models()  # labels known before the first request, when reachable
        host, _, port = self.config.listen.rpartition(":")
        self.port = await self._server.start(host, int(port))
        self.loop_watch.start()
        self._gauges = asyncio.create_task(self._gauge_loop())
        self._models_loop = asyncio.create_task(self._refresh_models_loop())
        return self.port

    async def stop(self) -> None:
        """Stop serving, wait for drains, publish a last gauge sample, close the sink."""
        if self._gauges is not None:
            self._gauges.cancel()
        if self._models_loop is not None:
            self._models_loop.cancel()
        if self._server is not None:
            await self._server.close(grace_s=self.config.shutdown_grace_s)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.drain_max_s + 5)
        if self._client is not None:
            await self._client.close()
        self.loop_watch.stop()
        self.publish_gauges()

    @property
    def client_connections(self) -> int:
        """Client connections open now."""
        return len(self._server.connections) if self._server is not None else 0

    def publish_gauges(self) -> None:
        """Hand the current in-flight, disconnect and uncertain counts, and the tap's own
        health (loop lag since the last call, GC pauses, CPU throttling), to the sink."""
        watch = self.loop_watch
        health = [
            ("llmslo_tap_loop_lag_max_seconds", "tap_loop_lag", "gauge", watch.take_max_lag_s()),
            ("llmslo_tap_gc_pause_seconds_total", "tap_gc_pause", "counter", watch.gc_pause_s),
        ]
        throttled_s = read_throttled_s()
        if throttled_s is not None:
            health.append(
                (
                    "llmslo_tap_cpu_throttled_seconds_total",
                    "tap_cpu_throttled",
                    "counter",
                    throttled_s,
                )
            )
        ts_ms = int(self.clock.wall_s() * 1000)
        self.sink.add_samples(self.inflight.samples(ts_ms, self.tap_id, health))

    async def refresh_models(self) -> None:
        """Read every upstream's ``/v1/models`` again (see :meth:`ModelLabels.refresh`)."""
        assert self._client is not None
        upstreams = [(u.url, u.instance) for u in self.pool.upstreams]
        await self.model_labels.refresh(
            self._client, upstreams, timeout_s=self.config.connect_timeout_s
        )

    async def _refresh_models_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.models_refresh_s)
            await self.refresh_models()

    async def _gauge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gauge_interval_s)
            self.publish_gauges()

    # ------------------------------------------------------------------ hooks (used by Exchange)
    def wall_s(self) -> float:
        return self.clock.wall_s()

    def late_s(self, now_s: float) -> float:
        """The most a chunk read at ``now_s`` can have waited for the loop (seconds)."""
        return self.loop_watch.late_s(now_s)

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
    async def _route(self, request: IncomingRequest, down: Downstream) -> None:
        if request.path in self._measured and request.method == "POST":
            await self._measure(request, down)
        else:
            await self._passthrough(request, down)

    async def _measure(self, request: IncomingRequest, down: Downstream) -> None:
        t0_s, wall_s = self.clock.monotonic_s(), self.clock.wall_s()
        ctx = self._context(request, t0_s, wall_s)
        exchanges: list[Exchange] = []
        if self._degrader is not None:
            enforcement = self._enforce(ctx)
            if enforcement.reject:
                self._reject(ctx, down, enforcement)
                self._bytes_client.inc(down.bytes_sent)
                return
            if enforcement.fallback:
                down.extra_headers.append(ECONOMY_HEADER)
                if self.config.degradation.fallback_model is not None:
                    ctx.body = with_model(ctx.body, self.config.degradation.fallback_model)
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
        if ctx.enforced_action == "fallback_upstream" and self._fallback is not None:
            upstream = self._fallback  # L3: the small-model replica serves every attempt
        else:
            upstream = self.pool.pick({ex.upstream.instance for ex in previous})
        client = self._client
        assert client is not None
        return Exchange(ctx, upstream, attempt, self.config, client, self.clock.monotonic_s, self)

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

    # ------------------------------------------------------------------ degradation flags
    def _enforce(self, ctx: RequestContext) -> Enforcement:
        """Decide what the current flags do to ``ctx``; note it on the context and count it."""
        assert self._degrader is not None
        ctx.headers.popall(DEGRADATION_HEADER, None)  # only the tap says what the level is
        enforcement = self._degrader.enforce(
            self._pool_of(ctx), self._instances, len(ctx.body), ctx.max_tokens
        )
        ctx.degradation_level, ctx.enforced_action = enforcement.level, enforcement.action
        if enforcement.action is not None:
            level = "unknown" if enforcement.level is None else f"L{enforcement.level}"
            self.metrics.degradation_actions.labels(level, enforcement.action).inc()
        if enforcement.level:
            ctx.headers[DEGRADATION_HEADER] = f"L{enforcement.level}"
        return enforcement

    def _reject(self, ctx: RequestContext, down: Downstream, enforcement: Enforcement) -> None:
        """L2: answer 429 with Retry-After, never sent upstream; recorded as ``rejected``."""
        ex = self._exchange(ctx, 1, [])
        ex.outcome, ex.error_kind = "rejected", enforcement.action
        retry_after = str(self.config.degradation.retry_after_s)
        what = "prompt" if enforcement.action == "rejected_long_prompt" else "max_tokens"
        try:
            down.send_error_nowait(
                429,
                "degraded",
                f"the service is degraded (L{enforcement.level}): {what} too large, retry later",
                {"Retry-After": retry_after},
            )
        except ClientGone:
            ex.outcome, ex.error_kind = "client_cancelled", "client_disconnected"
            ex.disconnect_wall_s = self.clock.wall_s()
        self._emit(ctx, [ex], down)

    async def _passthrough(self, request: IncomingRequest, down: Downstream) -> None:
        """Any other path: forwarded untouched, not measured."""
        assert self._client is not None
        upstream = self.pool.pick()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        try:
            resp = await self._client.request(
                upstream.url, request.method, request.path_qs, headers, request.body
            )
            try:
                down.commit(resp.status, resp.headers)
                while chunk := await resp.readany():
                    await down.write(chunk)
                await down.end()
            finally:
                if resp.at_eof():
                    resp.release()
                else:
                    resp.close()
        except ClientGone:
            pass
        except UpstreamError as exc:
            if down.committed:
                down.abort()
            else:
                await down.send_error(502, "upstream_error", f"upstream failed: {exc}")

    # ------------------------------------------------------------------ request context
    def _context(self, request: IncomingRequest, t0_s: float, wall_s: float) -> RequestContext:
        cfg = self.config
        body = request.body
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
        max_tokens = None
        if parsed is not None:
            asked = parsed.get("max_tokens", parsed.get("max_completion_tokens"))
            if type(asked) is int:
                max_tokens = asked
        deadline, problem = parse_deadline_s(
            request.headers,
            now_wall_s=wall_s,
            deadline_header=cfg.deadline_header,
            timeout_header=cfg.timeout_header,
            default_timeout_s=cfg.default_timeout_s,
        )
        if problem:
            self.dropped(problem)
        revision, cohort = self._cohort_labels(request.headers)
        own_targets = self._own_targets(request.headers)
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
            model=model[:MAX_MODEL_NAME_CHARS] if isinstance(model, str) else None,
            tenant=tenant_label(tenant, self._tenants),
            original_id=rid[:200],
            t0_s=t0_s,
            received_wall_s=wall_s,
            deadline_wall_s=deadline,
            revision=revision,
            cohort=cohort,
            max_tokens=max_tokens,
            own_targets=own_targets,
        )

    def _cohort_labels(self, headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """``(revision, cohort)`` for one request; unusable header values are counted."""
        cfg = self.config
        stamped = []
        for name, header, default in (
            ("revision", cfg.revision_header, cfg.revision),
            ("cohort", cfg.cohort_header, cfg.cohort),
        ):
            value, problem = header_label(headers, header, name, default)
            if problem:
                self.dropped(problem)
                if problem not in self._label_problems_logged:
                    self._label_problems_logged.add(problem)
                    log.warning(
                        "%s: header %s has no usable value (1-253 printable characters); "
                        "stamping %r instead (counted as dropped, logged once)",
                        self.tap_id,
                        header,
                        default,
                    )
            stamped.append(value)
        return stamped[0], stamped[1]

    def _own_targets(self, headers: Mapping[str, str]) -> OwnTargets:
        """The request's own SLO targets; unusable header values are counted, logged once."""
        cfg = self.config
        targets, problems = parse_own_targets(
            headers, ttft_header=cfg.slo_ttft_header, tpot_header=cfg.slo_tpot_header
        )
        for problem in problems:
            self.dropped(problem)
            if problem not in self._label_problems_logged:
                self._label_problems_logged.add(problem)
                log.warning(
                    "%s: an SLO target header (%s / %s) holds no number in (0, %g] ms; "
                    "the request is judged without it (counted as dropped, logged once)",
                    self.tap_id,
                    cfg.slo_ttft_header,
                    cfg.slo_tpot_header,
                    MAX_TARGET_MS,
                )
        return targets

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
            row = record_row(
                ctx,
                ex,
                tap_id=self.tap_id,
                pool=self._pool_of(ctx),
                max_gaps=self.config.record_max_gaps,
                gap_error_max_s=self.config.gap_error_max_s,
            )
            if row["itl_uncertain"]:
                self.inflight.uncertain_gaps(row["instance"])
                self.metrics.uncertain.labels(row["instance"]).inc()
            self.sink.add_request(row)
            self._observe(row, ex.finish().itl_gaps_s)

    def _pool_of(self, ctx: RequestContext) -> str:
        """The tap's pool, else the requested model's bounded label (never a client's string)."""
        return self.config.pool or self.model_labels.label(ctx.model)

    def _observe(self, row: dict[str, Any], itl_gaps_s: Sequence[float]) -> None:
        """Telemetry of one record; ``itl_gaps_s`` is every gap (the row keeps the first few)."""
        model = self.model_labels.label(row.get("model"))  # bounded, never the raw string
        labels = (row["instance"], model)
        metrics = self.metrics
        code = "" if row["http_status"] is None else str(row["http_status"])
        metrics.requests.labels(row["instance"], row["outcome"], code).inc()
        if row["ttft_s"] is not None:
            metrics.ttft.labels(*labels).observe(row["ttft_s"])
        if row["tpot_s"] is not None:
            metrics.tpot.labels(*labels).observe(row["tpot_s"])
        if row["e2e_s"] is not None:
            metrics.e2e.labels(*labels).observe(row["e2e_s"])
        itl = metrics.itl.labels(*labels)
        for gap in itl_gaps_s:
            itl.observe(gap)
        if self.genai is not None:
            start_ns = int(row["received_ts_ms"] * 1_000_000)
            end_ns = start_ns + int((row["e2e_s"] or 0.0) * 1e9)
            self.genai.record(row, start_ns, end_ns, itl_gaps_s=itl_gaps_s, model_label=model)
