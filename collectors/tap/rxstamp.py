"""Kernel receive timestamps for the engine's bytes: when they reached the socket, not when
the tap's event loop got round to reading them.

Linux stamps every received packet (``SO_TIMESTAMPNS``); ``recvmsg`` hands the stamp of the
last packet a read consumed as ``SCM_TIMESTAMPNS`` ancillary data (a ``struct timespec`` on
``CLOCK_REALTIME``). asyncio's and uvloop's transports call ``recv`` and drop it, so
:class:`StampedTransport` is a transport of its own: a non-blocking socket read with
``recvmsg`` from ``loop.add_reader``, the subset of :class:`asyncio.Transport` the engine
client uses (``write``, ``pause_reading``, ``resume_reading``, ``abort``).

**One clock.** The tap's figures are on its monotonic clock (``clock``, the one t₀, TTFT,
ITL and E2E are taken on). A realtime stamp is never compared with a monotonic reading:
right after the read the transport takes ``CLOCK_REALTIME`` and the monotonic clock
together, and the bytes' age ``realtime now − stamp`` (a difference of two realtime readings
microseconds to milliseconds apart, which NTP's slewing cannot move by more than 0.05 %) is
subtracted from the monotonic reading. A stamp whose age is negative or longer than the
loop's own lateness bound allows (the wall clock was stepped in between, or the stamp is
not what we think it is) is not used: those bytes fall back to the loop-lag bound.

**Bytes coalesced into one read share its stamp.** The stamp is the *last* packet's; a read
that completed two or more SSE events (a burst the engine sent while the loop was busy, or
events that left the engine back to back) stamps them all with it, although the earlier
ones may have arrived as early as just after the previous read. Such a read's bound is its
stamp − the later of the previous read's stamp and the earliest arrival the loop-lag bound
allows (``now − late_s``) — only the latter after a read that filled its buffer and may
have left earlier bytes queued; a read that completed at most one event is exact (its bound is
:data:`STAMP_ERROR_S`, the two clock readings' spacing). Events are counted by their blank
line terminators (``\\n\\n``, ``\\r\\n\\r\\n``), which over-counts (a keep-alive comment is
an event too) and so never under-states a bound.

Where the option is missing (not Linux, or an architecture whose ``SO_TIMESTAMPNS`` number
is not the generic 35) or the upstream is TLS (the bytes are decrypted by the ``ssl``
module's transport, which reads the socket itself), the engine client uses the loop's own
transport and every chunk keeps the loop-lag bound of :mod:`collectors.tap.loopwatch`.
"""

from __future__ import annotations

import asyncio
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["STAMP_ERROR_S", "StampedTransport", "kernel_stamps_available", "open_stamped"]

#: ``SO_TIMESTAMPNS`` (= ``SCM_TIMESTAMPNS``) in the generic Linux ABI; Python does not
#: export it. parisc, sparc and alpha number their socket options differently.
_SO_TIMESTAMPNS = 35
#: ``struct timespec`` of the old (native ``long``) stamp: what ``SO_TIMESTAMPNS`` gives.
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
#: Bytes asked of one read (the loop's own transports read 64–256 KiB).
_READ_BYTES = 65536
#: The error of an exact stamp on the tap's monotonic clock: the spacing of the two clock
#: readings after the read, plus the stamp's own resolution (seconds).
STAMP_ERROR_S = 20e-6
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n")


def kernel_stamps_available() -> bool:
    """This platform stamps received packets and hands the stamps to ``recvmsg``."""
    if sys.platform != "linux" or not _ANCILLARY_BYTES:
        return False
    return not platform.machine().lower().startswith(("parisc", "sparc", "alpha", "mips"))


class StampedTransport:
    """A TCP socket read with ``recvmsg``, feeding ``protocol``; each read's arrival time
    (:attr:`arrival_s`, on ``clock``) and its error bound (:attr:`error_s`, one-sided: the
    bytes arrived within ``error_s`` before ``arrival_s``) are set before
    ``protocol.data_received`` is called. ``arrival_s`` is ``None`` for a read without a
    usable stamp. ``late_s(now)`` is the loop's read-delay bound (``LoopWatch.late_s``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.Protocol,
        clock: Callable[[], float],
        late_s: Callable[[float], float | None],
    ) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._clock = clock
        self._late_s = late_s
        self._out = bytearray()
        self._reading = False
        #: the last read's arrival on ``clock`` (seconds); ``None`` without a usable stamp
        self.arrival_s: float | None = None
        #: how much earlier than :attr:`arrival_s` the last read's bytes may have arrived
        self.error_s = 0.0
        #: the previous stamped read's arrival, while that read drained the socket (a
        #: full read may have left bytes that arrived before its stamp)
        self._previous_s: float | None = None
        protocol.connection_made(self)  # type: ignore[arg-type]
        self.resume_reading()

    # ------------------------------------------------------------------ transport subset
    def write(self, data: bytes) -> None:
        sock = self._sock
        if sock is None or not data:
            return
        if not self._out:
            try:
                sent = sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._lost(exc)
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._out += data

    def pause_reading(self) -> None:
        if self._reading and self._sock is not None:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and self._sock is not None:
            self._reading = True
            self._loop.add_reader(self._fd, self._read_ready)

    def is_closing(self) -> bool:
        return self._sock is None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return self._sock
        return default

    def abort(self) -> None:
        self._lost(None)

    def close(self) -> None:
        self._lost(None)

    # ------------------------------------------------------------------ internals
    def _write_ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def _read_ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data, ancillary, _flags, _addr = sock.recvmsg(_READ_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        now_s = self._clock()
        real_ns = time.time_ns()
        if not data:
            self._protocol.eof_received()
            self._lost(None)
            return
        self._stamp(data, ancillary, now_s, real_ns)
        self._protocol.data_received(data)

    def _stamp(
        self, data: bytes, ancillary: list[tuple[int, int, bytes]], now_s: float, real_ns: int
    ) -> None:
        stamp_ns = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                stamp_ns = seconds * 1_000_000_000 + nanoseconds
        late = self._late_s(now_s)
        age_s = (real_ns - stamp_ns) / 1e9 if stamp_ns is not None else -1.0
        # an age beyond the loop's lateness (plus the clocks' spacing) is a stepped clock
        if age_s < 0.0 or (late is not None and age_s > late + 0.001):
            self.arrival_s = None
            return
        arrival = now_s - age_s
        events = data.count(_EVENT_ENDS[0]) + data.count(_EVENT_ENDS[1])
        if events >= 2:
            earliest = self._previous_s
            if late is not None and (earliest is None or now_s - late > earliest):
                earliest = now_s - late
            if earliest is None:  # nothing bounds the earlier events: no stamp
                self.arrival_s = None
                return
            self.error_s = max(arrival - earliest, STAMP_ERROR_S)
        else:
            self.error_s = STAMP_ERROR_S
        self.arrival_s = arrival
        self._previous_s = arrival if len(data) < _READ_BYTES else None

    def _lost(self, exc: Exception | None) -> None:
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        if self._reading:
            self._loop.remove_reader(self._fd)
        if self._out:
            self._loop.remove_writer(self._fd)
            self._out.clear()
        sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)


async def open_stamped(
    loop: asyncio.AbstractEventLoop,
    protocol: asyncio.Protocol,
    host: str,
    port: int,
    clock: Callable[[], float],
    late_s: Callable[[float], float | None],
) -> StampedTransport:
    """Connect to ``host:port`` (the first address that answers) and return the transport."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return StampedTransport(loop, sock, protocol, clock, late_s)
    raise error or OSError(f"no address for {host}")
