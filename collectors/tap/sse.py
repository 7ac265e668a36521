"""Incremental Server-Sent-Events framing that never loses or reorders a byte.

:class:`SseFramer` cuts an arbitrarily chunked byte stream into whole events (the bytes up
to and including the blank line that ends each event) and parses each event's ``data``
field. Concatenating the ``raw`` bytes of everything it returns, followed by
:meth:`SseFramer.close`, gives back exactly the bytes it was fed, whatever the chunking —
the proxy forwards those bytes, so the client receives the engine's stream byte for byte.

Memory is bounded: an event larger than ``max_event_bytes`` is passed on in pieces marked
``oversized`` (its data is not parsed) instead of being accumulated.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SseEvent", "SseFramer"]

#: Largest event whose data is parsed (OpenAI chunks are well under 64 KiB).
DEFAULT_MAX_EVENT_BYTES = 1024 * 1024

# A line terminator: CRLF, LF, or a CR that is not followed by LF. A CR at the very end of
# the buffer is undecided (the LF may be in the next chunk), so it does not match yet.
_TERMINATOR = re.compile(rb"\r\n|\n|\r(?=[^\n])")
_NEWLINE = re.compile(rb"[\r\n]")


class SseEvent(NamedTuple):
    """One framed piece of the stream.

    ``raw`` is the exact bytes; ``data`` the event's joined ``data:`` lines (``None`` for
    comment-only events, unterminated tails and oversized pieces); ``name`` the ``event:``
    field; ``oversized`` marks a piece of an event too large to parse.
    """

    raw: bytes
    data: bytes | None
    name: bytes | None = None
    oversized: bool = False


class SseFramer:
    """Feed bytes with :meth:`feed`, get whole events; call :meth:`close` at end of stream."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._buf = bytearray()
        self._line = 0  # start of the current (unfinished) line in _buf
        self._scan = 0  # no line terminator exists in _buf[_line:_scan]
        self._data: list[bytes] = []
        self._name: bytes | None = None
        self._skipping = False  # inside an oversized event: forward until its blank line
        self._partial_line = False  # the current line's first bytes were already spilled
        self.oversized_events = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes held back because their event is not complete yet."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Append ``chunk``; return every event it completed (possibly none)."""
        if not self._buf and not self._skipping and b"\r" not in chunk:
            events, rest = self._fast(chunk)
            if not rest:
                return events
            return events + self._general(rest)
        return self._general(chunk)

    def _fast(self, chunk: bytes) -> tuple[list[SseEvent], bytes]:
        """The common shape, ``data: …\n\n`` events, without per-line work.

        Stops at the first event of any other shape (or the incomplete tail) and returns the
        bytes from there on for the general parser; the framer state is clean at that point.
        """
        events: list[SseEvent] = []
        start = 0
        end = chunk.find(b"\n\n")
        while end >= 0:
            if chunk.startswith(b"data: ", start) and chunk.find(b"\n", start, end) < 0:
                piece = chunk[start : end + 2]
                events.append(SseEvent(piece, piece[6:-2], None))
                start = end + 2
                end = chunk.find(b"\n\n", start)
            else:
                break
        return events, chunk[start:]

    def _general(self, chunk: bytes) -> list[SseEvent]:
        self._buf += chunk
        events: list[SseEvent] = []
        buf = self._buf
        start = 0  # start of the current event in buf
        while True:
            found = _NEWLINE.search(buf, self._scan)
            if found is None:
                self._scan = len(buf)
                break
            match = _TERMINATOR.match(buf, found.start())
            if match is None:  # a CR at the end of the buffer: wait for the next byte
                self._scan = found.start()
                break
            line_end = match.end()
            line = bytes(buf[self._line : found.start()])
            self._line = self._scan = line_end
            if line or self._partial_line:
                self._partial_line = False
                if not self._skipping:
                    self._field(line)
                continue
            events.append(self._dispatch(bytes(buf[start:line_end])))
            start = line_end
        if start:
            del buf[:start]
            self._line -= start
            self._scan -= start
        if len(buf) > self._max:
            events.append(self._spill())
        return events

    def close(self) -> list[SseEvent]:
        """End of stream: events a final CR completes, then the unterminated tail (if any).

        The tail is never dispatched as an event (its ``data`` is ``None``), per the spec.
        """
        events: list[SseEvent] = []
        if self._buf.endswith(b"\r"):
            # At end of stream a trailing CR is a line terminator: decide it with a
            # sentinel byte that is then taken back out of the tail.
            events = self.feed(b"\x00")
            del self._buf[-1:]
        if self._buf:
            events.append(SseEvent(bytes(self._buf), None, None, self._skipping))
        self._buf.clear()
        self._line = self._scan = 0
        self._data, self._name, self._skipping = [], None, False
        self._partial_line = False
        return events

    def _field(self, line: bytes) -> None:
        if line[:1] == b":":
            return  # comment
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._name = value

    def _dispatch(self, raw: bytes) -> SseEvent:
        if self._skipping:
            event = SseEvent(raw, None, None, True)
        else:
            data = b"\n".join(self._data) if self._data else None
            event = SseEvent(raw, data, self._name)
        self._data, self._name, self._skipping = [], None, False
        return event

    def _spill(self) -> SseEvent:
        """Pass on the held part of an oversized event; skip its fields until it ends."""
        if not self._skipping:
            self.oversized_events += 1
        cut = self._scan  # everything but an undecided trailing CR
        self._partial_line = self._partial_line or self._line < cut
        piece = bytes(self._buf[:cut])
        del self._buf[:cut]
        self._line = max(self._line - cut, 0)
        self._scan = max(self._scan - cut, 0)
        self._data, self._name, self._skipping = [], None, True
        return SseEvent(piece, None, None, True)
