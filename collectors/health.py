"""Target health as data: one ``target_health`` row per scrape, and the readiness probe.

Every scrape's outcome (up, HTTP status, duration, error kind, process start time, counter
resets) becomes a TARGET_HEALTH row, so crashes, restarts and down targets are visible to the
SLO jobs and not only on the collector's own ``/metrics``. At ``readiness_interval_s`` the
collector also asks each engine target whether it is ready: ``GET /health`` (vLLM, SGLang,
TRT-LLM serve it; 200 = ready) and ``GET /v1/models`` (how many models are listed; a server
that is up with no model listed has failed to load it). A 404 on ``/health`` leaves
readiness to ``/v1/models``. Probes are bounded (``timeout_s``, 1 MiB body) and never raise.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.schema import TARGET_HEALTH

__all__ = ["HealthRow", "Readiness", "health_table", "probe_readiness", "process_start_of"]

#: Bodies of /health and /v1/models larger than this are not read (a model list is small).
_MAX_PROBE_BYTES = 1024 * 1024
_STATUS = re.compile(r"HTTP (\d{3})")
_PROCESS_START = "process_start_time_seconds"


@dataclass(frozen=True)
class Readiness:
    """What one readiness probe found."""

    ready: bool | None  # None: the engine serves neither endpoint
    source: str | None  # health | models
    status: int | None  # HTTP status of /health (or of /v1/models when that decided)
    models: int | None  # models listed by /v1/models; None when it did not answer 200


@dataclass
class HealthRow:
    """One scrape's outcome, as the TARGET_HEALTH row it becomes."""

    ts_ms: int
    instance: str
    target: str
    pool: str | None
    dialect: str | None
    up: bool
    http_status: int | None
    duration_s: float
    error_kind: str | None = None
    error: str | None = None
    process_start_s: float | None = None
    counter_resets: int = 0
    readiness: Readiness | None = None


def status_of(error_kind: str, message: str) -> int | None:
    """The HTTP status a failed scrape received (only ``http_status`` errors carry one)."""
    match = _STATUS.search(message) if error_kind == "http_status" else None
    return int(match.group(1)) if match else None


def process_start_of(table: pa.Table, header_start_s: float | None) -> float | None:
    """The engine's process start (Unix s) from the scrape's rows or the HTTP header."""
    if header_start_s is not None:
        return header_start_s
    if "metric" not in table.column_names or table.num_rows == 0:
        return None
    hits = table.filter(pc.equal(table["metric"].cast(pa.string()), _PROCESS_START))
    return float(hits["value"][0].as_py()) if hits.num_rows else None


def _base(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def _get(
    session: aiohttp.ClientSession, url: str, timeout_s: float
) -> tuple[int | None, bytes]:
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url) as response:
                body = await response.content.read(_MAX_PROBE_BYTES)
                return response.status, body
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None, b""


def _count_models(body: bytes) -> int | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    models = data.get("data") if isinstance(data, dict) else None
    return len(models) if isinstance(models, list) else None


async def probe_readiness(
    session: aiohttp.ClientSession, metrics_url: str, timeout_s: float
) -> Readiness:
    """Ask the engine behind ``metrics_url`` whether it is ready (see the module docstring)."""
    base = _base(metrics_url)
    (health_status, _), (models_status, body) = await asyncio.gather(
        _get(session, f"{base}/health", timeout_s), _get(session, f"{base}/v1/models", timeout_s)
    )
    models = _count_models(body) if models_status == 200 else None
    if health_status is not None and health_status != 404:
        return Readiness(health_status == 200, "health", health_status, models)
    if models_status == 200 and models is not None:
        return Readiness(models > 0, "models", models_status, models)
    return Readiness(None, None, health_status or models_status, models)


def health_table(rows: list[HealthRow]) -> pa.Table:
    """TARGET_HEALTH rows (wire schema: dictionary-encoded strings) of one round."""
    ready = [r.readiness for r in rows]
    columns = {
        "ts_ms": [r.ts_ms for r in rows],
        "instance": [r.instance for r in rows],
        "target": [r.target for r in rows],
        "pool": [r.pool for r in rows],
        "dialect": [r.dialect for r in rows],
        "up": [r.up for r in rows],
        "http_status": [r.http_status for r in rows],
        "duration_s": [r.duration_s for r in rows],
        "error_kind": [r.error_kind for r in rows],
        "error": [r.error[:200] if r.error else None for r in rows],
        "process_start_s": [r.process_start_s for r in rows],
        "counter_resets": [r.counter_resets for r in rows],
        "ready": [x.ready if x else None for x in ready],
        "ready_source": [x.source if x else None for x in ready],
        "ready_status": [x.status if x else None for x in ready],
        "models": [x.models if x else None for x in ready],
    }
    return pa.Table.from_pydict(columns, schema=TARGET_HEALTH.arrow)
