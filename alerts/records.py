"""Alert state changes as rows of the ``alerts`` topic and table (``pipeline.schema.ALERTS``).

A row is written when an alert starts firing and when it is resolved, not on re-sends.
``fingerprint`` is a stable hash of the labels, so one alert's rows share it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from alerts.push import ActiveAlert
from pipeline.schema import ALERTS
from pipeline.store import insert_arrow

__all__ = ["AlertChange", "alert_rows", "fingerprint", "table_writer"]


def fingerprint(labels: Mapping[str, str]) -> str:
    """16 hex digits of SHA-256 over the sorted labels (stable across processes and runs)."""
    text = json.dumps(dict(sorted(labels.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AlertChange:
    """One alert that started firing or was resolved at ``ts_ms`` (event time)."""

    ts_ms: int
    state: str  # firing | resolved
    alert: ActiveAlert
    starts_ts_ms: int


def alert_rows(changes: Iterable[AlertChange]) -> pa.Table:
    """ALERTS rows (storage schema) for publishing or storing; ``ends_ts_ms`` is set on
    resolved rows only."""
    items = list(changes)
    columns = {
        "ts_ms": [c.ts_ms for c in items],
        "fingerprint": [fingerprint(c.alert.labels) for c in items],
        "alertname": [c.alert.labels.get("alertname", "") for c in items],
        "state": [c.state for c in items],
        "severity": [c.alert.labels.get("severity") for c in items],
        "labels_json": [json.dumps(dict(c.alert.labels), sort_keys=True) for c in items],
        "annotations_json": [json.dumps(dict(c.alert.annotations), sort_keys=True) for c in items],
        "starts_ts_ms": [c.starts_ts_ms for c in items],
        "ends_ts_ms": [c.ts_ms if c.state == "resolved" else None for c in items],
        "generator_url": [c.alert.generator_url or None for c in items],
    }
    return pa.Table.from_pydict(columns, schema=ALERTS.storage_arrow)


def table_writer(con: duckdb.DuckDBPyConnection) -> Callable[[pa.Table], None]:
    """A record sink that inserts ALERTS rows straight into the ``alerts`` table of ``con``
    (``llmslo jobs`` without a bus; in ``llmslo run`` the rows go through Kafka instead)."""

    def write(rows: pa.Table) -> None:
        insert_arrow(con, ALERTS.table, rows)

    return write
