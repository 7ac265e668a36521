"""The HTTP API served on a thread: what ``llmslo run`` and ``llmslo api`` both start."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from api import ApiConfig
from pipeline.errors import ConfigError

__all__ = ["ApiServer", "api_config"]


class ApiServer:
    """``app`` served by uvicorn on a daemon thread, bound to ``host:port`` (0: any free port).

    Raises :class:`~pipeline.errors.ConfigError` when the address cannot be bound.
    """

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
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
        self._server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", backlog=1024, timeout_graceful_shutdown=5)
        )
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
    if getattr(args, "api_port", None) is not None:
        updates["port"] = args.api_port
    return section.model_copy(update=updates) if updates else section
