"""The HTTP API served on a thread: what ``llmslo run`` and ``llmslo api`` both start.

uvicorn bounds idle keep-alive connections and open connections but not the time a client
takes to send its request head, nor (with httptools) its size; :class:`HeaderTimeoutProtocol`
adds both bounds: half-sent requests and silent sockets are closed after
``api.limits.header_timeout_s``, a head larger than ``max_header_bytes`` gets 431.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api import ApiConfig
from api.capacity import ApiLimits
from pipeline.errors import ConfigError

__all__ = ["ApiServer", "HeaderTimeoutProtocol", "api_config", "server_config"]


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol that closes a connection whose request head is not
    complete ``header_timeout_s`` after the connection opened or, on a kept-alive
    connection, after the first byte of the next request; a head past ``max_header_bytes``
    is answered 431 and the connection closed."""

    header_timeout_s = 10.0
    max_header_bytes = 16_384
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()
        awaiting_head = self._head_timer is not None
        super().data_received(data)
        if awaiting_head and self._head_timer is not None:  # still no complete head
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
                self._refuse_head()

    def on_headers_complete(self) -> None:
        self._disarm()
        head_bytes = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        if head_bytes > self.max_header_bytes:
            self._refuse_head()
            return
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _refuse_head(self) -> None:
        self._disarm()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
            b"connection: close\r\n\r\n"
        )
        self.transport.close()

    def _arm(self) -> None:
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def server_config(app: FastAPI, limits: ApiLimits) -> uvicorn.Config:
    """uvicorn's settings for ``app`` within ``limits`` (also used by the tests' servers)."""
    bounds = {
        "header_timeout_s": limits.header_timeout_s,
        "max_header_bytes": limits.max_header_bytes,
    }
    protocol = type("BoundedHttpProtocol", (HeaderTimeoutProtocol,), bounds)
    return uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        backlog=1024,
        timeout_graceful_shutdown=5,
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


class ApiServer:
    """``app`` served by uvicorn on a daemon thread, bound to ``settings.host:port`` (0: any
    free port), within ``settings.limits``.

    Raises :class:`~pipeline.errors.ConfigError` when the address cannot be bound.
    """

    def __init__(self, app: FastAPI, settings: ApiConfig) -> None:
        host, port = settings.host, settings.port
        self._socket = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
        )
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as exc:
            self._socket.close()
            raise ConfigError(f"api: cannot listen on {host}:{port}: {exc} (set api.port)") from exc
        self.host, self.port = self._socket.getsockname()[:2]
        self._server = uvicorn.Server(server_config(app, settings.limits))
        # On a thread uvicorn leaves SIGINT/SIGTERM alone: the caller's handlers stop it.
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="api", daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8190``."""
        host = f"[{self.host}]" if ":" in str(self.host) else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> ApiServer:
        """Start serving; raises ``ConfigError`` if uvicorn is not up within ``timeout_s``."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"api: the server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def wait(self) -> None:
        """Block until the server stops."""
        self._thread.join()

    def stop(self) -> None:
        """Finish the requests in flight (bounded), then close the socket."""
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()


def api_config(args: argparse.Namespace, config: Any) -> ApiConfig:
    """The ``api`` section with ``--host``/``--api-port`` applied."""
    section: ApiConfig = config.section("api", ApiConfig)
    updates: dict[str, object] = {}
    if getattr(args, "host", None):
        updates["host"] = args.host
    port = getattr(args, "api_port", None)  # ``run --api-port``; ``api --port``
    if port is None:
        port = getattr(args, "port", None)
    if port is not None:
        updates["port"] = port
    return section.model_copy(update=updates) if updates else section
