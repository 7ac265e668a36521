"""A real loopback HTTP server that writes every body the way a network delivers it.

:class:`PiecewiseServer` answers ``GET path`` with the page registered for ``path``
(text, or a URL it fetches first and re-serves, so a simulator pod can sit behind it).
Every body goes out in pieces of random size (from 1 byte) with short pauses between
them, so a reader that keeps only what happens to be buffered loses samples. The framing
cycles per request through the four :data:`MODES` (``Content-Length`` and chunked, each
plain and gzip), so any few scrapes exercise all of them; a fixed ``mode`` pins one.

Faults for the error paths: ``cut_at`` closes the connection after that many body bytes
(the framing still promised more), ``raw_gzip`` serves prepared gzip bytes as-is (a bomb).
"""

from __future__ import annotations

import gzip
import itertools
import random
import socketserver
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MODES", "Page", "PiecewiseServer"]

#: (framing, content encoding) of the responses, cycled per request.
MODES: tuple[tuple[str, str], ...] = (
    ("length", "identity"),
    ("chunked", "identity"),
    ("length", "gzip"),
    ("chunked", "gzip"),
)


@dataclass
class Page:
    """What one path serves. ``body`` is text, or a zero-argument callable returning it."""

    body: str | Callable[[], str] = ""
    status: int = 200
    mode: tuple[str, str] | None = None  # None: cycle through MODES
    cut_at: int | None = None  # close after this many body bytes on the wire
    raw_gzip: bytes | None = None  # served as a gzip body as-is (content ignored)
    pieces: tuple[int, int] = (1, 4096)  # piece sizes, bytes
    pause_s: tuple[float, float] = (0.0, 0.004)
    headers: dict[str, str] = field(default_factory=dict)
    split_at: tuple[int, ...] = ()  # exact piece boundaries instead of random ones


class PiecewiseServer:
    """Serve :class:`Page` s on ``127.0.0.1:<ephemeral>`` from a thread; a context manager."""

    def __init__(self, pages: dict[str, Page] | None = None, *, seed: int = 0) -> None:
        self.pages: dict[str, Page] = dict(pages or {})
        self.requests: list[tuple[str, tuple[str, str]]] = []  # (path, mode) served
        self._rng = random.Random(seed)
        self._modes = itertools.cycle(MODES)
        self._lock = threading.Lock()
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                server._handle(self)

        self._tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._tcp.daemon_threads = True
        self.port: int = self._tcp.server_address[1]

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/metrics") -> str:
        return f"http://{self.host_port}{path}"

    def proxy(self, path: str, upstream_url: str, **page: object) -> str:
        """Serve ``upstream_url``'s current body (fetched per request) at ``path``."""

        def fetch() -> str:
            with urllib.request.urlopen(upstream_url, timeout=10) as response:
                return str(response.read().decode())

        self.pages[path] = Page(body=fetch, **page)  # type: ignore[arg-type]
        return self.url(path)

    def __enter__(self) -> PiecewiseServer:
        threading.Thread(target=self._tcp.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._tcp.shutdown()
        self._tcp.server_close()

    # -- one exchange ------------------------------------------------------------------------
    def _handle(self, handler: socketserver.StreamRequestHandler) -> None:
        request_line = handler.rfile.readline().decode("latin-1")
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # request headers: not needed
        path = request_line.split(" ")[1] if " " in request_line else "/"
        page = self.pages.get(path, Page(body="not found\n", status=404))
        with self._lock:
            mode = page.mode or next(self._modes)
            rng = random.Random(self._rng.random())
            self.requests.append((path, mode))
        framing, encoding = mode
        text = page.body() if callable(page.body) else page.body
        payload = text.encode()
        if page.raw_gzip is not None:
            payload, encoding = page.raw_gzip, "gzip"
        elif encoding == "gzip":
            payload = gzip.compress(payload, compresslevel=5)
        head = [f"HTTP/1.1 {page.status} X", "Content-Type: text/plain; version=0.0.4"]
        head += [f"{k}: {v}" for k, v in page.headers.items()]
        if encoding == "gzip":
            head.append("Content-Encoding: gzip")
        head.append(
            f"Content-Length: {len(payload)}"
            if framing == "length"
            else "Transfer-Encoding: chunked"
        )
        head.append("Connection: close")
        out = handler.wfile
        try:
            out.write(("\r\n".join(head) + "\r\n\r\n").encode())
            out.flush()
            sent = 0
            for piece in self._pieces(payload, page, rng):
                if page.cut_at is not None and sent + len(piece) > page.cut_at:
                    piece = piece[: page.cut_at - sent]
                    self._write(out, piece, framing)
                    return  # closed early: the framing promised more
                self._write(out, piece, framing)
                sent += len(piece)
                time.sleep(rng.uniform(*page.pause_s))
            if framing == "chunked":
                out.write(b"0\r\n\r\n")
                out.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (over-limit bodies): nothing to tell it

    @staticmethod
    def _pieces(payload: bytes, page: Page, rng: random.Random) -> list[bytes]:
        if page.split_at:
            bounds = [0, *page.split_at, len(payload)]
            return [payload[a:b] for a, b in itertools.pairwise(bounds) if b > a]
        pieces, pos = [], 0
        while pos < len(payload):
            size = rng.randint(*page.pieces)
            pieces.append(payload[pos : pos + size])
            pos += size
        return pieces

    @staticmethod
    def _write(out: object, piece: bytes, framing: str) -> None:
        if not piece:
            return
        data = piece if framing == "length" else b"%x\r\n%s\r\n" % (len(piece), piece)
        out.write(data)  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
