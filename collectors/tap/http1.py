"""What the tap's HTTP/1.1 server and engine client share: the head-size guard.

httptools (llhttp) joins the pieces of a header name or value internally and reports the
header only once it is complete, so a limit checked in its callbacks would let a peer that
never ends a header grow memory without bound. :class:`HeadLimit` counts the bytes fed to
the parser while a head is being read instead, and feeds at most one byte past the limit.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["MAX_HEAD_BYTES", "HeadLimit"]

#: Start line plus headers a peer may send (aiohttp allowed 8 KiB per field).
MAX_HEAD_BYTES = 64 * 1024


class _Parser(Protocol):
    def feed_data(self, data: bytes) -> None: ...


class HeadLimit:
    """Feeds a parser while keeping each message head under ``limit`` bytes.

    The protocol calls :meth:`head_done` from ``on_headers_complete`` and
    :meth:`next_head` when a new head may start (a new exchange, or after a message).
    """

    def __init__(self, limit: int = MAX_HEAD_BYTES) -> None:
        self.limit = limit
        self.reading_head = True
        self.head_bytes = 0

    def feed(self, parser: _Parser, data: bytes) -> bool:
        """Feed ``data``; ``False`` (having fed at most ``limit + 1`` head bytes) when the
        head is larger than the limit."""
        while self.reading_head and data:
            room = self.limit - self.head_bytes + 1
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self.head_bytes += len(piece)
            parser.feed_data(piece)
            if self.reading_head and self.head_bytes > self.limit:
                return False
        if data:
            parser.feed_data(data)
        return True

    def head_done(self) -> None:
        self.reading_head = False

    def next_head(self) -> None:
        self.reading_head = True
        self.head_bytes = 0
