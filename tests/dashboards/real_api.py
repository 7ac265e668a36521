"""The product's own read API (``api.create_app``) over a DuckDB file, served on loopback in
a thread, for the ApiSource tests: both sources must answer every question alike."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import uvicorn
from fastapi import FastAPI

from api import ApiConfig, create_app
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.dashboards.conftest import SPEC

__all__ = ["api_app", "serve"]


def api_app(path: Path) -> FastAPI:
    """The product's own API app over the DuckDB file at ``path`` (opened read-only), with the
    spec the history was evaluated with."""
    con = duckdb.connect(str(path), read_only=True)
    return create_app(con.cursor, ApiConfig(), model=build_model(parse_spec(SPEC)), read_only=True)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on a free loopback port in a thread; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the contract API did not start")
        threading.Event().wait(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
