"""Per-minute and per-hour rollups in DuckDB: SLO good/total counts and request-record digests.

:mod:`slo.rollups.counts` keeps each SLO's good/total counts per (pool, instance, tenant, route)
(the SQL per SLI kind in ``_sli_sql``; :func:`outcome_class_sql` renders an SLI's outcome
classes, :mod:`slo.spec.outcomes`); :mod:`slo.rollups.requests` keeps latency digests and
outcome counts of the taps' request records, for long-range reads.
"""

from __future__ import annotations

from slo.rollups._sli_sql import outcome_class_sql
from slo.rollups.counts import (
    ROLLUP_TABLES,
    Rollup,
    RollupStats,
    create_rollup_tables,
)
from slo.rollups.requests import (
    BIN_GAMMA,
    MAX_S,
    MIN_S,
    RELATIVE_ERROR,
    REQUEST_ROLLUP_VERSION,
    RETRY_LOOKBACK_MS,
    RequestCoverage,
    RequestRollup,
    bin_value_sql,
    create_request_rollup_tables,
    latency_minutes_sql,
    outcome_minutes_sql,
    read_coverage,
    rollup_history,
)

__all__ = [
    "BIN_GAMMA",
    "MAX_S",
    "MIN_S",
    "RELATIVE_ERROR",
    "REQUEST_ROLLUP_VERSION",
    "RETRY_LOOKBACK_MS",
    "ROLLUP_TABLES",
    "RequestCoverage",
    "RequestRollup",
    "Rollup",
    "RollupStats",
    "bin_value_sql",
    "create_request_rollup_tables",
    "create_rollup_tables",
    "latency_minutes_sql",
    "outcome_class_sql",
    "outcome_minutes_sql",
    "read_coverage",
    "rollup_history",
]
