"""A plain-TCP transport whose reads carry the kernel's receive time (``SO_TIMESTAMPNS``).

Why a transport of its own: an asyncio transport hands ``data_received`` the bytes but not
*when* they arrived, and the moment the callback runs is the moment the event loop got
round to it. On a busy node (a CPU hog, a GC pause, the tap descheduled) that is tens of
milliseconds after the engine sent them, and an ITL gap taken from it measures the tap,
not the engine. With ``SO_TIMESTAMPNS`` the kernel stamps every received segment
(``CLOCK_REALTIME``, ns) as it is queued, and ``recvmsg`` returns the stamp of the newest
segment it read as ancillary data. :class:`StampedTransport` reads with ``recvmsg_into``
from a ``loop.add_reader`` callback and tells its protocol how late the read was
(``lag_s`` = now − stamp, both on the realtime clock, so no clock offset is involved); the
caller subtracts that from its own monotonic clock, so TTFT, gaps and E2E stay on one clock.

What the stamp cannot say: TCP coalesces queued segments, and one read returns the stamp of
the newest. Bytes of several engine writes read at once (the loop was late by more than
one gap) share that stamp; :mod:`collectors.tap.timing` flags such requests.

Linux only (``SO_TIMESTAMPNS``); :func:`kernel_stamps_available` says whether it
applies. TLS upstreams keep the loop's own transport (the stamp of the ciphertext is not
the plaintext's), measured on the loop clock and guarded by the loop-lag monitor instead.
"""

from __future__ import annotations

import asyncio
import errno
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["StampedProtocol", "StampedTransport", "kernel_stamps_available", "open_stamped"]

#: CPython's socket module does not name it; asm-generic Linux (x86-64, arm64) says 35
#: (``SO_TIMESTAMPNS_OLD``, a 64-bit ``struct timespec`` on 64-bit kernels). Other
#: architectures number socket options differently: no stamps there unless Python names it.
_GENERIC_LINUX = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
_SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if _GENERIC_LINUX else None)
_SCM_TIMESTAMPNS: int | None = getattr(socket, "SCM_TIMESTAMPNS", _SO_TIMESTAMPNS)
_TIMESPEC = struct.Struct("@qq")
#: Room for one ``struct timespec`` control message (and a spare).
_ANC_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) * 2 if hasattr(socket, "CMSG_SPACE") else 0
#: One read takes at most this much (one SSE event is ~200 bytes; a burst is a few KB).
_READ_BYTES = 64 * 1024
_RETRY = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)


def kernel_stamps_available() -> bool:
    """Whether this platform offers per-read kernel receive timestamps on TCP sockets."""
    return _SO_TIMESTAMPNS is not None and _ANC_BYTES > 0 and hasattr(socket.socket, "recvmsg_into")


class StampedProtocol(Protocol):
    """What :class:`StampedTransport` calls: an ``asyncio.Protocol`` plus ``read_lag_s``."""

    read_lag_s: float

    def connection_made(self, transport: Any) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def eof_received(self) -> bool | None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


class StampedTransport:
    """The subset of ``asyncio.Transport`` the upstream client uses, on a non-blocking socket.

    Before each ``data_received`` it sets ``protocol.read_lag_s``: seconds between the
    kernel receiving the newest byte of this read and this read (0.0 when a read carried
    no stamp). One ``recvmsg_into`` per readiness callback; writes go straight to the
    socket and only the remainder waits for writability.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._buffer = bytearray(_READ_BYTES)
        self._view = memoryview(self._buffer)
        self._pending = bytearray()
        self._reading = False
        self._closing = False
        self._realtime: Callable[[], float] = time.time
        protocol.connection_made(self)
        self.resume_reading()

    # ------------------------------------------------------------------ reading
    def _on_readable(self) -> None:
        try:
            n, ancdata, _flags, _addr = self._sock.recvmsg_into((self._view,), _ANC_BYTES)
        except OSError as exc:
            if exc.errno in _RETRY:
                return
            self._fatal(exc)
            return
        if n == 0:
            self._stop_reading()
            keep_open = self._protocol.eof_received()
            if not keep_open:
                self.close()
            return
        lag = 0.0
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == _SCM_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(data)
                lag = max(self._realtime() - (sec + nsec * 1e-9), 0.0)
        self._protocol.read_lag_s = lag
        self._protocol.data_received(bytes(self._view[:n]))

    def pause_reading(self) -> None:
        self._stop_reading()

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    # ------------------------------------------------------------------ writing
    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        if not self._pending:
            try:
                sent = self._sock.send(data)
            except OSError as exc:
                if exc.errno not in _RETRY:
                    self._fatal(exc)
                    return
                sent = 0
            if sent == len(data):
                return
            self._pending += data[sent:]
            self._loop.add_writer(self._fd, self._on_writable)
        else:
            self._pending += data

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except OSError as exc:
            if exc.errno not in _RETRY:
                self._fatal(exc)
            return
        del self._pending[:sent]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    # ------------------------------------------------------------------ closing
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        self._close(None)

    def _fatal(self, exc: Exception) -> None:
        self._close(exc)

    def _close(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._stop_reading()
        if self._pending:
            self._loop.remove_writer(self._fd)
            self._pending.clear()
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default


async def open_stamped(
    loop: asyncio.AbstractEventLoop, host: str, port: int, protocol: StampedProtocol
) -> StampedTransport:
    """Connect to ``host:port`` with kernel receive stamps on; raises ``OSError``."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    error: OSError | None = None
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            assert _SO_TIMESTAMPNS is not None
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return StampedTransport(loop, sock, protocol)
    raise error or OSError(f"no address for {host}:{port}")
