"""A recording HTTP server on loopback, for tests that need a real peer: a beacon that
must receive nothing, an Alertmanager that stores and answers late."""

from __future__ import annotations

import http.server
import threading
import time
from typing import NamedTuple

__all__ = ["Received", "RecordingServer"]


class Received(NamedTuple):
    """One request the server received."""

    method: str
    path: str
    body: bytes


class RecordingServer:
    """Records every request, then answers ``status`` (empty body of ``content_type``)
    after ``delay_s``; a context manager, listening on ``url`` from construction."""

    def __init__(
        self, *, status: int = 200, content_type: str = "text/plain", delay_s: float = 0.0
    ) -> None:
        received: list[Received] = []
        self.received = received

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(Received(self.command, self.path, self.rfile.read(length)))
                time.sleep(delay_s)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> RecordingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
