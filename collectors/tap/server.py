"""The tap's HTTP/1.1 server: one asyncio protocol per client connection, httptools' parser.

Why not aiohttp's server: on a streamed completion every SSE event becomes one write to
the client, and aiohttp's response writer and request machinery cost more CPU per request
and per event than the measurement itself; on a shared core that CPU is queueing delay in
every other stream's first token. This server parses with httptools (llhttp, as uvicorn
does) and writes chunked frames straight to the transport.

One request per connection runs at a time: while it runs, the socket is not read beyond
the next pipelined request. The handler runs as a task that is cancelled when the client disconnects, which is how the
proxy closes the upstream at once. Bad requests get a 4xx and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote

import httptools
from multidict import CIMultiDict

from collectors.tap.downstream import (
    ClientGone,
    Downstream,
    error_body,
    http_date,
    reason_phrase,
)
from collectors.tap.http1 import HeadLimit
from pipeline.errors import LlmsloError

__all__ = ["IncomingRequest", "TapServer"]

log = logging.getLogger(__name__)

#: After refusing a request, how long what the client still sends is read and dropped.
_LINGER_S = 1.0


@dataclass(frozen=True)
class IncomingRequest:
    """A whole client request (the body is read before the handler runs; its size is capped)."""

    method: str
    path: str
    path_qs: str
    headers: CIMultiDict[str]
    body: bytes
    keep_alive: bool
    http_version: str


Handler = Callable[[IncomingRequest, Downstream], Awaitable[None]]


class TapServer:
    """Serves ``handler`` on ``host:port``; :meth:`close` stops accepting and drops clients.

    Timeouts (seconds): ``idle_timeout_s`` between bytes while a request is awaited;
    ``head_timeout_s`` for a whole request head from its first byte and ``body_timeout_s``
    for a whole body from the end of its head: totals that bytes trickling in one at a time
    cannot extend (the client gets a 408 and the connection closes).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        write_timeout_s: float,
        idle_timeout_s: float,
        head_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.write_timeout_s = write_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.connections: set[ClientConnection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int, *, backlog: int = 1024) -> int:
        """Bind and serve; returns the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self), host, port, backlog=backlog, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, grace_s: float) -> None:
        """Stop accepting; let running requests finish for up to ``grace_s``; drop the rest."""
        if self._server is not None:
            self._server.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for conn in list(self.connections):
            conn.close(hard=True)  # what is still unsent after the grace period is dropped
        if self._server is not None:
            await self._server.wait_closed()


class ClientConnection(asyncio.Protocol):
    """One client connection: parses its requests, runs the handler, owns the transport."""

    def __init__(self, server: TapServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._head_limit = HeadLimit()
        self._refused = False  # answered with a 4xx/5xx of its own; closing
        self._pending: deque[IncomingRequest] = deque()
        self._last_activity = self.loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._read_deadline: float | None = None  # the request being read must be in by then
        self._start_request()

    def _start_request(self) -> None:
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._body_bytes = 0

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.server.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        self._last_activity = self.loop.time()
        if self._refused:
            return  # lingering after a refusal: dropped unread
        try:
            if not self._head_limit.feed(self._parser, data):
                self._refuse(431, "request head too large")
        except httptools.HttpParserUpgrade:
            self._refuse(501, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            refused = exc.__context__  # raised in one of the callbacks below
            if isinstance(refused, _Refused):
                self._refuse(refused.status, refused.message)
            else:
                self._refuse(400, f"malformed request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the handler sees the client leave (and closes the upstream)
        self._wake_writer()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()

    # ------------------------------------------------------------------ httptools callbacks
    def on_message_begin(self) -> None:
        self._start_request()
        self._set_read_deadline(self.server.head_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Exact bytes survive the round trip to the engine (upstream encodes back the same).
        self._headers.append(
            (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        self._head_limit.head_done()
        self._set_read_deadline(self.server.body_timeout_s)
        if self._parser.should_upgrade():
            raise _Refused(501, "protocol upgrades are not supported")
        length = next((v for k, v in self._headers if k.lower() == "content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.server.max_body_bytes:
            raise _Refused(413, f"request body over {self.server.max_body_bytes} bytes")
        expects = next((v for k, v in self._headers if k.lower() == "expect"), "")
        # Not while another response is being written (it would land inside that body): a
        # pipelining client then sends the body after its own wait, as RFC 9110 §10.1.1 has.
        if expects.lower() == "100-continue" and self.task is None and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.server.max_body_bytes:
            raise _Refused(413, f"request body over {self.server.max_body_bytes} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._head_limit.next_head()
        self._read_deadline = None
        url = httptools.parse_url(self._url) if not self._url.startswith(b"/") else None
        raw_target = self._url.decode("utf-8", "surrogateescape")
        if url is not None:  # absolute form: forward its origin form
            path = (url.path or b"/").decode("utf-8", "surrogateescape")
            query = url.query.decode("utf-8", "surrogateescape") if url.query else ""
            raw_target = f"{path}?{query}" if query else path
        path = unquote(raw_target.partition("?")[0])  # routes match /v1/chat/%63ompletions too
        request = IncomingRequest(
            method=self._parser.get_method().decode("ascii"),
            path=path,
            path_qs=raw_target,
            headers=CIMultiDict(self._headers),
            body=b"".join(self._body),
            keep_alive=self._parser.should_keep_alive(),
            http_version=self._parser.get_http_version(),
        )
        self._pending.append(request)
        if self.task is None:
            self._next_request()
        elif self.transport is not None:
            self.transport.pause_reading()  # one request waits; its successors stay unread

    # ------------------------------------------------------------------ requests
    def _next_request(self) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            self._pending.clear()  # the previous response ended the connection
            self.task = None
            return
        if not self._pending:
            self.task = None
            self.transport.resume_reading()
            self._arm_idle_timer()
            return
        request = self._pending.popleft()
        down = Downstream(self, request, self.server.write_timeout_s)
        self.task = self.loop.create_task(self._run(request, down))

    async def _run(self, request: IncomingRequest, down: Downstream) -> None:
        try:
            await self.server.handler(request, down)
        except (asyncio.CancelledError, ClientGone):
            pass  # the client left: the handler has recorded it
        except Exception:
            log.exception("tap handler failed on %s %s", request.method, request.path)
            if not down.committed and not down.gone:
                down.send_error_nowait(500, "tap_error", "the tap failed on this request")
        finally:
            if not down.finished:
                down.abort()  # the handler left the response open: it cannot be reused
            if not (request.keep_alive and down.keep_alive):
                self.close()
            self._next_request()

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request the tap will not read (bad, too big) and close the connection.

        A lingering close, as nginx does: the answer and our FIN go out, what the client
        still sends is read and dropped for up to ``_LINGER_S``, then the socket closes.
        Closing at once with unread bytes would make the kernel reset the connection and
        the client would most likely never see the answer.
        """
        transport = self.transport
        if self.task is not None or transport is None or self.closed or self._refused:
            self.close()
            return
        self._refused = True
        body = error_body(status, "invalid_request", message)
        transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Date: %s\r\nConnection: close\r\n\r\n%s"
            % (status, reason_phrase(status).encode(), len(body), http_date().encode(), body)
        )
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(_LINGER_S, self.close)
        else:
            self.close()

    # ------------------------------------------------------------------ writing
    async def drain(self) -> None:
        """Wait until the client has taken enough of the written bytes (caller times out)."""
        while self.write_paused and not self.closed:
            waiter = self.loop.create_future()
            self._drain_waiter = waiter
            try:
                await waiter
            finally:
                self._drain_waiter = None

    def _wake_writer(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self, *, hard: bool = False) -> None:
        """Close (flushing what is written, unless ``hard``)."""
        if self.transport is not None and not self.transport.is_closing():
            if hard:
                self.transport.abort()
            else:
                self.transport.close()

    # ------------------------------------------------------------------ idle timeout
    def _arm_idle_timer(self) -> None:
        # Waiting for (the rest of) a request: one timer, re-armed lazily from the last byte.
        self._last_activity = self.loop.time()
        if self._idle_timer is None and not self.closed:
            self._idle_timer = self.loop.call_at(
                self._last_activity + self.server.idle_timeout_s, self._idle_timer_fired
            )

    def _set_read_deadline(self, within_s: float) -> None:
        # A total for the head (or the body) being read: unlike the idle time, bytes that
        # trickle in do not move it. The one timer is brought forward if it is due later.
        due = self._read_deadline = self.loop.time() + within_s
        timer = self._idle_timer
        if timer is not None and timer.when() <= due:
            return
        if timer is not None:
            timer.cancel()
        self._idle_timer = self.loop.call_at(due, self._idle_timer_fired)

    def _idle_timer_fired(self) -> None:
        self._idle_timer = None
        if self.closed or self.task is not None:
            return  # a request is being answered; the timer is re-armed after it
        now, deadline = self.loop.time(), self._read_deadline
        if deadline is not None and now >= deadline:
            self._refuse(408, "the request did not arrive in time")
            return
        due = self._last_activity + self.server.idle_timeout_s
        if deadline is not None:
            due = min(due, deadline)
        if now < due:
            self._idle_timer = self.loop.call_at(due, self._idle_timer_fired)
            return
        self.close()


class _Refused(LlmsloError):
    """A request the tap answers itself with ``status`` and closes (raised while parsing)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message
