"""Factories for rows in the spine's schemas: request records, engine and GPU samples.

Rows are built as dicts with realistic defaults and converted to Arrow tables in the exact
schema, then inserted into a real DuckDB store, so the SLO jobs read what ingest writes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from pipeline.schema import (
    ENGINE_SAMPLES,
    GPU_SAMPLES,
    REQUEST_RECORDS,
    TARGET_HEALTH,
    RecordSchema,
)
from pipeline.store import Store

T0_MS = 1_790_000_000_000 - (1_790_000_000_000 % 3_600_000)  # an hour boundary in 2026
_ids = itertools.count()


def request(ts_ms: int, **overrides: Any) -> dict[str, Any]:
    """A successful streamed chat completion on pod 10.0.0.1:8000 (override anything)."""
    rid = f"r{next(_ids)}"
    row: dict[str, Any] = {
        "request_id": rid,
        "original_request_id": rid,
        "attempt": 1,
        "tap_id": "tap-0",
        "instance": "10.0.0.1:8000",
        "pool": "llama-3-8b",
        "model": "llama-3-8b",
        "tenant": "acme",
        "route": "/v1/chat/completions",
        "streamed": True,
        "received_ts_ms": ts_ms,
        "deadline_ts_ms": None,
        "http_status": 200,
        "outcome": "ok",
        "error_kind": None,
        "finish_reason": "stop",
        "ttfb_s": 0.2,
        "ttft_s": 0.3,
        "tpot_s": 0.03,
        "e2e_s": 3.3,
        "prompt_tokens": 500,
        "completion_tokens": 101,
        "token_chunks": 100,
        "itl_count": 99,
        "itl_mean_s": 0.03,
        "itl_p50_s": 0.029,
        "itl_p90_s": 0.035,
        "itl_p99_s": 0.045,
        "itl_max_s": 0.05,
        "itl_jitter_s": 0.016,
        "itl_histogram": None,
        "itl_gaps_s": None,
        "chunk_tokens": None,
        "client_disconnected": False,
        "disconnect_ts_ms": None,
        "upstream_closed_ts_ms": None,
        "tokens_after_disconnect": None,
    }
    row.update(overrides)
    return row


def engine_sample(ts_ms: int, signal: str, value: float, **overrides: Any) -> dict[str, Any]:
    """One canonical engine sample (gauge unless told otherwise) of a vLLM pod."""
    row: dict[str, Any] = {
        "ts_ms": ts_ms,
        "instance": "10.0.0.1:8000",
        "pool": "llama-3-8b",
        "dialect": "vllm",
        "model": "llama-3-8b",
        "engine": "0",
        "metric": f"vllm:{signal}",
        "signal": signal,
        "kind": "gauge",
        "le": None,
        "labels_json": "{}",
        "value": float(value),
    }
    row.update(overrides)
    return row


def gpu_sample(ts_ms: int, signal: str, value: float, **overrides: Any) -> dict[str, Any]:
    """One dcgm-exporter sample for GPU 0 of node-0, allocated to pod 10.0.0.1:8000."""
    row: dict[str, Any] = {
        "ts_ms": ts_ms,
        "instance": "node-0:9400",
        "hostname": "node-0",
        "gpu": 0,
        "uuid": "GPU-0",
        "device": "nvidia0",
        "gpu_model": "NVIDIA H100",
        "gpu_instance_id": None,
        "pod": "10.0.0.1:8000",
        "namespace": "serving",
        "container": "engine",
        "metric": f"DCGM_{signal}",
        "signal": signal,
        "labels_json": "{}",
        "value": float(value),
    }
    row.update(overrides)
    return row


def health_row(ts_ms: int, **overrides: Any) -> dict[str, Any]:
    """One successful scrape of pod 10.0.0.1:8000 (no readiness probe unless told)."""
    row: dict[str, Any] = {
        "ts_ms": ts_ms,
        "instance": "10.0.0.1:8000",
        "target": "http://10.0.0.1:8000/metrics",
        "pool": None,
        "dialect": "vllm",
        "up": True,
        "http_status": 200,
        "duration_s": 0.01,
        "error_kind": None,
        "error": None,
        "process_start_s": None,
        "counter_resets": 0,
        "ready": None,
        "ready_source": None,
        "ready_status": None,
        "models": None,
    }
    row.update(overrides)
    return row


def histogram(
    ts_ms: int,
    signal: str,
    bounds: Iterable[float],
    cumulative: Mapping[float, float],
    count: float,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Bucket rows (cumulative counts per bound, +Inf = count) and the count row of one scrape."""
    rows = [
        engine_sample(ts_ms, signal, cumulative.get(le, 0.0), kind="bucket", le=le, **overrides)
        for le in bounds
    ]
    rows.append(engine_sample(ts_ms, signal, count, kind="bucket", le=float("inf"), **overrides))
    rows.append(engine_sample(ts_ms, signal, count, kind="count", **overrides))
    return rows


def to_table(schema: RecordSchema, rows: list[dict[str, Any]]) -> pa.Table:
    arrays = {f.name: [r.get(f.name) for r in rows] for f in schema.storage_arrow}
    return pa.Table.from_pydict(arrays, schema=schema.storage_arrow)


def insert(
    store: Store,
    requests: Iterable[dict[str, Any]] = (),
    engine: Iterable[dict[str, Any]] = (),
    gpu: Iterable[dict[str, Any]] = (),
    health: Iterable[dict[str, Any]] = (),
) -> None:
    """Insert rows the way the ingester does (Arrow append, one transaction)."""
    tables: dict[str, Any] = {}
    for schema, rows in (
        (REQUEST_RECORDS, list(requests)),
        (ENGINE_SAMPLES, list(engine)),
        (GPU_SAMPLES, list(gpu)),
        (TARGET_HEALTH, list(health)),
    ):
        if rows:
            table = to_table(schema, rows)
            tables[schema.table] = [table]
    store.commit_batch(tables, group_id="test", offsets={}, now_ts_ms=0)


def labels(**kv: str) -> str:
    return json.dumps(kv, sort_keys=True)
