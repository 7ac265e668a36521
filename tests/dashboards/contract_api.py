"""A tiny FastAPI app that serves ``slo.queries`` per the read-API contract, for ApiSource tests.

Stands in for the routes the API engineer is writing (branch ``api2``); when they land,
the tests point at the real app. JSON by default, an Arrow IPC stream of the very table
the query function returns when asked for ``application/vnd.apache.arrow.stream``;
a ``QueryError`` is a 400 naming the parameter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from dashboards.sources import ARROW_STREAM, ROUTES, read_meta, read_verdicts
from pipeline.errors import QueryError
from slo import queries

_INTS = {"start_ms", "end_ms", "bucket_ms", "at_ms", "limit"}
_FLOATS = {"objective", "ghost_grace_s"}
_LISTS = {"signals", "instances"}


def _kwargs(request: Request) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for name, value in request.query_params.multi_items():
        if name == "group":
            key, _, wanted = value.partition(":")
            kwargs.setdefault("group", {})[key] = wanted
        elif name in _LISTS:
            kwargs.setdefault(name, []).append(value)
        elif name in _INTS:
            try:
                kwargs[name] = int(value)
            except ValueError as exc:
                raise QueryError(name, f"must be an integer, got {value!r}") from exc
        elif name in _FLOATS:
            kwargs[name] = float(value)
        else:
            kwargs[name] = value
    return kwargs


def _answer(request: Request, table: pa.Table) -> Response:
    if request.headers.get("accept", "").startswith(ARROW_STREAM):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return Response(sink.getvalue().to_pybytes(), media_type=ARROW_STREAM)
    return JSONResponse({"data": table.to_pylist(), "count": table.num_rows})


def contract_app(path: Path) -> FastAPI:
    """The read routes over the DuckDB file at ``path`` (opened read-only)."""
    app = FastAPI()
    con = duckdb.connect(str(path), read_only=True)

    def route(question: str) -> Callable[..., Response]:
        def handle(request: Request) -> Response:
            kwargs = _kwargs(request)
            kwargs.update(request.path_params)
            cursor = con.cursor()
            try:
                if question == "verdicts":
                    return _answer(request, read_verdicts(cursor, **kwargs))
                return _answer(request, getattr(queries, question)(cursor, **kwargs))
            except QueryError as exc:
                return JSONResponse({"error": str(exc), "parameter": exc.parameter}, 400)
            finally:
                cursor.close()

        return handle

    for question, path_template in ROUTES.items():
        app.add_api_route(path_template, route(question), methods=["GET"])

    @app.get("/api/v1/meta")
    def meta() -> dict[str, Any]:
        m = read_meta(con.cursor())
        return {
            "data_start_ms": m.data_start_ms, "data_end_ms": m.data_end_ms, "pools": list(m.pools),
            "instances": list(m.instances), "slos": list(m.slos),
        }  # fmt: skip

    return app


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
