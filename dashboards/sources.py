"""Where the dashboards read from: a DuckDB file nobody writes, or a running ``llmslo run``.

Both sources answer the same questions (the :mod:`slo.queries` function names, plus
``verdicts``) with the same :class:`pyarrow.Table` the query function returns, and a
:class:`Meta` for the filters. DuckDB lets no other process open a file one process writes,
so a live pipeline is read through its HTTP API (:class:`ApiSource`); a copy or a history
file is opened read-only (:class:`DuckDBSource`).

The read-API contract (shared with ``api/``): ``GET`` routes below, query parameters named
like the query function's keywords (lists repeat, ``group`` repeats as ``key:value``, times
in epoch ms), Arrow IPC stream when ``Accept: application/vnd.apache.arrow.stream``; a bad
parameter is a 400 ``{"error", "parameter"}``, raised here as :class:`QueryError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import duckdb
import httpx
import pyarrow as pa

from pipeline.errors import LlmsloError, QueryError
from slo import queries

__all__ = [
    "ARROW_STREAM",
    "GPU_PODS_ENV",
    "QUESTIONS",
    "ROUTES",
    "SOURCE_ENV",
    "ApiSource",
    "DataSource",
    "DuckDBSource",
    "Meta",
    "SourceError",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
#: Environment variable naming the dashboards' source: ``db:PATH`` or ``api:URL``.
SOURCE_ENV = "LLMSLO_DASHBOARD_SOURCE"
#: Environment variable with the SLO config's ``detectors.gpu_pods`` (JSON object, dcgm pod
#: label → engine instance) for a DuckDB source; an API source's server applies its own.
GPU_PODS_ENV = "LLMSLO_DASHBOARD_GPU_PODS"

#: Question name → route of the read API (``{slo_id}`` is filled from the parameters).
ROUTES: Mapping[str, str] = {
    "slo_status": "/api/v1/slos",
    "budget_series": "/api/v1/slos/{slo_id}/budget",
    "slo_series": "/api/v1/slos/series",
    "slo_alert_spans": "/api/v1/slos/alert-spans",
    "findings": "/api/v1/findings",
    "open_findings": "/api/v1/findings/open",
    "current_flags": "/api/v1/flags",
    "flag_timeline": "/api/v1/flags/timeline",
    "latency_percentiles": "/api/v1/latency",
    "outcome_counts": "/api/v1/outcomes",
    "ghost_counts": "/api/v1/ghosts",
    "engine_series": "/api/v1/engines",
    "gpu_series": "/api/v1/gpus",
    "verdicts": "/api/v1/verdicts",
}
QUESTIONS = tuple(ROUTES)
QueryValue = str | int | float | bool | None
_META_ROUTE = "/api/v1/meta"


class SourceError(LlmsloError):
    """The source cannot be read: file missing or locked, API down or answering garbage."""


@dataclass(frozen=True)
class Meta:
    """What the filters offer: the data's time span (epoch ms, ``None`` when empty), pools,
    instances (``instance``, ``pool`` and, once targets carry it, ``address``) and SLO ids."""

    data_start_ms: int | None = None
    data_end_ms: int | None = None
    pools: tuple[str, ...] = ()
    instances: tuple[dict[str, str | None], ...] = ()
    slos: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Meta:
        """From the API's ``/api/v1/meta`` body (unknown keys kept in ``extra``)."""
        known = {"data_start_ms", "data_end_ms", "pools", "instances", "slos"}
        return cls(
            data_start_ms=body.get("data_start_ms"),
            data_end_ms=body.get("data_end_ms"),
            pools=tuple(body.get("pools") or ()),
            instances=tuple(dict(i) for i in body.get("instances") or ()),
            slos=tuple(body.get("slos") or ()),
            extra={k: v for k, v in body.items() if k not in known},
        )


class DataSource(Protocol):
    """One place the dashboards read from. ``key`` identifies it in caches."""

    key: str

    def meta(self) -> Meta:
        """Time span, pools, instances and SLOs of the data."""
        ...

    def table(self, question: str, **params: Any) -> pa.Table:
        """The answer to ``question`` (a name in :data:`QUESTIONS`) as an Arrow table.

        Raises :class:`QueryError` (naming the parameter) for a bad parameter and
        :class:`SourceError` when the source cannot be read.
        """
        ...

    def verdict_document(self, verdict_id: str) -> dict[str, Any] | None:
        """One stored canary verdict with its per-metric evidence; ``None`` if unknown."""
        ...


def read_meta(con: duckdb.DuckDBPyConnection) -> Meta:
    """:class:`Meta` of a DuckDB file: what ``/api/v1/meta`` answers (``slo.queries.meta``)."""
    return Meta.from_json(queries.meta(con))


def read_verdicts(con: duckdb.DuckDBPyConnection, *, limit: int = 200) -> pa.Table:
    """Canary verdicts, newest first (the ``verdicts`` table ``api/`` writes); empty if none."""
    if "verdicts" not in queries.present_tables(con):
        return pa.table({"verdict_id": pa.array([], pa.string())})
    # Rows without their documents, as the API's history answers; one document at a time
    # comes from verdict_document().
    sql = "SELECT * EXCLUDE (document_json) FROM verdicts ORDER BY evaluated_ts_ms DESC LIMIT ?"
    table: pa.Table = con.sql(sql, params=[limit]).to_arrow_table()
    return table


_QUERY_FUNCTIONS: Mapping[str, Callable[..., pa.Table]] = {
    name: getattr(queries, name) for name in QUESTIONS if name != "verdicts"
}


class DuckDBSource:
    """A DuckDB file nobody writes, opened read-only once; each question runs on a cursor.

    ``gpu_pods`` (dcgm pod label → engine instance) joins GPUs to engines in ``gpu_series``
    as ``/api/v1/gpus`` does. Raises :class:`SourceError` when the file is missing or
    another process holds it.
    """

    def __init__(self, path: Path | str, *, gpu_pods: Mapping[str, str] | None = None) -> None:
        self.path = Path(path)
        self._gpu_pods = dict(gpu_pods or {})
        self.key = f"db:{self.path.resolve()}"
        if not self.path.exists():
            raise SourceError(f"{self.path}: no such DuckDB file")
        try:
            self._con = duckdb.connect(str(self.path), read_only=True)
        except duckdb.Error as exc:
            raise SourceError(
                f"{self.path}: cannot open read-only ({exc}); while `llmslo run` writes it, "
                "use --api instead"
            ) from exc
        self._lock = threading.Lock()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:  # Streamlit runs sessions in threads; cursors are per thread.
            return self._con.cursor()

    def meta(self) -> Meta:
        return read_meta(self._cursor())

    def table(self, question: str, **params: Any) -> pa.Table:
        cursor = self._cursor()
        try:
            if question == "verdicts":
                return read_verdicts(cursor, **params)
            if question == "gpu_series":
                params = {**params, "gpu_pods": self._gpu_pods}
            return _QUERY_FUNCTIONS[question](cursor, **params)
        finally:
            cursor.close()

    def verdict_document(self, verdict_id: str) -> dict[str, Any] | None:
        cursor = self._cursor()
        try:
            if "verdicts" not in queries.present_tables(cursor):
                return None
            row = cursor.execute(
                "SELECT document_json FROM verdicts WHERE verdict_id = ?", [verdict_id]
            ).fetchone()
        finally:
            cursor.close()
        document = json.loads(row[0]) if row else None
        return document if isinstance(document, dict) else None

    def close(self) -> None:
        self._con.close()


def _query_string(params: Mapping[str, Any]) -> list[tuple[str, QueryValue]]:
    """Parameters as the contract's query string: lists repeat, ``group`` is ``key:value``."""
    items: list[tuple[str, QueryValue]] = []
    for name, value in params.items():
        if value is None:
            continue
        if name == "group":
            items += [("group", f"{k}:{v}") for k, v in sorted(dict(value).items())]
        elif isinstance(value, (list, tuple)):
            items += [(name, str(v)) for v in value]
        elif isinstance(value, bool):
            items.append((name, "true" if value else "false"))
        else:
            items.append((name, str(value)))
    return items


class ApiSource:
    """The read API of a running ``llmslo run`` at ``base_url`` (Arrow IPC for every table).

    ``transport`` is for tests only (an ``httpx`` transport); timeouts are ``timeout_s``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = f"api:{self.base_url}"
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout_s, transport=transport, trust_env=False
        )

    def _get(self, route: str, params: list[tuple[str, QueryValue]], accept: str) -> httpx.Response:
        try:
            response = self._client.get(route, params=params, headers={"Accept": accept})
        except httpx.HTTPError as exc:
            raise SourceError(f"{self.base_url}{route}: {exc}") from exc
        if response.status_code == 400:
            body = _json_or_empty(response)
            raise QueryError(str(body.get("parameter", "?")), str(body.get("error", body)))
        if response.status_code != 200:
            raise SourceError(
                f"{self.base_url}{route}: HTTP {response.status_code} {response.text[:200]}"
            )
        return response

    def meta(self) -> Meta:
        body = _json_or_empty(self._get(_META_ROUTE, [], "application/json"))
        return Meta.from_json(body)

    def table(self, question: str, **params: Any) -> pa.Table:
        route = ROUTES[question]
        if "{slo_id}" in route:
            route = route.format(slo_id=quote(str(params.pop("slo_id")), safe=""))
        response = self._get(route, _query_string(params), ARROW_STREAM)
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith(ARROW_STREAM):
            raise SourceError(f"{self.base_url}{route}: expected Arrow, got {content_type!r}")
        try:
            return pa.ipc.open_stream(response.content).read_all()
        except pa.ArrowInvalid as exc:
            raise SourceError(f"{self.base_url}{route}: undecodable Arrow stream ({exc})") from exc

    def verdict_document(self, verdict_id: str) -> dict[str, Any] | None:
        route = f"/api/v1/verdicts/{quote(verdict_id, safe='')}"
        try:
            response = self._client.get(route, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise SourceError(f"{self.base_url}{route}: {exc}") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise SourceError(f"{self.base_url}{route}: HTTP {response.status_code}")
        return _json_or_empty(response)

    def close(self) -> None:
        self._client.close()


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
