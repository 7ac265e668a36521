"""A gateway with a router (EPP-like) in front of the pods: the failures *in front of* the taps.

``Gateway`` is the entry point clients (and ``llmslo probe``) call: it admits a request
into a bounded queue (``max_in_flight`` forwarded at once, ``max_queue`` waiting; a full
queue answers **429** ``queue_full``), asks the router for an endpoint, and streams the
pod's answer back byte for byte. The router's policy is ``round_robin``,
``least_in_flight`` or ``prefix_locality`` (:mod:`simulator.locality`); a pod that is not ready (``/health`` not 200 at the last check) is not
eligible, and with none eligible the gateway answers **503** ``no_eligible_endpoint``.

Faults (:data:`GATEWAY_FAULTS`, set with :meth:`Gateway.set_fault`):

* ``gateway_down`` — the listener closes and open connections are cut: connections are refused;
* ``router_down`` — the router stops answering; the gateway then follows
  ``router_down_policy``: ``fail_open`` (any pod, round robin, no readiness check),
  ``fail_close`` (**503** ``router_unavailable``) or ``reject`` (**429** ``router_unavailable``);
* ``stale_kv_index`` — with policy ``prefix_locality`` the router's KV locality index
  goes stale (:mod:`simulator.locality`): hints rejected, cache hit ratio drops.

Everything it does is counted on ``/metrics`` under the Inference Extension EPP's names
where a real router has them (:mod:`simulator.gateway_metrics`), ``llmslo_sim_gateway_*``
for what only the gateway sees (answers by code and reason, router up, decisions by mode).
A request that carries its own targets (``x-llm-d-slo-ttft-ms`` / ``-tpot-ms``) is timed by
the router and, when it missed one, counted as the EPP's SLO violation of that type
(:mod:`simulator.own_targets`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Literal

import aiohttp
from aiohttp import web
from prometheus_client import Counter, generate_latest

from pipeline.errors import ConfigError
from simulator.gateway_metrics import GatewayMetrics, RouterNames
from simulator.locality import LocalityIndex, prefix_key
from simulator.own_targets import ResponseTimer, read_targets

__all__ = ["GATEWAY_FAULTS", "Gateway"]

#: Faults of the gateway and its router, with the signal an observer should see.
GATEWAY_FAULTS = {
    "gateway_down": "connections refused at the entry point; probes fail with connect_refused",
    "router_down": "router_up 0; fail_open: requests still served, fail_close: 503, reject: 429",
    "stale_kv_index": "prefix_locality: hints rejected, cache hit ratio drops (see locality.py)",
}
RouterDownPolicy = Literal["fail_open", "fail_close", "reject"]
RoutingPolicy = Literal["round_robin", "least_in_flight", "prefix_locality"]
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}


class Gateway:
    """Entry point + router over ``upstreams`` (pod base URLs) on ``host``; see the module doc."""

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        host: str = "127.0.0.1",
        policy: RoutingPolicy = "round_robin",
        router_down_policy: RouterDownPolicy = "fail_close",
        max_in_flight: int = 64,
        max_queue: int = 64,
        health_interval_s: float = 1.0,
        replica_in_flight: int | None = None,
        pool: str = "default",
        port: int = 0,
        router_names: RouterNames = "inference-extension",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``replica_in_flight``: when set, the gateway forwards at most that many requests
        per *active* replica (the autoscaler's ready replicas) instead of ``max_in_flight``.
        ``pool``: the InferencePool name on ``inference_pool_*`` metrics; ``port`` 0: a free one.
        ``router_names``: the name set of the router's metrics (:data:`simulator.gateway_metrics.ROUTER_NAMES`).
        ``clock``: seconds, what the router times requests' own targets with."""
        if not upstreams:
            raise ConfigError("gateway.upstreams: at least one pod URL is required")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.host, self.port = host, port
        self.policy, self.router_down_policy = policy, router_down_policy
        self.max_queue = max_queue
        self.health_interval_s = health_interval_s
        self.clock = clock
        self.faults: set[str] = set()
        self.in_flight = dict.fromkeys(self.upstreams, 0)
        self.ready = dict.fromkeys(self.upstreams, True)
        self.max_in_flight, self.replica_in_flight = max_in_flight, replica_in_flight
        self.active = list(self.upstreams)  # replicas serving (the autoscaler changes this)
        self._admission = asyncio.Condition()
        self._forwarded = 0
        self._waiting = 0
        self._rr = itertools.cycle(range(len(self.upstreams)))
        self.metrics = GatewayMetrics(pool, router_names)
        self.registry = self.metrics.registry
        self.metrics.set_ready_pods(len(self.upstreams))
        self.locality = LocalityIndex(self.upstreams)
        self._prefix = {
            name: Counter(f"llmslo_sim_router_prefix_{name}", doc, registry=self.registry)
            for name, doc in (
                ("lookups", "Requests routed by prefix locality"),
                ("hits", "Routed to a pod that held the prefix's KV"),
                ("hints_rejected", "Hinted pod did not hold the prefix (stale index)"),
            )
        }
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._session: aiohttp.ClientSession | None = None
        self._health: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Bind (the port is kept across ``gateway_down``) and start the readiness checks."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
        )
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._forward)
        app.router.add_post("/v1/completions", self._forward)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._own_health)
        self._runner = web.AppRunner(
            app, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        await self._listen()
        self._health = asyncio.create_task(self._check_health())

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self.host, self.port)
        await self._site.start()
        if self.port == 0:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._health is not None:
            self._health.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def set_fault(self, name: str) -> None:
        """Switch on ``gateway_down`` or ``router_down``; raises ConfigError for another name."""
        if name not in GATEWAY_FAULTS:
            raise ConfigError(f"gateway fault: unknown {name!r}; known: {sorted(GATEWAY_FAULTS)}")
        self.faults.add(name)
        if name == "router_down":
            self.metrics.router_up.set(0)
        if name == "stale_kv_index":
            self.locality.set_stale()
        if name == "gateway_down" and self._site is not None:
            await self._site.stop()
            self._site = None
            # A gateway that is down is down for clients already connected too: stopping the
            # listener alone leaves keep-alive connections (the prober's, the collector's) served.
            if self._runner is not None and self._runner.server is not None:
                await self._runner.server.shutdown(0)

    async def clear_fault(self, name: str) -> bool:
        """Switch ``name`` off; returns whether it was on."""
        was = name in self.faults
        self.faults.discard(name)
        if name == "router_down":
            self.metrics.router_up.set(1)
        if name == "stale_kv_index" and was:
            self.locality.clear_stale()
        if name == "gateway_down" and self._site is None and self._runner is not None:
            await self._listen()
        return was

    # ---- routing ------------------------------------------------------------------------
    async def _check_health(self) -> None:
        assert self._session is not None
        while True:
            for upstream in self.upstreams:
                try:
                    async with self._session.get(
                        f"{upstream}/health", timeout=aiohttp.ClientTimeout(total=2)
                    ) as r:
                        self.ready[upstream] = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    self.ready[upstream] = False
            self.metrics.set_ready_pods(sum(self.ready[u] for u in self.active))
            await asyncio.sleep(self.health_interval_s)

    def pick(self, prompt: str = "") -> tuple[str | None, str]:
        """The endpoint for the next request and the decision mode, or ``(None, reason)``."""
        if "router_down" in self.faults:
            if self.router_down_policy == "fail_open":
                return self.upstreams[next(self._rr)], "fail_open"
            return None, "router_unavailable"
        eligible = [u for u in self.active if self.ready[u]]
        if not eligible:
            return None, "no_eligible_endpoint"
        if self.policy == "prefix_locality":
            choice = self.locality.route(prefix_key(prompt), eligible)
            self._prefix["lookups"].inc()
            self._prefix["hits"].inc(choice.hit)
            self._prefix["hints_rejected"].inc(choice.hint_rejected)
            return choice.upstream, "prefix_locality"
        if self.policy == "least_in_flight":
            return min(eligible, key=lambda u: self.in_flight[u]), "least_in_flight"
        for _ in self.upstreams:
            candidate = self.upstreams[next(self._rr)]
            if candidate in eligible:
                return candidate, "round_robin"
        return eligible[0], "round_robin"

    def _refuse(self, code: int, reason: str, model: str = "") -> web.Response:
        self.metrics.refused(code, reason, model)
        return web.json_response(
            {"error": {"message": reason, "type": reason, "code": code}}, status=code
        )

    def capacity(self) -> int:
        """Requests forwarded at once: per active replica when so configured."""
        if self.replica_in_flight is None:
            return self.max_in_flight
        return self.replica_in_flight * len(self.active)

    @property
    def in_flight_total(self) -> int:
        """Requests forwarded to the pods now."""
        return self._forwarded

    @property
    def waiting(self) -> int:
        """Requests queued at the gateway now."""
        return self._waiting

    async def set_active(self, upstreams: Sequence[str]) -> None:
        """Serve from ``upstreams`` only (scale out / in); wakes queued requests."""
        self.active = [u for u in self.upstreams if u in set(upstreams)]
        async with self._admission:
            self._admission.notify_all()

    async def _admit(self) -> bool:
        if self._forwarded >= self.capacity() and self._waiting >= self.max_queue:
            return False
        self._waiting += 1
        self.metrics.queued(self._waiting)
        try:
            async with self._admission:
                await self._admission.wait_for(lambda: self._forwarded < self.capacity())
                self._forwarded += 1
        finally:
            self._waiting -= 1
            self.metrics.queued(self._waiting)
        return True

    async def _release(self) -> None:
        async with self._admission:
            self._forwarded -= 1
            self._admission.notify_all()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        received_s = self.clock()
        body = await request.read()
        prompt, model = _fields_of(body)
        if not await self._admit():
            return self._refuse(429, "queue_full", model)
        try:
            upstream, mode = self.pick(prompt)
            if upstream is None:
                code = (
                    429
                    if mode == "router_unavailable" and self.router_down_policy == "reject"
                    else 503
                )
                return self._refuse(code, mode, model)
            self.metrics.scheduled(mode, model)
            self.metrics.forwarding(model, 1)
            targets = read_targets(request.headers) if mode != "fail_open" else None
            timer = None if targets is None else ResponseTimer(targets, received_s)
            try:
                return await self._proxy(request, upstream, body, timer)
            finally:
                self.metrics.forwarding(model, -1)
                for kind in timer.missed() if timer is not None else ():
                    self.metrics.missed_target(model, kind)
        finally:
            await self._release()

    async def _proxy(
        self, request: web.Request, upstream: str, body: bytes, timer: ResponseTimer | None
    ) -> web.StreamResponse:
        """Stream ``upstream``'s answer back; ``timer`` (a request with its own targets)
        times the answer as the router does, and hears of its end only when it was a 200
        that ended whole."""
        assert self._session is not None
        self.in_flight[upstream] += 1
        response: web.StreamResponse | None = None
        try:
            async with self._session.post(
                f"{upstream}{request.path}", data=body, headers={"content-type": "application/json"}
            ) as up:
                response = web.StreamResponse(
                    status=up.status,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS},
                )
                await response.prepare(request)
                streamed = up.headers.get("content-type", "").startswith("text/event-stream")
                async for piece in up.content.iter_any():
                    if timer is not None and streamed:
                        timer.feed(piece, self.clock())
                    await response.write(piece)
                await response.write_eof()
                if timer is not None and up.status == 200:
                    timer.finish(self.clock(), streamed=streamed)
                self.metrics.answers.labels(str(up.status), "upstream").inc()
                return response
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            if response is not None:  # mid-stream: the client sees the stream end without [DONE]
                self.metrics.answers.labels(str(response.status), "upstream_cut").inc()
                return response
            return self._refuse(502, "upstream_error")
        finally:
            self.in_flight[upstream] -= 1

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    async def _own_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


def _fields_of(body: bytes) -> tuple[str, str]:
    """The prompt text routing keys on (first message, or ``prompt``) and the model name;
    '' for what is unreadable."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return "", ""
    if not isinstance(parsed, dict):
        return "", ""
    model = str(parsed.get("model", ""))
    messages = parsed.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        return str(messages[0].get("content", "")), model
    return str(parsed.get("prompt", "")), model
