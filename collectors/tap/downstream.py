"""The client side of one proxied request: commit headers once, write with backpressure.

Bytes go straight to the client's transport as HTTP/1.1 chunks. A write returns at once
while the transport is below its high-water mark; above it, the write waits for the client
to drain (so a slow client holds the tap at most a buffer's worth of bytes per stream and
pushes back on the upstream through TCP). A client that accepts nothing for
``write_timeout_s`` is treated as gone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol

from pipeline.errors import LlmsloError

__all__ = ["HOP_BY_HOP", "ClientGone", "Downstream", "error_body", "http_date", "reason_phrase"]

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

#: Chunks at least this big are written as a gather list rather than copied into one frame.
_GATHER_FROM_BYTES = 16 * 1024

Headers = Mapping[str, str] | Iterable[tuple[str, str]]


class ClientConnection(Protocol):
    """What a :class:`Downstream` needs of the client's connection (the server's
    ``ClientConnection`` is one; a Protocol here so the two modules do not import each other)."""

    transport: asyncio.Transport | None
    closed: bool
    write_paused: bool  # the transport is above its high-water mark

    def close(self, *, hard: bool = False) -> None: ...

    async def drain(self) -> None: ...


class IncomingRequest(Protocol):
    """What a :class:`Downstream` needs of the request it answers."""

    @property
    def method(self) -> str: ...

    @property
    def http_version(self) -> str: ...

    @property
    def keep_alive(self) -> bool: ...


class ClientGone(LlmsloError):
    """The client disconnected, or stopped reading for longer than the write timeout."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Downstream:
    """Owns the response to one client request."""

    def __init__(
        self, conn: ClientConnection, request: IncomingRequest, write_timeout_s: float
    ) -> None:
        self.conn = conn
        self.request = request
        self.write_timeout_s = write_timeout_s
        self.status: int | None = None
        self.bytes_sent = 0
        self.committed = False
        self.finished = False  # the response ended (or was aborted)
        self.keep_alive = request.keep_alive  # the connection can serve another request
        self._chunked = False
        self._body_allowed = True
        self._head: bytes | None = None  # sent with the first body bytes: one write, one wake-up
        #: Headers the tap adds to whatever response is committed (degradation: economy mode).
        self.extra_headers: list[tuple[str, str]] = []

    @property
    def gone(self) -> bool:
        transport = self.conn.transport
        return self.conn.closed or transport is None or transport.is_closing()

    def commit(self, status: int, headers: Headers, *, content_length: int | None = None) -> None:
        """Set the status line and headers (once); they leave with the first body bytes
        (:meth:`write`, :meth:`end` or :meth:`abort`), in one write."""
        if self.committed:
            return
        if self.gone:
            raise ClientGone("client_disconnected")
        self.committed = True
        self.status = status
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        head = [f"HTTP/1.1 {status} {reason_phrase(status)}\r\n"]
        head.extend(f"{k}: {v}\r\n" for k, v in pairs if k.lower() not in HOP_BY_HOP)
        head.extend(f"{k}: {v}\r\n" for k, v in self.extra_headers)
        self._body_allowed = (
            status >= 200 and status not in (204, 304) and self.request.method != "HEAD"
        )
        if content_length is not None:
            head.append(f"Content-Length: {content_length}\r\n")
        elif self._body_allowed:
            if self.request.http_version == "1.1":
                self._chunked = True
                head.append("Transfer-Encoding: chunked\r\n")
            else:
                self.keep_alive = False  # an HTTP/1.0 body ends with the connection
        if not self.keep_alive:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        self._head = "".join(head).encode("latin-1", "replace")

    async def write(self, data: bytes) -> None:
        """Write ``data``; waits only while the client is behind. Raises :class:`ClientGone`."""
        self.write_nowait(data)
        await self._drain_if_paused()

    @property
    def behind(self) -> bool:
        """The client has not taken what was written (above the transport's high-water mark)."""
        return self.conn.write_paused

    async def wait_writable(self) -> None:
        """Wait until the client is no longer :attr:`behind`; raises :class:`ClientGone`."""
        await self._drain_if_paused()

    def write_nowait(self, data: bytes) -> None:
        """Write ``data`` without waiting (check :attr:`behind`). Raises :class:`ClientGone`."""
        if not data:
            return
        if self.gone:
            raise ClientGone("client_disconnected")
        if self._body_allowed:
            if not self._chunked:
                self._send(data)
            elif len(data) < _GATHER_FROM_BYTES:
                self._send(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self._send(b"%x\r\n" % len(data), data, b"\r\n")
        self.bytes_sent += len(data)

    async def end(self) -> None:
        """Finish the response normally (the last chunk)."""
        if self.gone:
            raise ClientGone("client_disconnected")
        self._send(b"0\r\n\r\n" if self._chunked else b"")
        self.finished = True
        await self._drain_if_paused()

    def abort(self, *, hard: bool = False) -> None:
        """Terminate the response without its last chunk: the client sees a cut stream.

        ``hard`` discards what is still buffered (for a client that stopped reading);
        otherwise the bytes already written are flushed before the connection closes.
        """
        self.finished = True
        self.keep_alive = False
        if self._head is not None and not hard:
            self._send(b"")  # the status line and headers the client is owed
        self.conn.close(hard=hard)

    async def send_error(self, status: int, kind: str, message: str) -> None:
        """An OpenAI-style JSON error, when nothing has been sent yet."""
        self.send_error_nowait(status, kind, message)
        await self._drain_if_paused()

    def send_error_nowait(
        self, status: int, kind: str, message: str, extra: Mapping[str, str] | None = None
    ) -> None:
        """:meth:`send_error` without waiting for the client to take it (``extra`` headers)."""
        body = error_body(status, kind, message)
        headers = {"Content-Type": "application/json", "Date": http_date(), **(extra or {})}
        self.commit(status, headers, content_length=len(body))
        self._send(body)
        self.bytes_sent += len(body)
        self.finished = True

    def _send(self, *parts: bytes) -> None:
        transport = self.conn.transport
        assert transport is not None
        if self._head is not None:
            parts, self._head = (self._head, *parts), None
        if len(parts) == 1:
            if parts[0]:
                transport.write(parts[0])
        elif sum(map(len, parts)) < _GATHER_FROM_BYTES:
            transport.write(b"".join(parts))
        else:
            transport.writelines(parts)

    async def _drain_if_paused(self) -> None:
        if not self.conn.write_paused:
            return
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await self.conn.drain()
        except TimeoutError as exc:
            self.abort(hard=True)  # its buffer would never drain: drop the connection now
            raise ClientGone("client_write_timeout") from exc
        if self.gone:
            raise ClientGone("client_disconnected")


def error_body(status: int, kind: str, message: str) -> bytes:
    """An OpenAI-style error object, as JSON bytes."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def http_date() -> str:
    """Now, as an HTTP ``Date`` value (for the answers the tap writes itself)."""
    return formatdate(usegmt=True)


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
