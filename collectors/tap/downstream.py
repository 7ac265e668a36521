"""The client side of one proxied request: commit headers once, write with backpressure.

Every write awaits the transport's drain (aiohttp pauses the writer above its high-water
mark), so a slow client holds the tap at most one read's worth of bytes per stream and
pushes back on the upstream through TCP. A client that accepts nothing for
``write_timeout_s`` is treated as gone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from aiohttp import web
from multidict import CIMultiDict

from pipeline.errors import LlmsloError

__all__ = ["ClientGone", "Downstream", "response_headers"]

#: Hop-by-hop and framing headers that never cross the proxy (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)


#: Writes that leave less than this in the transport buffer never wait (asyncio's default
#: high-water mark is 64 KiB; aiohttp drains only above it).
_NO_WAIT_BYTES = 32 * 1024


class ClientGone(LlmsloError):
    """The client disconnected, or stopped reading for longer than the write timeout."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def response_headers(upstream: Mapping[str, str]) -> CIMultiDict[str]:
    """Upstream response headers minus hop-by-hop ones (aiohttp re-frames the body)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        if name.lower() not in HOP_BY_HOP:
            headers.add(name, value)
    return headers


class Downstream:
    """Owns the response to one client request."""

    def __init__(self, request: web.Request, write_timeout_s: float) -> None:
        self.request = request
        self.write_timeout_s = write_timeout_s
        self.response: web.StreamResponse | None = None
        self.status: int | None = None
        self.bytes_sent = 0

    @property
    def committed(self) -> bool:
        return self.response is not None

    @property
    def gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    async def commit(self, status: int, headers: Mapping[str, str]) -> None:
        """Send the status line and headers (once)."""
        if self.response is not None:
            return
        response = web.StreamResponse(status=status, headers=response_headers(headers))
        self.response = response
        self.status = status
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await response.prepare(self.request)
        except TimeoutError as exc:
            self.abort(hard=True)  # its buffer would never drain: drop the connection now
            raise ClientGone("client_write_timeout") from exc
        except ConnectionError as exc:
            raise ClientGone("client_disconnected") from exc

    async def write(self, data: bytes) -> None:
        """Write ``data``, waiting for the client to drain; raises :class:`ClientGone`."""
        assert self.response is not None
        if not data:
            return
        transport = self.request.transport
        if transport is None or transport.is_closing():
            raise ClientGone("client_disconnected")
        try:
            if transport.get_write_buffer_size() + len(data) < _NO_WAIT_BYTES:
                # Below the high-water mark the write cannot wait for the client: skip the
                # timer (it costs more than the write on the hot path).
                await self.response.write(data)
            else:
                async with asyncio.timeout(self.write_timeout_s):
                    await self.response.write(data)
        except TimeoutError as exc:
            self.abort(hard=True)  # its buffer would never drain: drop the connection now
            raise ClientGone("client_write_timeout") from exc
        except ConnectionError as exc:
            raise ClientGone("client_disconnected") from exc
        self.bytes_sent += len(data)

    async def end(self) -> None:
        """Finish the response normally (last chunk)."""
        assert self.response is not None
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await self.response.write_eof()
        except TimeoutError as exc:
            self.abort(hard=True)  # its buffer would never drain: drop the connection now
            raise ClientGone("client_write_timeout") from exc
        except ConnectionError as exc:
            raise ClientGone("client_disconnected") from exc

    def abort(self, *, hard: bool = False) -> None:
        """Terminate the response without its last chunk: the client sees a cut stream.

        ``hard`` discards what is still buffered (for a client that stopped reading);
        otherwise the bytes already written are flushed before the connection closes.
        """
        transport = self.request.transport
        if transport is not None:
            if hard:
                transport.abort()
            else:
                transport.close()

    async def send_error(self, status: int, kind: str, message: str) -> None:
        """An OpenAI-style JSON error, when nothing has been sent yet."""
        body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
        await self.commit(status, {"Content-Type": "application/json"})
        await self.write(body)
        await self.end()
