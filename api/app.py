"""The FastAPI app: health, the Argo ``web`` verdict endpoint, Flagger gate webhooks and
verdict history. OpenAPI at ``/docs``.

Status rules (reference/canary-and-peers.md §2.1):

* ``GET/POST /api/v1/verdict`` (document mode, Argo): **200 for every computed verdict**
  (pass, fail, inconclusive), with ``summary`` for ``jsonPath: "{$.summary}"``; 400 bad
  parameters, 401/403 token, 404 unknown cohort, 503 store unavailable.
* ``POST /api/v1/flagger/{gate}`` (gate mode, Flagger): the status *is* the verdict:
  200 pass, 412 fail, 409 inconclusive (``on_inconclusive`` may map it to 412 or 200);
  never 204, never 429, never 5xx for a verdict. The reason is in the body. Flagger cannot
  send headers, so the token may come in ``metadata.token``; all ``metadata`` values are
  strings. ``checksum`` is the idempotency key (with the parameters and a recompute bucket).

Computing a verdict writes the ``verdicts`` table, so it needs the bearer token named by
:attr:`ApiConfig.token_env`; without a configured token those endpoints answer 403.
Reading history does not. A header token is checked before any body is read and bodies
are capped per route (:mod:`api.guard`); each kind of route runs in its own lane of
worker threads, and reads are shed with 503 + ``Retry-After`` first (:mod:`api.capacity`).
"""

from __future__ import annotations

import logging
import os
import pathlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, closing
from importlib import resources
from typing import Annotated, Any, Literal

import duckdb
from fastapi import Body, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field

from api.auth import bearer, check_token
from api.capacity import Lanes
from api.changes import add_change_routes
from api.errors import (
    AuthError,
    OverloadedError,
    ReadOnlyStoreError,
    UnknownCohortError,
    UnknownVerdictError,
    error_response,
)
from api.flags import FlagWatcher, add_flag_routes
from api.guard import BodyGuard
from api.reads import ARROW_STREAM, add_read_routes, table_response
from api.service import ApiConfig, SloStateProvider, VerdictService
from api.tables import API_TABLES
from pipeline.errors import QueryError
from slo import queries
from slo.sinks import TransitionSink
from slo.spec.loader import load_spec
from slo.spec.model import SloModel, build_model

__all__ = ["ConnectionProvider", "FlaggerPayload", "create_app"]

log = logging.getLogger(__name__)

#: Returns a DuckDB connection or cursor the app owns for one request and then closes
#: (e.g. ``store.con.cursor`` inside ``llmslo run``, so reads share the writer's database).
ConnectionProvider = Callable[[], duckdb.DuckDBPyConnection]

FlaggerGate = Literal["pre-rollout", "rollout", "confirm-promotion", "confirm-traffic-increase"]
_GATE_STATUS = {"pass": 200, "fail": 412, "inconclusive": 409}


class FlaggerPayload(BaseModel):
    """What Flagger POSTs to a webhook (``CanaryWebhookPayload``)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=253)
    namespace: str = Field(max_length=253)
    phase: str = Field(default="", max_length=64)
    checksum: str = Field(default="", max_length=256)
    metadata: dict[str, str] = Field(default_factory=dict)


def _query_params(request: Request) -> dict[str, object]:
    """Query parameters; instance lists may repeat, anything else given twice is refused."""
    params: dict[str, object] = {}
    for key, value in request.query_params.multi_items():
        if key not in params:
            params[key] = value
        elif key in ("canary_instances", "baseline_instances"):
            params[key] = f"{params[key]},{value}"
        else:
            raise QueryError(None, f"{key}: given more than once")
    return params


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return error_response(400, detail or "invalid request")

    @app.exception_handler(AuthError)
    async def _auth(request: Request, exc: AuthError) -> JSONResponse:
        return error_response(exc.status, str(exc))

    @app.exception_handler(UnknownVerdictError)
    async def _no_verdict(request: Request, exc: UnknownVerdictError) -> JSONResponse:
        return error_response(404, str(exc))

    @app.exception_handler(UnknownCohortError)
    async def _unknown(request: Request, exc: UnknownCohortError) -> JSONResponse:
        return error_response(404, str(exc))

    @app.exception_handler(QueryError)
    async def _query(request: Request, exc: QueryError) -> JSONResponse:
        if exc.parameter is None:
            return error_response(400, str(exc))
        return error_response(400, str(exc), parameter=exc.parameter)

    @app.exception_handler(OverloadedError)
    async def _overloaded(request: Request, exc: OverloadedError) -> JSONResponse:
        return error_response(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(ReadOnlyStoreError)
    async def _read_only(request: Request, exc: ReadOnlyStoreError) -> JSONResponse:
        return error_response(503, str(exc))

    @app.exception_handler(LookupError)
    async def _not_found(request: Request, exc: LookupError) -> JSONResponse:
        return error_response(404, str(exc.args[0]) if exc.args else "not found")

    @app.exception_handler(duckdb.Error)
    async def _store(request: Request, exc: duckdb.Error) -> JSONResponse:
        log.error("store unavailable for %s: %s", request.url.path, exc)
        return error_response(503, "store unavailable")


def create_app(
    connection_provider: ConnectionProvider,
    config: ApiConfig | None = None,
    *,
    clock: Callable[[], float] = time.time,
    slo_state_provider: SloStateProvider | None = None,
    token: str | None = None,
    model: SloModel | None = None,
    flag_sink: TransitionSink | None = None,
    read_only: bool = False,
    gpu_pods: Mapping[str, str] | None = None,
    alert_ttl_s: float | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """Build the app. ``token`` overrides the one read from ``config.token_env``.

    ``model`` is the loaded SLO spec (default: the example spec shipped in ``slo``): its
    objectives fill in the budget route. ``flag_sink`` receives the transitions of manual
    overrides (the Kafka ``flags`` topic inside ``llmslo run``). ``read_only``: the store
    is opened read-only, so verdicts are computed but not stored (the answer says
    ``"stored": false``) and overrides cannot be set (503). ``gpu_pods`` maps dcgm-exporter's
    ``pod`` label to the engine instance where the two differ (the SLO config's
    ``detectors.gpu_pods``), so ``/api/v1/gpus`` joins GPUs to engines as the detectors do.
    ``alert_ttl_s`` (the pusher's TTL, :func:`alerts.push.alert_ttl_s`) expires
    ``/api/v1/alerts``' firing alerts that no jobs cycle confirmed within it; None lists
    every firing alert however old. Otherwise the API's tables
    (``verdicts``, ``flag_overrides``) are created when missing; ``/readyz`` says what is
    missing when that failed. The API's counters (shed requests, refused bodies, passes
    without a verdict) go to ``registry`` (the process's, inside ``llmslo run``).
    """
    config = config or ApiConfig()
    model = model or build_model(
        load_spec(pathlib.Path(str(resources.files("slo") / "slo.example.yaml")))
    )
    expected = token if token is not None else os.environ.get(config.token_env)
    service = VerdictService(
        connection_provider, config, clock, slo_state_provider, store_verdicts=not read_only
    )
    watcher = FlagWatcher(
        connection_provider,
        clock,
        tick_s=config.flags_tick_s,
        staleness_s=config.flags_staleness_s,
        sink=flag_sink,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        watcher.stop()

    app = FastAPI(
        title="llmslo API",
        summary="SLO status, flags for gateways, read series for dashboards, and canary "
        "verdicts for Argo Rollouts and Flagger",
        version="1",
        lifespan=lifespan,
    )
    registry = registry if registry is not None else CollectorRegistry()
    lanes = Lanes(config.limits, registry)
    unjudged = Counter(
        "llmslo_api_unjudged_passes",
        "Flagger gates answered pass for an inconclusive verdict (on_inconclusive=pass)",
        ["gate"],
        registry=registry,
    )
    app.state.flag_watcher = watcher
    app.state.lanes = lanes
    app.state.registry = registry
    _install_error_handlers(app)
    if not read_only:
        try:
            with closing(connection_provider()) as con:
                for table in API_TABLES:
                    table.create(con)
        except duckdb.Error as exc:
            log.error("cannot create the API's tables: %s", exc)

    def require_token(authorization: str | None) -> None:
        check_token(expected, bearer(authorization), config.token_env)

    app.add_middleware(
        BodyGuard,
        authorize=require_token,
        body_timeout_s=config.limits.body_timeout_s,
        registry=registry,
    )
    add_read_routes(
        app,
        connection_provider,
        {slo.id: slo.objective for slo in model.slos},
        {
            "gpu_pods": dict(gpu_pods or {}),
            **({"ttl_ms": int(alert_ttl_s * 1000)} if alert_ttl_s is not None else {}),
        },
        lane=lanes.reads,
    )
    add_flag_routes(app, watcher)
    add_change_routes(
        app,
        watcher,
        token=require_token,
        alertmanager_url=config.alertmanager_url,
        writable=not read_only,
        reads=lanes.reads,
        changes=lanes.changes,
    )

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process answers (on the event loop: no worker thread, no store)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """Ready when the store answers with the tables the API needs (``requests``, and
        ``verdicts`` unless read-only) and the SLO spec is loaded; 503 says what is missing."""
        return await lanes.health.run(ready)

    def ready() -> JSONResponse:
        needed = {"requests"} if read_only else {"requests", "verdicts"}
        try:
            with closing(connection_provider()) as con:
                found = queries.present_tables(con)
        except duckdb.Error as exc:
            return error_response(503, f"store unavailable: {exc}")
        missing = sorted(needed - found)
        if missing:
            return error_response(503, f"missing table(s) {missing}")
        return JSONResponse(
            {
                "status": "ready",
                "spec": model.service,
                "slos": len(model.slos),
                "read_only": read_only,
            }
        )

    @app.get("/api/v1/verdict", tags=["verdicts"])
    async def verdict_get(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Argo ``web`` provider (document mode): always 200 for a computed verdict.

        Parameters as a query string: ``canary_instances``/``baseline_instances``
        (comma-separated) and/or ``canary_selector``/``baseline_selector``
        (``label=value,…``), ``window`` (``10m``) and ``at`` (RFC 3339) or ``start``/``end``,
        ``min_requests``, ``namespace``, ``service``.
        """
        require_token(authorization)
        params = _query_params(request)
        document, _ = await lanes.verdicts.run(lambda: service.evaluate(params, "argo"))
        return document

    @app.post("/api/v1/verdict", tags=["verdicts"])
    async def verdict_post(
        params: Annotated[dict[str, Any], Body()],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        """The same as ``GET`` with the parameters in a JSON object body."""
        require_token(authorization)
        document, _ = await lanes.verdicts.run(lambda: service.evaluate(params, "argo"))
        return document

    @app.post("/api/v1/flagger/{gate}", tags=["verdicts"])
    async def flagger_gate(
        gate: FlaggerGate,
        payload: FlaggerPayload,
        authorization: Annotated[str | None, Header()] = None,
    ) -> JSONResponse:
        """Flagger webhook (gate mode): 200 pass, 412 fail, 409 inconclusive. A pass for an
        inconclusive verdict (``on_inconclusive=pass``) carries a ``warning`` and is counted."""
        metadata = dict(payload.metadata)
        given = metadata.pop("token", None) or bearer(authorization)
        check_token(expected, given, config.token_env)
        params: dict[str, object] = {"namespace": payload.namespace, "service": payload.name}
        params.update(metadata)
        idempotency = (
            {"gate": gate, "checksum": payload.checksum, "params": params}
            if payload.checksum
            else None
        )
        document, verdict = await lanes.verdicts.run(
            lambda: service.evaluate(params, f"flagger/{gate}", idempotency)
        )
        # Flagger copies the body into a Kubernetes event: keep it compact; the evidence is
        # in the stored verdict (GET /api/v1/verdicts/{id}).
        classes = {m["name"]: m["classification"] for m in document["metrics"]}
        body = {"id": document["id"], **document["summary"], "metrics": classes}
        answered = verdict
        if verdict == "inconclusive":
            answered = metadata.get("on_inconclusive", "inconclusive")
            if answered == "pass":
                body["warning"] = _unjudged_warning(document["summary"])
                unjudged.labels(gate=gate).inc()
                log.warning("flagger/%s %s: %s", gate, document["id"], body["warning"])
        return JSONResponse(body, status_code=_GATE_STATUS[answered])

    @app.get("/api/v1/verdicts", tags=["verdicts"])
    async def verdict_history(
        request: Request,
        limit: Annotated[int, Query(ge=1)] = 50,
        service_name: Annotated[str | None, Query(alias="service", max_length=253)] = None,
        verdict: Literal["pass", "fail", "inconclusive"] | None = None,
    ) -> Response:
        """Stored verdicts, newest first: ``verdicts`` (documents with their per-metric
        evidence), ``data``/``count`` (one row per verdict, the read-route contract), or
        those rows as an Arrow stream with ``Accept: application/vnd.apache.arrow.stream``."""
        if limit > config.history_max_limit:
            raise QueryError(None, f"limit: at most {config.history_max_limit}")
        documents, table = await lanes.reads.run(
            lambda: service.history(limit, service_name, verdict)
        )
        if ARROW_STREAM in request.headers.get("accept", ""):
            return table_response(request, table)
        rows = table.to_pylist()
        return JSONResponse(
            {"verdicts": [d.document for d in documents], "data": rows, "count": len(rows)}
        )

    @app.get("/api/v1/verdicts/{verdict_id}", tags=["verdicts"])
    async def verdict_by_id(verdict_id: Annotated[str, Path(max_length=64)]) -> dict[str, Any]:
        """One stored verdict with its per-metric evidence; 404 if there is none."""
        stored = await lanes.reads.run(lambda: service.by_id(verdict_id))
        if stored is None:
            raise UnknownVerdictError(f"no verdict {verdict_id!r}")
        return stored.document

    return app


def _unjudged_warning(summary: Mapping[str, Any]) -> str:
    return (
        "promoted without a verdict: inconclusive answered as pass (on_inconclusive=pass) "
        f"with {summary['canaryRequests']} canary and {summary['baselineRequests']} "
        f"baseline requests; {summary['reason'][:200]}"
    )
