"""Every SLO's burn rate per bucket at once: what the Fleet page's burn-rate strip draws
(re-exported by :mod:`slo.queries`).

One read of the SLO rollups for all SLOs, where :func:`slo.queries.budget_series` reads one
SLO: a fleet of 256 instances × several SLOs asks one query, not one per SLO. Same
conventions as the rest of :mod:`slo.queries`.
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb
import pyarrow as pa

from pipeline.units import HOUR_MS
from slo.queries._params import check_choice, check_minute_grid, check_text
from slo.queries._schemas import BURN_SCHEMA
from slo.queries._sql import run_query

__all__ = ["slo_burn_series"]

_GROUP_COLUMNS = ("pool", "instance", "tenant", "route")


def slo_burn_series(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    group: Mapping[str, str] | None = None,
) -> pa.Table:
    """Events, bad events, error ratio and burn rate per bucket of every evaluated SLO.

    Summed over the SLO's groups (``group`` narrows to groups whose ``pool``/``instance``/
    ``tenant``/``route`` equal the given values); ``burn_rate`` = error_ratio / (1 −
    objective), the objective from the SLO's last evaluation (``slo_status_current``), so
    an SLO that was never evaluated is left out. Buckets without events are absent. Reads
    ``slo_hour`` when buckets are whole hours, else ``slo_minute``; ordered by SLO and time.
    """
    grid = check_minute_grid(start_ms, end_ms, bucket_ms)
    where, params = "", list[object]()
    for column, value in sorted((group or {}).items()):
        check_choice("group", column, _GROUP_COLUMNS)
        where += f" AND {column} = ?"
        params.append(check_text(f"group.{column}", value))
    source = "slo_hour" if grid.bucket_ms % HOUR_MS == 0 else "slo_minute"
    sql = f"""
        WITH objectives AS (
            SELECT slo_id, max((status_json->>'objective')::DOUBLE) AS objective
            FROM slo_status_current GROUP BY slo_id
        ), buckets AS (
            SELECT slo_id, ts_ms // ? * ? AS bucket_ts_ms, sum(total) AS total, sum(bad) AS bad
            FROM {source}
            WHERE ts_ms >= ? AND ts_ms < ?
              AND key_id IN (SELECT key_id FROM slo_keys WHERE true{where})
            GROUP BY ALL HAVING sum(total) > 0
        )
        SELECT b.bucket_ts_ms, b.slo_id, b.total, b.bad, b.bad / b.total,
               b.bad / b.total / (1 - o.objective)
        FROM buckets AS b JOIN objectives AS o USING (slo_id)
        ORDER BY b.slo_id, b.bucket_ts_ms"""
    bound = [grid.bucket_ms, grid.bucket_ms, grid.start_ms, grid.end_ms, *params]
    tables = [source, "slo_keys", "slo_status_current"]
    return run_query(con, BURN_SCHEMA, tables, sql, bound)
