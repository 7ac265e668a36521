"""The read API of the SLO tables and the raw tables behind them: one function per question.

What the dashboards, the HTTP API and the alert pusher ask, each answered as an Arrow
table with a declared schema (the ``*_SCHEMA`` constants; an empty answer has the same
columns). Every function takes a DuckDB connection first: a cursor of the writer's
connection (``store.con.cursor()`` inside ``llmslo run``: DuckDB lets no other process
open a file that one process writes) or a read-only connection to a file nobody writes.
A table the jobs have not created yet reads as empty (:func:`present_tables` says which
exist). The raw-series reads (``engine_series``, ``gpu_series``) live in
:mod:`slo.queries.series`, the alerts' and drills' in :mod:`slo.queries.alerts`, every SLO
group's alert state over time (``slo_alert_spans``) in :mod:`slo.queries.alert_spans`; all
are re-exported here.

Values are always bound parameters; column names come from fixed tables here. Ranges are
``[start_ms, end_ms)`` in Unix epoch ms, at most 90 days; buckets are whole seconds (whole
minutes for ``budget_series``, ``slo_series`` and ``slo_alert_spans``, read from per-minute rollups) starting at multiples of
``bucket_ms`` since the epoch, at most 5,000 per series; listings
return at most ``limit`` (≤ 10,000) rows. A bad parameter raises
:class:`pipeline.errors.QueryError` naming it (see :mod:`slo.queries._params`).
"""

from __future__ import annotations

from slo.queries._params import MAX_POINTS, MAX_RANGE_MS
from slo.queries.reads import (
    ALERT_SPANS_SCHEMA,
    ALERTS_SCHEMA,
    BUDGET_SCHEMA,
    DRILLS_SCHEMA,
    ENGINE_SERIES_SCHEMA,
    FINDINGS_SCHEMA,
    FLAGS_SCHEMA,
    GHOSTS_SCHEMA,
    GPU_SERIES_SCHEMA,
    LATENCY_SCHEMA,
    OUTCOMES_SCHEMA,
    SLO_SERIES_SCHEMA,
    STATUS_SCHEMA,
    alerts,
    budget_series,
    current_flags,
    drills,
    engine_series,
    findings,
    flag_timeline,
    ghost_counts,
    gpu_series,
    last_heartbeat,
    latency_percentiles,
    meta,
    open_findings,
    outcome_counts,
    present_tables,
    slo_alert_spans,
    slo_series,
    slo_status,
)

__all__ = [
    "ALERTS_SCHEMA",
    "ALERT_SPANS_SCHEMA",
    "BUDGET_SCHEMA",
    "DRILLS_SCHEMA",
    "ENGINE_SERIES_SCHEMA",
    "FINDINGS_SCHEMA",
    "FLAGS_SCHEMA",
    "GHOSTS_SCHEMA",
    "GPU_SERIES_SCHEMA",
    "LATENCY_SCHEMA",
    "MAX_POINTS",
    "MAX_RANGE_MS",
    "OUTCOMES_SCHEMA",
    "SLO_SERIES_SCHEMA",
    "STATUS_SCHEMA",
    "alerts",
    "budget_series",
    "current_flags",
    "drills",
    "engine_series",
    "findings",
    "flag_timeline",
    "ghost_counts",
    "gpu_series",
    "last_heartbeat",
    "latency_percentiles",
    "meta",
    "open_findings",
    "outcome_counts",
    "present_tables",
    "slo_alert_spans",
    "slo_series",
    "slo_status",
]
