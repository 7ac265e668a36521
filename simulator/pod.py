"""One simulated engine pod: the engine model, its scheduler task and its HTTP server.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE or JSON),
``GET /v1/models``, ``GET /metrics``, ``GET /health``, ``GET|POST /admin/faults``,
``DELETE /admin/faults/{name}``. Everything runs on the fleet's single event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pipeline.errors import ConfigError
from simulator.config import PodConfig
from simulator.dialects import MetricsDialect, make_dialect
from simulator.engine import EngineModel, SimRequest
from simulator.faults import FaultBoard, UnknownFaultError
from simulator.locality import prefix_key
from simulator.openai import (
    ChatRequest,
    CompletionRequest,
    RequestError,
    StreamRenderer,
    count_prompt_tokens,
    error_body,
    parse_request,
)
from simulator.stream import SseWriter, TokenStream

__all__ = ["EnginePod"]

log = logging.getLogger(__name__)
_ids = itertools.count(1)
#: Longest event-loop lag (s) the scheduler makes up by stepping back to back.
MAX_CATCH_UP_S = 0.5
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _discard(tokens: int, finish_reason: str | None) -> None:
    """A writer for non-streaming responses: the body is rendered once at the end."""


class EnginePod:
    """A pod: engine + dialect + aiohttp app on ``host:port`` (port fixed after first start)."""

    def __init__(self, config: PodConfig, *, host: str, speed: float, seed: int) -> None:
        self.config = config
        self.name = config.name
        self.dialect = config.dialect
        self.model = config.model
        self.host = host
        self.port = config.port or 0
        self.speed = speed
        self.seed = seed
        self.faults = FaultBoard()
        self.prefix_cache: OrderedDict[str, None] = OrderedDict()  # prefix keys held, LRU
        self.started_wall_s = time.time()
        self.restarts = 0
        self.listening = False
        self.on_fault_change: Callable[[EnginePod], None] | None = None
        self._runner: web.AppRunner | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self._crash_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._new_engine()

    # ---- identity ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def instance(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ready(self) -> bool:
        return not ({"not_ready", "model_load_failure", "crash"} & set(self.faults.snapshot()))

    def clock(self) -> float:
        return time.monotonic()

    def _new_engine(self) -> None:
        cfg = self.config.engine
        self.metrics: MetricsDialect = make_dialect(
            self.dialect, self.model, cfg.max_model_len, cfg.dp_size
        )
        self.engine = EngineModel(
            cfg,
            self.metrics,
            self.faults,
            self.clock,
            speed=self.speed,
            seed=self.seed + self.restarts,
        )

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the port (a free one the first time) and start the scheduler task."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat),
                web.get("/v1/models", self._models),
                web.get("/metrics", self._metrics),
                web.get("/health", self._health),
                web.get("/admin/faults", self._faults_get),
                web.post("/admin/faults", self._faults_post),
                web.delete("/admin/faults/{name}", self._faults_delete),
            ]
        )
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True, backlog=1024)
        await site.start()
        if self.port == 0:
            server = site._server
            assert server is not None and server.sockets  # type: ignore[attr-defined]
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._runner = runner
        self.listening = True
        self._scheduler = asyncio.create_task(self._run_scheduler(), name=f"sched-{self.name}")

    async def stop(self) -> None:
        """Close the port, drop every connection and stop stepping."""
        self.listening = False
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
            self._scheduler = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def crash(self) -> None:
        """Port closed, in-flight streams dropped; a later restart has fresh counters."""
        await self.stop()
        for req in [*self.engine.running, *self.engine.waiting]:
            req.emit(0, "abort")

    async def _crash_soon(self) -> None:
        await asyncio.sleep(0.05)
        if "crash" in self.faults:  # not cleared in the meantime
            await self.crash()

    async def restart(self) -> None:
        """Come back on the same port as a new process (counters reset)."""
        if self.listening:
            return
        self.restarts += 1
        self.started_wall_s = time.time()
        self._new_engine()
        await self.start()

    # ---- faults -----------------------------------------------------------------------
    async def set_fault(
        self, name: str, params: dict[str, Any] | None = None, *, wait: bool = True
    ) -> dict[str, Any]:
        """Activate fault ``name``; raises ConfigError for unknown names or bad params.

        ``wait=False`` (from the pod's own admin route) crashes in a separate task, so the
        handler that asked for it can still answer.
        """
        validated = self.faults.set(name, params, self.clock())
        if name == "crash":
            if wait:
                await self.crash()
            else:
                self._crash_task = asyncio.get_running_loop().create_task(self._crash_soon())
        self._changed()
        return validated.model_dump()

    async def clear_fault(self, name: str) -> bool:
        """Deactivate ``name`` (a crashed pod restarts on its port)."""
        was = self.faults.clear(name)
        if name == "crash" and was:
            await self.restart()
        self._changed()
        return was

    def _changed(self) -> None:
        self._wake.set()
        if self.on_fault_change is not None:
            self.on_fault_change(self)

    # ---- scheduler ----------------------------------------------------------------------
    async def _run_scheduler(self) -> None:
        """Step the engine on a schedule: each step ends ``duration_s`` after the previous one.

        Steps are due on a running schedule rather than ``now + duration``, so event-loop lag
        (a busy or CPU-starved process) is caught up (bounded by ``MAX_CATCH_UP_S``) instead
        of silently slowing the modelled engine down.
        """
        engine = self.engine
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            plan = engine.plan_step()
            if plan is None:
                self._wake.clear()
                if engine.waiting and not engine.stalled():
                    # admission blocked (KV full / fragmented): poll slowly for room
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), 0.05)
                else:
                    await self._wake.wait()
                due = loop.time()
                continue
            due = max(due, loop.time() - MAX_CATCH_UP_S) + plan.duration_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            engine.finish_step(plan)

    # ---- HTTP: inference ----------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _unavailable(self) -> web.Response | None:
        if "model_load_failure" in self.faults:
            return web.json_response(
                error_body("model is still loading", "ServiceUnavailable", 503), status=503
            )
        if "not_ready" in self.faults:
            return web.json_response(
                error_body("worker not ready", "ServiceUnavailable", 503), status=503
            )
        return None

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        refused = self._unavailable()
        if refused is not None:
            return refused
        try:
            body = parse_request(await request.read(), chat=chat)
        except RequestError as exc:
            return web.json_response(error_body(str(exc), "BadRequestError", 400), status=400)
        if body.model != self.model:
            msg = f"The model `{body.model[:128]}` does not exist."
            return web.json_response(error_body(msg, "NotFoundError", 404), status=404)
        prompt_tokens = count_prompt_tokens(body)
        if prompt_tokens >= self.engine.max_len:
            limit = self.engine.max_len
            msg = f"prompt of {prompt_tokens} tokens exceeds max_model_len {limit}"
            return web.json_response(error_body(msg, "BadRequestError", 400), status=400)
        max_tokens = (
            body.max_completion_tokens
            if isinstance(body, ChatRequest) and body.max_completion_tokens
            else body.max_tokens
        )
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.port}-{next(_ids)}"
        stream = TokenStream()
        engine = self.engine
        req = engine.new_request(
            rid,
            prompt_tokens,
            max_tokens,
            stream.emit,
            ignore_eos=body.ignore_eos,
            streaming=body.stream,
        )
        req.prefix_cached = self._prefix_cached(body)
        engine.add(req)
        self._wake.set()
        renderer = StreamRenderer(rid, self.model, int(time.time()), chat=chat)
        try:
            if body.stream:
                include_usage = self.config.engine.honours_include_usage and bool(
                    body.stream_options and body.stream_options.include_usage
                )
                return await self._stream(request, req, stream, renderer, include_usage)
            return await self._unary(req, stream, renderer)
        except (asyncio.CancelledError, ConnectionError):
            if "ghost" not in self.faults:
                engine.abort(req)
            raise

    def _prefix_cached(self, body: CompletionRequest | ChatRequest) -> bool:
        """Whether the prompt's prefix is in this pod's prefix cache (then cache it, LRU).

        Without ``engine.prefix_cache_prefixes`` every prompt shares the pool's one system
        prompt, always cached; with ``engine.prefix_cache_broken`` nothing is. The key is the first message (chat) or the prompt, as the
        gateway's locality router keys it."""
        if self.config.engine.prefix_cache_broken:
            return False
        capacity = self.config.engine.prefix_cache_prefixes
        if capacity is None:
            return True
        if isinstance(body, ChatRequest):
            first = body.messages[0].content
            text = first if isinstance(first, str) else ""
        else:
            text = body.prompt if isinstance(body.prompt, str) else "".join(body.prompt)
        key = prefix_key(text)
        held = key in self.prefix_cache
        self.prefix_cache[key] = None
        self.prefix_cache.move_to_end(key)
        while len(self.prefix_cache) > capacity:
            self.prefix_cache.popitem(last=False)
        return held

    async def _unary(
        self, req: SimRequest, stream: TokenStream, renderer: StreamRenderer
    ) -> web.Response:
        stream.writer = _discard  # only the finish wakes this handler
        while stream.finish_reason is None:
            await stream.wait()
        if (
            req.error_before_first_token
            or req.finish_reason == "abort"
            or req.cut_after is not None
        ):
            return web.json_response(
                error_body("engine error", "InternalServerError", 500), status=500
            )
        return web.json_response(
            renderer.full_body(req.generated, stream.finish_reason, req.prompt_tokens)
        )

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        stream: TokenStream,
        renderer: StreamRenderer,
        include_usage: bool,
    ) -> web.StreamResponse:
        await stream.wait()  # the first output (or an error) decides the status line
        if stream.pending == 0 and stream.finish_reason is not None:
            status = 503 if stream.finish_reason == "abort" else 500
            return web.json_response(
                error_body("engine error before first token", "InternalServerError", status),
                status=status,
            )
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        transport = request.transport
        assert transport is not None
        sse = SseWriter(transport, renderer, req, include_usage=include_usage)
        sse.write(
            stream.pending,
            stream.finish_reason,
            head=renderer.role_chunk() if renderer.chat else b"",
        )
        stream.pending = 0
        if stream.finish_reason is None:
            stream.writer = sse.write  # from now on the engine writes each step itself
            while stream.finish_reason is None:
                await stream.wait()
        if sse.cut:
            self._cut(request)
            return resp
        await resp.write_eof()
        return resp

    @staticmethod
    def _cut(request: web.Request) -> None:
        """Failure after first token: drop the connection mid-stream (no [DONE], no EOF)."""
        transport = request.transport
        if transport is not None:
            transport.abort()

    # ---- HTTP: ops ----------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        if "model_load_failure" in self.faults:  # the server is up, the weights never loaded
            return web.json_response({"object": "list", "data": []})
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "vllm"}]}
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics.exposition(self.engine, self.clock())
        return web.Response(body=body, headers={"Content-Type": self.metrics.content_type})

    async def _health(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.Response(status=200)
        return web.Response(status=503, text="not ready")

    async def _faults_get(self, request: web.Request) -> web.Response:
        return web.json_response({"pod": self.name, "active": self.faults.snapshot()})

    async def _faults_post(self, request: web.Request) -> web.Response:
        try:
            data = json.loads(await request.read())
            if not isinstance(data, dict) or not isinstance(data.get("fault"), str):
                raise ConfigError('body must be {"fault": NAME, "params": {...}}')
            params = await self.set_fault(data["fault"], data.get("params"), wait=False)
        except UnknownFaultError as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except (ConfigError, ValueError, UnicodeDecodeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"pod": self.name, "fault": data["fault"], "params": params})

    async def _faults_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        was = await self.clear_fault(name)
        return web.json_response(
            {"pod": self.name, "fault": name, "cleared": was}, status=200 if was else 404
        )
