"""A scripted OpenAI-compatible upstream (real aiohttp server on loopback) and tap helpers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from collectors.tap import ListSink, TapConfig, TapProxy
from collectors.tap.loopwatch import read_throttled_s
from pipeline.signals import ENGINE_SIGNALS


def chat_events(
    tokens: int,
    *,
    model: str = "m",
    role_first: bool = True,
    usage: bool = True,
    finish: str | None = "stop",
    done: bool = True,
    prompt_tokens: int = 7,
) -> list[bytes]:
    """The SSE events a vLLM-like engine sends for a chat stream of ``tokens`` tokens."""
    head = (
        '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
        f'"model":"{model}","choices":['
    )
    events = []
    if role_first:
        role = '{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}'
        events.append(f"data: {head}{role}]}}\n\n")
    for i in range(tokens):
        reason = json.dumps(finish) if (i == tokens - 1 and finish) else "null"
        choice = f'{{"index":0,"delta":{{"content":"t{i} "}},"finish_reason":{reason}}}'
        events.append(f"data: {head}{choice}]}}\n\n")
    if usage:
        events.append(
            f'data: {head[:-11]}"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},'
            f'"completion_tokens":{tokens},"total_tokens":{prompt_tokens + tokens}}}}}\n\n'
        )
    if done:
        events.append("data: [DONE]\n\n")
    return [e.encode() for e in events]


@dataclass
class Script:
    """What the upstream does for one request: status, then pieces (delay_s, bytes), then ``end``.

    ``end``: ``eof`` (normal), ``reset`` (abort the connection), ``stall`` (never finish).
    ``usage_aware``: drop the usage event unless the request asked for it (like real engines).
    """

    pieces: list[tuple[float, bytes]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/event-stream"})
    end: str = "eof"
    usage_aware: bool = True


def stream_script(tokens: int, gap_s: float = 0.0, first_s: float = 0.0, **kw: Any) -> Script:
    events = chat_events(tokens, **kw)
    return Script([(first_s if i == 0 else gap_s, e) for i, e in enumerate(events)])


class ScriptedUpstream:
    """Serves ``script_for(request_json)`` on every POST; records what it received."""

    def __init__(
        self,
        script_for: Callable[[dict[str, Any]], Script],
        *,
        models: list[str] | None = None,
    ) -> None:
        self.script_for = script_for
        self.models = models  # announced on GET /v1/models (as vLLM does) when given
        self.model_list_requests = 0
        self.requests: list[dict[str, Any]] = []
        self.headers: list[CIMultiDict[str]] = []
        self.closed_by_peer: list[float] = []  # wall time the tap closed a stream early
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/v1/models" and self.models is not None:
            self.model_list_requests += 1
            data = [{"id": m, "object": "model", "owned_by": "vllm"} for m in self.models]
            return web.json_response({"object": "list", "data": data})
        if request.method != "POST":
            return web.json_response(
                {"path": request.path, "query": request.query_string}, headers={"X-Up": "1"}
            )
        body = await request.read()
        parsed = json.loads(body) if body else {}
        self.requests.append(parsed)
        self.headers.append(CIMultiDict(request.headers))
        script = self.script_for(parsed)
        wants_usage = bool((parsed.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(status=script.status, headers=script.headers)
        try:
            await resp.prepare(request)
            for delay_s, piece in script.pieces:
                if delay_s:
                    await asyncio.sleep(delay_s)
                if script.usage_aware and not wants_usage and b'"choices":[],"usage"' in piece:
                    continue
                await resp.write(piece)
            if script.end == "reset":
                assert request.transport is not None
                request.transport.abort()
                return resp
            if script.end == "stall":
                await asyncio.sleep(3600)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            self.closed_by_peer.append(time.time())
            raise
        return resp


@asynccontextmanager
async def tap_over(
    upstreams: Sequence[ScriptedUpstream | str], *, genai: Any = None, **overrides: Any
) -> AsyncIterator[tuple[str, ListSink, TapProxy]]:
    """A started tap in front of ``upstreams``; yields (tap URL, in-memory sink, proxy)."""
    urls = [u if isinstance(u, str) else await u.start() for u in upstreams]
    config = TapConfig(
        listen="127.0.0.1:0", upstreams=urls, kafka=False, tap_id="tap-test", **overrides
    )
    sink = ListSink()
    proxy = TapProxy(config, sink, genai=genai)
    port = await proxy.start()
    try:
        yield f"http://127.0.0.1:{port}", sink, proxy
    finally:
        await proxy.stop()
        for u in upstreams:
            if not isinstance(u, str):
                await u.stop()


async def post(
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
    route: str = "/v1/chat/completions",
    timeout_s: float = 30.0,
) -> tuple[int, bytes, str | None]:
    """POST and read the whole response; returns (status, body bytes, error class name or None)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url + route, data=data, headers=hdrs) as resp,
    ):
        chunks = []
        try:
            async for chunk in resp.content.iter_any():
                chunks.append(chunk)
        except aiohttp.ClientPayloadError as exc:
            return resp.status, b"".join(chunks), type(exc).__name__
        return resp.status, b"".join(chunks), None


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "secret prompt"}], "stream": True}


def tap_sample_signals() -> set[str]:
    """The signals of the tap's own sample rows: every ``tap_*`` signal of the catalog, CPU
    throttling only where the cgroup reports it (collectors/tap/loopwatch.py)."""
    signals = {name for name in ENGINE_SIGNALS if name.startswith("tap_")}
    return signals if read_throttled_s() is not None else signals - {"tap_cpu_throttled"}
