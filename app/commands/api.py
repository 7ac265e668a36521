"""``llmslo api``: the HTTP API on a DuckDB file that no other process writes, and
:class:`ApiServer`, the uvicorn server on a thread that ``llmslo run`` uses too.

DuckDB lets one process open a file that is being written, so ``llmslo api --db FILE``
is for a file nobody writes (a copy, an exported store, an ingester that is stopped);
while ``llmslo run`` writes, it serves the same API itself. ``llmslo api`` opens the file
read-write (it is the only process, so verdicts and overrides are stored); with
``--read-only`` verdicts are computed but not stored (the answer says ``"stored": false``)
and overrides are refused.
"""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import uvicorn
from fastapi import FastAPI

from api import ApiConfig, create_app
from app.options import add_common_options, add_subcommand, install_stop_handlers, resolve_config
from pipeline.errors import ConfigError, StoreError
from pipeline.store import Store
from slo.jobs import JobsConfig

__all__ = ["ApiServer", "api_config", "register"]

log = logging.getLogger(__name__)


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


def register(subparsers: Any) -> None:
    """Add ``api``."""
    parser = add_subcommand(
        subparsers,
        "api",
        "Serve the HTTP API (reads, flags, verdicts) on a DuckDB file nobody else writes.",
        "llmslo api --db var/llmslo.duckdb                  # read-write: verdicts are stored\n"
        "llmslo api --db copy.duckdb --read-only --api-port 8191\n"
        "LLMSLO_API_TOKEN=... llmslo api -c config/llmslo.example.yaml\n"
        "while `llmslo run` writes a file, it serves this API itself (section api:)",
    )
    add_common_options(parser, bus=False, db=True)
    parser.add_argument("--spec", type=Path, help="SLO spec (default: slo.spec, else the example)")
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="open the file read-only: verdicts computed, not stored; overrides refused",
    )
    parser.add_argument("--host", help="listen address (default: api.host, 127.0.0.1)")
    parser.add_argument("--api-port", type=int, help="listen port (default: api.port; 0: any)")
    parser.set_defaults(handler=run_api)


def run_api(args: argparse.Namespace) -> int:
    from app.run import load_model  # the shared spec loader (and its example default)

    config = resolve_config(args)
    settings = api_config(args, config)
    model = load_model(args.spec or config.section("slo", JobsConfig).spec)
    path = config.store.path
    if args.read_only:
        if not Path(path).exists():
            raise ConfigError(f"--read-only: DuckDB file {path} does not exist")
        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {path} read-only (is it being written?): {exc}") from exc
    else:
        con = Store(path).con
    try:
        app = create_app(con.cursor, settings, model=model, read_only=args.read_only)
        server = ApiServer(app, settings.host, settings.port).start()
        mode = "read-only" if args.read_only else "read-write"
        print(
            f"serving the API ({mode}) on {server.url} (OpenAPI at {server.url}/docs)", flush=True
        )
        install_stop_handlers(server.stop)
        server.wait()
    finally:
        con.close()
    return 0
