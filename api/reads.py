"""The read endpoints: one ``GET /api/v1/...`` route per :mod:`slo.queries` function.

The contract shared with the dashboards: query parameters carry the names of the function's
keyword parameters (list parameters repeat; ``group`` repeats as ``group=key:value``; times
are integer epoch ms); the answer is ``{"data": [{column: value}, ...], "count": N}``, or
the same ``pyarrow.Table`` as an Arrow IPC stream when ``Accept`` is
``application/vnd.apache.arrow.stream``. A bad parameter is a 400
``{"error": message, "parameter": name}``; nothing is ever written.

Parameter kinds are read off each function's signature (data, not branches), so a new
``slo.queries`` function is one row of :data:`READ_ROUTES`.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Set
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from api.capacity import Lane
from pipeline.errors import QueryError
from slo import queries

__all__ = ["ARROW_STREAM", "READ_ROUTES", "ReadRoute", "add_read_routes", "table_response"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_INTEGER = re.compile(r"^-?\d{1,19}$")
_MAX_QUERY_VALUES = 512


@dataclass(frozen=True)
class ReadRoute:
    """``GET path`` answers ``query(cursor, **parameters)``.

    ``configured`` names keyword parameters the server fills from its configuration (see
    :func:`add_read_routes`), never from the query string.
    """

    path: str
    query: Callable[..., pa.Table]
    summary: str
    configured: tuple[str, ...] = ()


READ_ROUTES = (
    ReadRoute("/api/v1/slos", queries.slo_status, "Every SLO group's status, budget and burn."),
    ReadRoute(
        "/api/v1/slos/series", queries.slo_series, "Events and bad per bucket of every SLO group."
    ),
    ReadRoute(
        "/api/v1/slos/alert-spans",
        queries.slo_alert_spans,
        "Every SLO group's alert state over time, as spans with the burn rates at their ends.",
    ),
    ReadRoute("/api/v1/findings", queries.findings, "Findings in a range, with evidence."),
    ReadRoute("/api/v1/findings/open", queries.open_findings, "Findings firing now (or at_ms)."),
    ReadRoute("/api/v1/flags/timeline", queries.flag_timeline, "Level transitions in a range."),
    ReadRoute("/api/v1/latency", queries.latency_percentiles, "Latency percentiles over time."),
    ReadRoute("/api/v1/outcomes", queries.outcome_counts, "Outcome counts over time."),
    ReadRoute("/api/v1/ghosts", queries.ghost_counts, "Ghost-request evidence over time."),
    ReadRoute("/api/v1/engines", queries.engine_series, "Engine signals over time."),
    ReadRoute("/api/v1/gpus", queries.gpu_series, "GPU (DCGM) signals over time.", ("gpu_pods",)),
    ReadRoute(
        "/api/v1/alerts", queries.alerts, "Alerts the pipeline computed itself.", ("ttl_ms",)
    ),
)


def _kinds(function: Callable[..., Any]) -> tuple[dict[str, str], set[str]]:
    """(keyword parameter → kind, required names) from the function's signature."""
    kinds, required = {}, set()
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        annotation = str(parameter.annotation)
        if "Sequence" in annotation:
            kinds[name] = "list"
        elif "Mapping" in annotation:
            kinds[name] = "group"
        elif annotation.startswith("int"):
            kinds[name] = "int"
        elif annotation.startswith("float"):
            kinds[name] = "float"
        else:
            kinds[name] = "text"
        if parameter.default is inspect.Parameter.empty:
            required.add(name)
    return kinds, required


def _convert(name: str, kind: str, value: str) -> object:
    if kind == "int":
        if not _INTEGER.match(value):
            raise QueryError(name, f"must be an integer (epoch ms for times), got {value[:40]!r}")
        return int(value)
    if kind == "float":
        try:
            return float(value)
        except ValueError:
            raise QueryError(name, f"must be a number, got {value[:40]!r}") from None
    return value


def parse_query(
    request: Request,
    kinds: Mapping[str, str],
    required: Set[str] = frozenset(),
) -> dict[str, Any]:
    """Query parameters → keyword arguments, by kind; raises :class:`QueryError` naming one."""
    items = request.query_params.multi_items()
    if len(items) > _MAX_QUERY_VALUES:
        raise QueryError("query", f"at most {_MAX_QUERY_VALUES} parameters")
    arguments: dict[str, Any] = {}
    for name, value in items:
        kind = kinds.get(name)
        if kind is None:
            known = ", ".join(sorted(kinds)) or "none"
            raise QueryError(name, f"unknown parameter (known: {known})")
        if kind == "list":
            arguments.setdefault(name, []).append(value)
        elif kind == "group":
            key, sep, group_value = value.partition(":")
            if not sep or not key:
                raise QueryError("group", f"must be key:value, got {value[:40]!r}")
            if key in arguments.setdefault(name, {}):
                raise QueryError("group", f"{key} given more than once")
            arguments[name][key] = group_value
        elif name in arguments:
            raise QueryError(name, "given more than once")
        else:
            arguments[name] = _convert(name, kind, value)
    for name in sorted(required - set(arguments)):
        raise QueryError(name, "is required")
    return arguments


def _json_value(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def table_response(request: Request, table: pa.Table) -> Response:
    """JSON ``{"data", "count"}``, or an Arrow IPC stream when the client accepts one."""
    if ARROW_STREAM in request.headers.get("accept", ""):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return Response(sink.getvalue().to_pybytes(), media_type=ARROW_STREAM)
    rows = [{k: _json_value(v) for k, v in row.items()} for row in table.to_pylist()]
    return JSONResponse({"data": rows, "count": len(rows)})


def _endpoint(
    route: ReadRoute,
    connection_provider: Callable[[], duckdb.DuckDBPyConnection],
    configured: Mapping[str, object],
    lane: Lane,
) -> Callable[[Request], Awaitable[Response]]:
    kinds, required = _kinds(route.query)
    for name in route.configured:
        kinds.pop(name)
    settings = {name: configured[name] for name in route.configured if name in configured}

    async def endpoint(request: Request) -> Response:
        arguments = parse_query(request, kinds, required)

        def answer() -> Response:
            with closing(connection_provider()) as con:
                return table_response(request, route.query(con, **arguments, **settings))

        return await lane.run(answer)

    endpoint.__doc__ = (
        f"{route.summary}\n\nParameters: {', '.join(sorted(kinds)) or 'none'} "
        f"(see slo.queries.{route.query.__name__}). JSON, or Arrow with Accept: {ARROW_STREAM}."
    )
    return endpoint


def add_read_routes(
    app: FastAPI,
    connection_provider: Callable[[], duckdb.DuckDBPyConnection],
    objectives: Mapping[str, float],
    configured: Mapping[str, object] | None = None,
    *,
    lane: Lane,
) -> None:
    """Register every read route, the budget route and ``/api/v1/meta`` on ``app``, each
    run on ``lane``'s worker threads (shed with 503 when it is full).

    ``objectives`` (SLO id → objective from the loaded spec) fill in the budget route's
    ``objective`` when the caller leaves it out. ``configured`` holds the values of the
    routes' :attr:`ReadRoute.configured` parameters (``gpu_pods``, the alerts' ``ttl_ms``); one
    left out takes the query function's default.
    """
    for route in READ_ROUTES:
        endpoint = _endpoint(route, connection_provider, configured or {}, lane)
        app.add_api_route(route.path, endpoint, methods=["GET"], tags=["read"])
    budget_kinds, _ = _kinds(queries.budget_series)
    budget_kinds.pop("slo_id")

    @app.get("/api/v1/slos/{slo_id}/budget", tags=["read"])
    async def budget(slo_id: str, request: Request) -> Response:
        """Budget and burn series of one SLO (``objective`` defaults to the spec's)."""
        arguments = parse_query(request, budget_kinds, {"start_ms", "end_ms", "bucket_ms"})
        if "objective" not in arguments:
            if slo_id not in objectives:
                raise QueryError("slo_id", f"unknown SLO {slo_id[:80]!r}; pass objective")
            arguments["objective"] = objectives[slo_id]

        def answer() -> Response:
            with closing(connection_provider()) as con:
                series = queries.budget_series(con, slo_id=slo_id, **arguments)
                return table_response(request, series)

        return await lane.run(answer)

    @app.get("/api/v1/meta", tags=["read"])
    async def meta(request: Request) -> dict[str, Any]:
        """Data range, pools, instances (with pool and address) and SLO ids, for filters."""
        parse_query(request, {})

        def read() -> dict[str, Any]:
            with closing(connection_provider()) as con:
                return queries.meta(con)

        answer = await lane.run(read)
        answer["slos"] = sorted(set(answer["slos"]) | set(objectives))
        return answer
