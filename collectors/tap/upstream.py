"""A lean HTTP/1.1 client for the measured path: one asyncio protocol per engine connection.

Why not aiohttp's client here: on a streamed completion every SSE event is one read from
the engine and one write to the client, and aiohttp's client spent more CPU per read (its
stream reader, a timeout re-armed on every read, a task hand-off per chunk) than the
measurement and the write together. On a shared core that CPU is queueing delay in every
other stream's first token. This client parses with httptools (llhttp, the parser behind
uvicorn), keeps one lazily re-armed read timer per connection, and hands body chunks to a
single waiting reader. Passthrough routes still use aiohttp.

Connections are kept alive and reused per origin (host, port, scheme) for
``keepalive_s``, which must stay below the engine's own idle timeout (uvicorn's default is
5 s). A request on a reused connection that fails within ``_IDLE_RACE_S`` of being sent,
before any answer byte, met the engine closing that idle connection: it is sent once more
on a fresh connection. That is the only replay this client ever does.

With ``clock`` given (and the platform able, and the upstream not TLS), connections are
:class:`~collectors.tap.rxstamp.StampedTransport`: every body chunk handed out carries the
kernel's receive time of its bytes (:attr:`UpstreamResponse.stamp`) instead of the time the
event loop read them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from collectors.tap.http1 import HeadLimit
from collectors.tap.rxstamp import StampedTransport, kernel_stamps_available, open_stamped
from pipeline.errors import LlmsloError

__all__ = [
    "ConnectFailed",
    "ConnectTimeout",
    "ReadTimeout",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamReset",
    "UpstreamResponse",
]

#: Response body bytes buffered for a reader that is not reading (a slow client) before
#: the socket stops being read, so TCP pushes back on the engine.
_PAUSE_ABOVE_BYTES = 256 * 1024

#: A kept-alive connection that fails this soon after a request was written, before any
#: answer byte, was closed by the engine while idle (the FIN was in flight): the request
#: is sent once more. Later, the engine may have read and worked on it: no replay.
_IDLE_RACE_S = 0.05


class UpstreamError(LlmsloError):
    """The engine could not be reached or broke the exchange."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, or a TLS failure."""


class ConnectTimeout(UpstreamError):
    """No connection within ``connect_timeout_s``."""


class ReadTimeout(UpstreamError):
    """The engine sent nothing for ``read_timeout_s`` while an answer was due."""


class UpstreamReset(UpstreamError):
    """The connection closed or reset mid-exchange, or the response was not valid HTTP."""


@dataclass(frozen=True)
class _Origin:
    host: str
    port: int
    tls: bool
    host_header: str

    @classmethod
    def from_url(cls, base_url: str) -> _Origin:
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        default = port == (443 if tls else 80)
        name = f"[{host}]" if ":" in host else host
        return cls(host, port, tls, name if default else f"{name}:{port}")


class UpstreamResponse:
    """The engine's answer to one request: status and headers, then the body as it comes.

    Read with :meth:`readany` until it returns ``b""``; then :meth:`release` returns the
    connection for reuse. :meth:`close` drops the connection at once (the engine sees the
    client leave).
    """

    __slots__ = ("_conn", "headers", "status")

    @property
    def stamp(self) -> tuple[float, float] | None:
        """When the bytes last handed out (by :meth:`readany` or to :meth:`pipe`'s
        callback) reached the socket, on the client's ``clock``, and how much earlier they
        may have (seconds); ``None`` without a kernel stamp."""
        return self._conn.stamp

    def __init__(self, conn: _Connection, status: int, headers: list[tuple[str, str]]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers

    async def readany(self) -> bytes:
        """The body bytes received since the last read (waits for some); ``b""`` at the end.

        Raises :class:`ReadTimeout` or :class:`UpstreamReset` once the bytes received
        before the failure have been read.
        """
        return await self._conn.read()

    async def pipe(self, on_chunk: Callable[[bytes], bool]) -> bool:
        """Hand body chunks to ``on_chunk`` as they arrive, from the connection's data
        callback: no task hand-off per chunk. ``on_chunk`` returns ``True`` when its
        consumer is behind; reading then pauses and this returns ``True`` (call again once
        the consumer caught up). Returns ``False`` at the end of the body; raises what
        :meth:`readany` raises, or what ``on_chunk`` raised.
        """
        return await self._conn.pipe(on_chunk)

    def at_eof(self) -> bool:
        """The whole body has been received and read."""
        return self._conn.body_complete and not self._conn.chunks

    def release(self) -> None:
        """Give the connection back for reuse (closes it unless the body was read whole)."""
        self._conn.client.release(self._conn)

    def close(self) -> None:
        """Close the connection now; the engine sees its client leave."""
        self._conn.abort()


class _Connection(asyncio.Protocol):
    """One connection to an engine; one request at a time. Parser callbacks are httptools'."""

    def __init__(self, client: UpstreamClient, origin: _Origin) -> None:
        self.client = client
        self.origin = origin
        self.loop = client.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_timer: asyncio.TimerHandle | None = None
        self.sent_at = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._head_limit = HeadLimit()
        self._paused = False  # reading paused: the consumer is behind
        #: the kernel stamp of the bytes last handed out: (arrival_s, error_s) or None
        self.stamp: tuple[float, float] | None = None
        self._stamped: StampedTransport | None = None
        self._rx: tuple[float, float] | None = None  # the current read's (arrival, earliest)
        self._batch_earliest: float | None = None  # the earliest arrival of buffered bytes
        self._reset_exchange()

    def _reset_exchange(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.body_complete = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.response_bytes = 0
        self._head_limit.next_head()
        self._head: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._pipe: Callable[[bytes], bool] | None = None
        self._until_close = False  # body framed by the end of the connection
        self._head_only = False
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ request
    async def send(self, raw_request: bytes, *, head_only: bool) -> UpstreamResponse:
        """Write the request; return once the response head is in. ``head_only``: the
        answer has no body whatever its headers say (a HEAD request)."""
        assert self.transport is not None
        self._reset_exchange()
        self._head_only = head_only
        self._head = self.loop.create_future()
        self.transport.write(raw_request)
        self.sent_at = self.loop.time()
        self._arm_read_timer()
        try:
            await self._head
        except BaseException:
            self.abort()  # cancelled (the client left) or failed: the engine must see it
            raise
        return UpstreamResponse(self, self.status, self.headers)

    async def read(self) -> bytes:
        chunks = self.chunks
        if not chunks:
            if self.body_complete:
                return b""
            if self.error is not None:
                raise self.error
            self._resume()  # a pipe() that fell behind may have left the socket paused
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
            if not chunks:
                if self.error is not None and not self.body_complete:
                    raise self.error
                return b""
        data = self._take_buffered()
        self._resume()
        return data

    async def pipe(self, on_chunk: Callable[[bytes], bool]) -> bool:
        if self.chunks and on_chunk(self._take_buffered()):
            return True
        if self.body_complete:
            return False
        if self.error is not None:
            raise self.error
        self._resume()
        self._pipe = on_chunk
        self._waiter = self.loop.create_future()
        try:
            return await self._waiter
        finally:
            self._pipe = None
            self._waiter = None

    def _take_buffered(self) -> bytes:
        chunks = self.chunks
        rx, earliest = self._rx, self._batch_earliest
        # buffered bytes span the reads since the first one buffered: the latest stamp,
        # back to the earliest arrival of any of them
        self.stamp = None if rx is None or earliest is None else (rx[0], rx[0] - earliest)
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        return data

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and not self.closed:
            self._paused = False
            assert self.transport is not None
            self.transport.resume_reading()
            self._arm_read_timer()

    @property
    def reusable(self) -> bool:
        """The answer was read whole, the engine keeps the connection, and it is in step."""
        return (
            self.body_complete
            and self.keep_alive
            and not self.chunks
            and not self._paused
            and not self.closed
        )

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.abort()
        self._gone(None)

    # ------------------------------------------------------------------ read timeout
    def _arm_read_timer(self) -> None:
        # One timer per connection, re-armed lazily: a read only stores its time, and the
        # timer, when it fires early, reschedules itself for the last read + the timeout.
        self._last_read = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_at(
                self._last_read + self.client.read_timeout_s, self._read_timer_fired
            )

    def _read_timer_fired(self) -> None:
        self._timer = None
        if self.body_complete or self.closed or self._paused:
            return  # nothing due, or the reader is the slow side (its own timeout applies)
        due = self._last_read + self.client.read_timeout_s
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._read_timer_fired)
            return
        self._fail(ReadTimeout(f"no answer for {self.client.read_timeout_s:g} s"))
        self.abort()

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if isinstance(transport, StampedTransport):
            self._stamped = transport

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        stamped = self._stamped
        if stamped is not None:
            arrival = stamped.arrival_s
            if arrival is None:
                self._rx = None
                self._batch_earliest = None
            else:
                earliest = arrival - stamped.error_s
                self._rx = (arrival, earliest)
                if not self.chunks or self._batch_earliest is None:
                    self._batch_earliest = earliest
        if self._head is None or self.body_complete:
            # Bytes after the answer ended (or on an idle connection): the connection is out
            # of step with the engine and must never carry another request.
            self.abort()
            return
        self.response_bytes += len(data)
        problem = None
        try:
            if not self._head_limit.feed(self._parser, data):
                problem = f"invalid HTTP response: head over {self._head_limit.limit} bytes"
        except httptools.HttpParserUpgrade:
            problem = "the engine switched protocols"
        except httptools.HttpParserError as exc:
            problem = f"invalid HTTP response: {exc.__context__ or exc}"
        if problem is not None:
            self._fail(UpstreamReset(problem))
        if problem is not None or self.error is not None:
            self.keep_alive = False  # even after a complete answer: the parser is broken
            self.abort()

    def eof_received(self) -> bool:
        if self._until_close and self._head is not None and self._head.done():
            self.on_message_complete()  # a body without length ends with the connection
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(exc)

    def _gone(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.body_complete:
            reason = f": {exc}" if exc else ""
            self._fail(UpstreamReset(f"connection closed before the response ended{reason}"))
        self.client.forget(self)

    # ------------------------------------------------------------------ httptools callbacks
    def on_message_begin(self) -> None:
        if self.body_complete:
            self.keep_alive = False  # a second answer to one request (e.g. a 204 with a body)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._head_limit.head_done()
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self.headers = []  # an interim response (100 Continue, 103 Early Hints)
            return
        self.status = status
        lowered = {name.lower() for name, _ in self.headers}
        self._until_close = (
            "content-length" not in lowered
            and "transfer-encoding" not in lowered
            and status not in (204, 304)
        )
        if self._head is not None and not self._head.done():
            self._head.set_result(None)
        if self._head_only:
            # httptools cannot be told to skip a body: end the exchange here (and never
            # reuse the connection: its parser would read the next answer as this body).
            self.on_message_complete()

    def on_body(self, body: bytes) -> None:
        waiter = self._waiter
        if self._pipe is not None and waiter is not None and not waiter.done():
            rx = self._rx
            self.stamp = None if rx is None else (rx[0], rx[0] - rx[1])
            try:
                behind = self._pipe(body)
            except Exception as exc:  # the consumer's error goes to its task, not the loop
                self._pipe = None
                self._pause()
                waiter.set_exception(exc)
                return
            if behind:
                self._pipe = None
                self._pause()
                waiter.set_result(True)
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if waiter is not None and not waiter.done():
            waiter.set_result(False)
        if self.buffered > _PAUSE_ABOVE_BYTES:
            self._pause()

    def on_message_complete(self) -> None:
        if self.status == 0:
            return  # the end of an interim response
        self.body_complete = True
        self.keep_alive = (
            not (self._until_close or self._head_only) and self._parser.should_keep_alive()
        )
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(False)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.body_complete:
            self.error = error
        for future in (self._head, self._waiter):
            if future is not None and not future.done():
                future.set_exception(error)


class UpstreamClient:
    """Connections to the engines: opened on demand, kept alive, at most ``max_connections``.

    Create inside the running event loop; :meth:`close` drops every connection.
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        keepalive_s: float = 4.0,
        clock: Callable[[], float] | None = None,
        late_s: Callable[[float], float | None] | None = None,
    ) -> None:
        """``clock`` (monotonic seconds) turns on kernel receive stamps on that clock where
        the platform has them; ``late_s(now)`` is the loop's read-delay bound that checks
        and narrows them (``LoopWatch.late_s``)."""
        self.loop = asyncio.get_running_loop()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._tls: ssl.SSLContext | None = None
        self._closing = False
        self._clock = clock if kernel_stamps_available() else None
        self._late_s = late_s or (lambda _now_s: None)

    async def request(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> UpstreamResponse:
        """Send one request to the engine at ``base_url``; return its response head."""
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = _Origin.from_url(base_url)
        raw = _encode_request(method, target, origin.host_header, headers, body)
        conn = await self._acquire(origin, reuse=True)
        if conn.reused:
            try:
                return await conn.send(raw, head_only=method == "HEAD")
            except UpstreamReset:
                if conn.response_bytes or self.loop.time() - conn.sent_at > _IDLE_RACE_S:
                    raise
                # The engine closed the kept-alive connection while it was idle (its timeout
                # raced ours): the request was never read, so send it once more, fresh.
            conn = await self._acquire(origin, reuse=False)
        return await conn.send(raw, head_only=method == "HEAD")

    def release(self, conn: _Connection) -> None:
        """Keep ``conn`` for the next request, or close it if it cannot be reused."""
        if conn.closed:
            return
        if not conn.reusable or self._closing:
            conn.abort()
            return
        conn.reused = True
        conn.idle_timer = self.loop.call_later(self.keepalive_s, conn.abort)
        self._idle.setdefault(conn.origin, []).append(conn)
        self._wake_slot_waiter()

    def forget(self, conn: _Connection) -> None:
        """``conn`` closed: free its slot."""
        self._open.discard(conn)
        if conn.idle_timer is not None:
            conn.idle_timer.cancel()
            conn.idle_timer = None
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_slot_waiter()

    async def close(self) -> None:
        self._closing = True
        for conn in list(self._open):
            conn.abort()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------------ internals
    def _take_idle(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have expired
            if conn.idle_timer is not None:
                conn.idle_timer.cancel()
                conn.idle_timer = None
            if not conn.closed:
                return conn
        return None

    async def _acquire(self, origin: _Origin, *, reuse: bool) -> _Connection:
        """A kept-alive connection to ``origin`` (if ``reuse``), else a new one within the cap."""
        while True:
            if reuse and (conn := self._take_idle(origin)) is not None:
                return conn
            if len(self._open) < self.max_connections:
                return await self._connect(origin)
            if not self._evict_one_idle():  # idle connections elsewhere give way first
                waiter = self.loop.create_future()
                self._slot_waiters.append(waiter)
                try:
                    await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():
                        self._wake_slot_waiter()  # woken, then cancelled: pass the slot on
                    raise
                finally:
                    if waiter in self._slot_waiters:
                        self._slot_waiters.remove(waiter)

    async def _connect(self, origin: _Origin) -> _Connection:
        conn = _Connection(self, origin)
        self._open.add(conn)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self._clock is not None and not origin.tls:
                    await open_stamped(
                        self.loop, conn, origin.host, origin.port, self._clock, self._late_s
                    )
                    return conn
                await self.loop.create_connection(
                    lambda: conn,
                    origin.host,
                    origin.port,
                    ssl=self._tls_context() if origin.tls else None,
                    server_hostname=origin.host if origin.tls else None,
                )
        except TimeoutError as exc:
            conn.abort()
            raise ConnectTimeout(
                f"no connection to {origin.host_header} in {self.connect_timeout_s:g} s"
            ) from exc
        except (OSError, ssl.SSLError) as exc:
            conn.abort()
            raise ConnectFailed(f"cannot connect to {origin.host_header}: {exc}") from exc
        except BaseException:
            conn.abort()
            raise
        return conn

    def _evict_one_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                idle[0].abort()  # the oldest; abort() removes it from the pool
                return True
        return False

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls


#: Methods whose requests carry no ``Content-Length`` when they have no body (RFC 9110 §8.6).
_BODILESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})


def _encode_request(
    method: str, target: str, host: str, headers: list[tuple[str, str]], body: bytes
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    for name, value in headers:
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}\r\n")
    if body or method not in _BODILESS_METHODS:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append("\r\n")
    # surrogateescape gives back the exact bytes aiohttp's server decoded the headers from
    return "".join(lines).encode("utf-8", "surrogateescape") + body
