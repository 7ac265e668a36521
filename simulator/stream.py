"""From engine tokens to bytes on the wire, without a task wake-up per token.

:class:`TokenStream` buffers what the engine emitted until the HTTP handler has decided
the status line (the first output, or an error before it). After that the handler installs
an :class:`SseWriter` and the engine's emit callback frames and writes each step's chunks
straight to the connection's transport (HTTP/1.1 chunked framing, exactly as aiohttp's own
writer does); the handler only wakes once more, when the request finishes. This keeps the
per-token cost at roughly one ``send`` per stream per engine step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from simulator.engine import SimRequest
from simulator.openai import DONE, StreamRenderer

__all__ = ["SseWriter", "TokenStream"]


class TokenStream:
    """Tokens the engine emitted for one request (buffered, or forwarded to ``writer``)."""

    __slots__ = ("_waiter", "finish_reason", "pending", "writer")

    def __init__(self) -> None:
        self.pending = 0
        self.finish_reason: str | None = None
        self.writer: Callable[[int, str | None], None] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def emit(self, tokens: int, finish_reason: str | None) -> None:
        """The engine's callback: ``tokens`` produced this step, ``finish_reason`` at the end."""
        if finish_reason is not None:
            self.finish_reason = finish_reason
        if self.writer is not None:
            self.writer(tokens, finish_reason)
        else:
            self.pending += tokens
        if (tokens and self.writer is None) or finish_reason is not None:
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Return once there are buffered tokens or the request finished."""
        if self.pending or self.finish_reason is not None:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class SseWriter:
    """Writes one response's SSE chunks to ``transport`` as chunked HTTP body pieces.

    ``cut`` becomes True when the stream must end without ``[DONE]`` (failure after the
    first token, engine abort); the handler then drops the connection.
    """

    __slots__ = ("cut", "include_usage", "renderer", "req", "transport", "written")

    def __init__(
        self,
        transport: asyncio.Transport,
        renderer: StreamRenderer,
        req: SimRequest,
        *,
        include_usage: bool,
    ) -> None:
        self.transport = transport
        self.renderer = renderer
        self.req = req
        self.include_usage = include_usage
        self.written = 0
        self.cut = False

    def write(self, tokens: int, finish_reason: str | None, head: bytes = b"") -> None:
        """Frame and send ``head`` plus this step's token chunks (and the tail when done)."""
        render = self.renderer
        parts = [head] if head else []
        start = self.written
        for i in range(tokens):
            last = finish_reason is not None and i == tokens - 1
            parts.append(render.token_chunk(start + i, finish_reason if last else None))
        self.written += tokens
        if finish_reason is not None:
            if tokens == 0:
                parts.append(render.finish_chunk(finish_reason))
            if self.req.cut_after is not None or finish_reason == "abort":
                self.cut = True
                parts.pop()  # the failing step's chunk never reaches the client
            else:
                if self.include_usage:
                    parts.append(render.usage_chunk(self.req.prompt_tokens, self.written))
                parts.append(DONE)
        self._send(b"".join(parts))

    def _send(self, data: bytes) -> None:
        if data and not self.transport.is_closing():
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
