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
Reading history does not.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from contextlib import closing
from typing import Annotated, Any, Literal

import duckdb
from fastapi import Body, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.errors import QueryError, UnknownCohortError
from api.service import ApiConfig, SloStateProvider, VerdictService
from api.verdicts import VerdictStore

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


class UnknownVerdictError(Exception):
    """No stored verdict has that id (404)."""


class AuthError(Exception):
    """Missing (401) or wrong (403) token."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def _check_token(expected: str | None, given: str | None, token_env: str) -> None:
    if not expected:
        raise AuthError(403, f"no API token is configured; set ${token_env} to allow verdicts")
    if not given:
        raise AuthError(401, "a bearer token is required (Authorization header or metadata.token)")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise AuthError(403, "wrong token")


def _query_params(request: Request) -> dict[str, object]:
    """Query parameters; instance lists may repeat, anything else given twice is refused."""
    params: dict[str, object] = {}
    for key, value in request.query_params.multi_items():
        if key not in params:
            params[key] = value
        elif key in ("canary_instances", "baseline_instances"):
            params[key] = f"{params[key]},{value}"
        else:
            raise QueryError(f"{key}: given more than once")
    return params


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return _error(400, detail or "invalid request")

    @app.exception_handler(AuthError)
    async def _auth(request: Request, exc: AuthError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(UnknownVerdictError)
    async def _no_verdict(request: Request, exc: UnknownVerdictError) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(UnknownCohortError)
    async def _unknown(request: Request, exc: UnknownCohortError) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(QueryError)
    async def _query(request: Request, exc: QueryError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(duckdb.Error)
    async def _store(request: Request, exc: duckdb.Error) -> JSONResponse:
        log.error("verdict store unavailable for %s: %s", request.url.path, exc)
        return _error(503, "store unavailable")


def create_app(
    connection_provider: ConnectionProvider,
    config: ApiConfig | None = None,
    *,
    clock: Callable[[], float] = time.time,
    slo_state_provider: SloStateProvider | None = None,
    token: str | None = None,
) -> FastAPI:
    """Build the app. ``token`` overrides the one read from ``config.token_env``.

    Creates the ``verdicts`` table if the connection can write; otherwise ``/readyz``
    reports why it is not ready.
    """
    config = config or ApiConfig()
    expected = token if token is not None else os.environ.get(config.token_env)
    service = VerdictService(connection_provider, config, clock, slo_state_provider)
    app = FastAPI(
        title="llmslo API",
        summary="Canary verdicts for Argo Rollouts and Flagger, and verdict history",
        version="1",
    )
    _install_error_handlers(app)
    try:
        with closing(connection_provider()) as con:
            VerdictStore(con).migrate()
    except duckdb.Error as exc:
        log.error("cannot create the verdicts table: %s", exc)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """The process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    def readyz() -> JSONResponse:
        """Ready when the store answers and has the ``requests`` and ``verdicts`` tables."""
        try:
            with closing(connection_provider()) as con:
                found = {
                    row[0]
                    for row in con.execute(
                        "SELECT table_name FROM information_schema.tables"
                        " WHERE table_name IN ('requests', 'verdicts')"
                    ).fetchall()
                }
        except duckdb.Error as exc:
            return _error(503, f"store unavailable: {exc}")
        missing = sorted({"requests", "verdicts"} - found)
        if missing:
            return _error(503, f"missing table(s) {missing}")
        return JSONResponse({"status": "ready"})

    @app.get("/api/v1/verdict", tags=["verdicts"])
    def verdict_get(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Argo ``web`` provider (document mode): always 200 for a computed verdict.

        Parameters as a query string: ``canary_instances``/``baseline_instances``
        (comma-separated) and/or ``canary_selector``/``baseline_selector``
        (``label=value,…``), ``window`` (``10m``) and ``at`` (RFC 3339) or ``start``/``end``,
        ``min_requests``, ``namespace``, ``service``.
        """
        _check_token(expected, _bearer(authorization), config.token_env)
        document, _ = service.evaluate(_query_params(request), "argo")
        return document

    @app.post("/api/v1/verdict", tags=["verdicts"])
    def verdict_post(
        params: Annotated[dict[str, Any], Body()],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        """The same as ``GET`` with the parameters in a JSON object body."""
        _check_token(expected, _bearer(authorization), config.token_env)
        document, _ = service.evaluate(params, "argo")
        return document

    @app.post("/api/v1/flagger/{gate}", tags=["verdicts"])
    def flagger_gate(
        gate: FlaggerGate,
        payload: FlaggerPayload,
        authorization: Annotated[str | None, Header()] = None,
    ) -> JSONResponse:
        """Flagger webhook (gate mode): 200 pass, 412 fail, 409 inconclusive."""
        metadata = dict(payload.metadata)
        given = metadata.pop("token", None) or _bearer(authorization)
        _check_token(expected, given, config.token_env)
        params: dict[str, object] = {"namespace": payload.namespace, "service": payload.name}
        params.update(metadata)
        idempotency = (
            {"gate": gate, "checksum": payload.checksum, "params": params}
            if payload.checksum
            else None
        )
        document, verdict = service.evaluate(params, f"flagger/{gate}", idempotency)
        status = _GATE_STATUS[verdict]
        if verdict == "inconclusive":
            status = _GATE_STATUS[metadata.get("on_inconclusive", "inconclusive")]
        # Flagger copies the body into a Kubernetes event: keep it compact; the evidence is
        # in the stored verdict (GET /api/v1/verdicts/{id}).
        classes = {m["name"]: m["classification"] for m in document["metrics"]}
        body = {"id": document["id"], **document["summary"], "metrics": classes}
        return JSONResponse(body, status_code=status)

    @app.get("/api/v1/verdicts", tags=["verdicts"])
    def verdict_history(
        limit: Annotated[int, Query(ge=1)] = 50,
        service_name: Annotated[str | None, Query(alias="service", max_length=253)] = None,
        verdict: Literal["pass", "fail", "inconclusive"] | None = None,
    ) -> dict[str, Any]:
        """Stored verdicts, newest first, with their per-metric evidence."""
        if limit > config.history_max_limit:
            raise QueryError(f"limit: at most {config.history_max_limit}")
        rows = service.history(limit, service_name, verdict)
        return {"verdicts": [row.document for row in rows]}

    @app.get("/api/v1/verdicts/{verdict_id}", tags=["verdicts"])
    def verdict_by_id(verdict_id: Annotated[str, Path(max_length=64)]) -> dict[str, Any]:
        """One stored verdict with its per-metric evidence; 404 if there is none."""
        stored = service.by_id(verdict_id)
        if stored is None:
            raise UnknownVerdictError(f"no verdict {verdict_id!r}")
        return stored.document

    return app
