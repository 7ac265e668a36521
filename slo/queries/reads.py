"""The read functions of :mod:`slo.queries` over the SLO tables (status, budgets, findings, flags)
and the request records (latency, outcomes, ghosts); see the package for the conventions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import duckdb
import pyarrow as pa

from pipeline.units import HOUR_MS, MINUTE_MS
from slo.queries._params import (
    check_choice,
    check_fraction,
    check_grid,
    check_limit,
    check_range,
    check_seconds,
    check_text,
    check_ts_ms,
)
from slo.queries._request_reads import RequestScope, latency_sql, outcome_sql, request_names_sql
from slo.queries._schemas import (
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
)
from slo.queries._sql import optional_equal as _optional
from slo.queries._sql import present_tables
from slo.queries._sql import run_query as _run
from slo.queries.alert_spans import slo_alert_spans
from slo.queries.alerts import alerts, drills, last_heartbeat
from slo.queries.series import engine_series, gpu_series
from slo.request_sources import REQUEST_SOURCES, RequestSource, source_filter
from slo.spec.document import GROUP_DIMENSIONS

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

LatencyMetric = Literal["ttft", "tpot", "itl", "e2e"]
Breakdown = Literal["pool", "instance"]


def slo_status(con: duckdb.DuckDBPyConnection, *, slo_id: str | None = None) -> pa.Table:
    """Every SLO group's status at the last evaluation (``slo_status_current``).

    ``sli`` is the period's good ratio, ``budget_remaining`` a fraction of the budget (may be
    negative), ``burn_rates_json`` the burn rate per window, ``alerting`` whether any alert
    window pair fires. Ordered by ``slo_id`` and group.
    """
    where, params = _optional("slo_id", slo_id, "slo_id")
    sql = f"""
        SELECT slo_id, group_json, ts_ms, status_json->>'name', (status_json->>'objective')::DOUBLE,
               (status_json->>'sli')::DOUBLE, (status_json->>'events')::BIGINT,
               (status_json->>'bad')::BIGINT, (status_json->>'budget_remaining')::DOUBLE,
               (status_json->'burn_rates')::VARCHAR,
               coalesce(list_contains(CAST(json_extract(status_json, '$.pairs[*].alerting') AS BOOLEAN[]), true), false),
               status_json
        FROM slo_status_current WHERE true{where} ORDER BY slo_id, group_json"""
    return _run(con, STATUS_SCHEMA, ["slo_status_current"], sql, params)


def budget_series(
    con: duckdb.DuckDBPyConnection,
    *,
    slo_id: str,
    objective: float,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    group: Mapping[str, str] | None = None,
) -> pa.Table:
    """Events, error ratio, burn rate and budget left per bucket of one SLO.

    ``burn_rate`` = error_ratio / (1 − ``objective``); ``budget_remaining`` is cumulative
    from ``start_ms``: 1 − Σbad / ((1 − objective) · Σtotal). Buckets without events are
    absent (no NaN). ``group`` narrows to groups whose ``pool``/``instance``/``tenant``/
    ``route`` equal the given values. Reads ``slo_hour`` when buckets are whole hours,
    else ``slo_minute`` (kept 35 days by default), so buckets are whole minutes.
    """
    slo = check_text("slo_id", slo_id)
    allowed = 1.0 - check_fraction("objective", objective, low=0.0, high=1.0)
    grid = check_grid(start_ms, end_ms, bucket_ms, unit_ms=MINUTE_MS)
    where, params = "", list[object]()
    for column, value in sorted((group or {}).items()):
        check_choice("group", column, GROUP_DIMENSIONS)
        where += f" AND {column} = ?"
        params.append(check_text(f"group.{column}", value))
    source = "slo_hour" if grid.bucket_ms % HOUR_MS == 0 else "slo_minute"
    sql = f"""
        WITH buckets AS (
            SELECT ts_ms // ? * ? AS bucket_ts_ms, sum(total) AS total, sum(bad) AS bad
            FROM {source}
            WHERE slo_id = ? AND ts_ms >= ? AND ts_ms < ?
              AND key_id IN (SELECT key_id FROM slo_keys WHERE slo_id = ?{where})
            GROUP BY ALL HAVING sum(total) > 0
        )
        SELECT bucket_ts_ms, total, bad, bad / total, bad / total / ?,
               1 - sum(bad) OVER w / (? * sum(total) OVER w)
        FROM buckets WINDOW w AS (ORDER BY bucket_ts_ms) ORDER BY bucket_ts_ms"""
    bound = [grid.bucket_ms, grid.bucket_ms, slo, grid.start_ms, grid.end_ms, slo, *params]
    return _run(con, BUDGET_SCHEMA, [source, "slo_keys"], sql, [*bound, allowed, allowed])


def slo_series(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    slo_id: str | None = None,
) -> pa.Table:
    """Events and bad events per bucket of every SLO × group (of ``slo_id`` only if given),
    in one read where :func:`budget_series` reads one group: what a picture of every
    group's burn over time needs.

    One row per SLO, group key (``pool``, ``instance``, ``tenant``, ``route``; ``''`` where
    the SLO does not group by it) and bucket with events; ordered by SLO, key and bucket.
    :func:`budget_series` of a group is the sum, per bucket, of the rows whose key columns
    equal the group's values. Reads ``slo_hour`` when buckets are whole hours, else
    ``slo_minute``, so buckets are whole minutes.
    """
    grid = check_grid(start_ms, end_ms, bucket_ms, unit_ms=MINUTE_MS)
    where, params = _optional("s.slo_id", slo_id, "slo_id")
    source = "slo_hour" if grid.bucket_ms % HOUR_MS == 0 else "slo_minute"
    sql = f"""
        SELECT s.slo_id, k.pool, k.instance, k.tenant, k.route, s.ts_ms // ? * ? AS bucket_ts_ms,
               sum(s.total), sum(s.bad)
        FROM {source} s JOIN slo_keys k ON k.key_id = s.key_id AND k.slo_id = s.slo_id
        WHERE s.ts_ms >= ? AND s.ts_ms < ?{where}
        GROUP BY ALL HAVING sum(s.total) > 0
        ORDER BY s.slo_id, k.pool, k.instance, k.tenant, k.route, bucket_ts_ms"""
    bound = [grid.bucket_ms, grid.bucket_ms, grid.start_ms, grid.end_ms, *params]
    return _run(con, SLO_SERIES_SCHEMA, [source, "slo_keys"], sql, bound)


def findings(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    signal: str | None = None,
    scope_id: str | None = None,
    state: Literal["firing", "resolved"] | None = None,
    limit: int = 1_000,
) -> pa.Table:
    """Findings that started or ended in the range, newest first, with their evidence (JSON)."""
    start, end = check_range(start_ms, end_ms)
    params: list[object] = [start, end]
    where = ""
    for column, value in (("signal", signal), ("scope_id", scope_id)):
        clause, values = _optional(column, value, column)
        where, params = where + clause, params + values
    if state is not None:
        where += " AND state = ?"
        params.append(check_choice("state", state, ("firing", "resolved")))
    sql = f"""
        SELECT ts_ms, state, signal, scope, scope_id, pool, severity, basis, evidence_json
        FROM slo_findings WHERE ts_ms >= ? AND ts_ms < ?{where}
        ORDER BY ts_ms DESC, signal, scope_id LIMIT ?"""
    return _run(con, FINDINGS_SCHEMA, ["slo_findings"], sql, [*params, check_limit(limit)])


def open_findings(con: duckdb.DuckDBPyConnection, *, at_ms: int | None = None) -> pa.Table:
    """Findings firing at ``at_ms`` (default: now in the data): each signal × scope whose
    last state change up to then is ``firing``. Ordered by signal and scope id."""
    where, params = "", []
    if at_ms is not None:
        where, params = " WHERE ts_ms <= ?", [check_ts_ms("at_ms", at_ms)]
    sql = f"""
        SELECT * FROM (
            SELECT ts_ms, state, signal, scope, scope_id, pool, severity, basis, evidence_json
            FROM slo_findings{where}
            QUALIFY row_number() OVER (PARTITION BY signal, scope, scope_id ORDER BY ts_ms DESC) = 1
        ) WHERE state = 'firing' ORDER BY signal, scope_id"""
    return _run(con, FINDINGS_SCHEMA, ["slo_findings"], sql, params)


def flag_timeline(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    scope: Literal["pool", "instance"] | None = None,
    scope_id: str | None = None,
    limit: int = 1_000,
) -> pa.Table:
    """Degradation-level transitions in the range, oldest first (the newest ``limit``)."""
    start, end = check_range(start_ms, end_ms)
    params: list[object] = [start, end]
    where = ""
    if scope is not None:
        where += " AND scope = ?"
        params.append(check_choice("scope", scope, ("pool", "instance")))
    clause, values = _optional("scope_id", scope_id, "scope_id")
    sql = f"""
        SELECT * FROM (
            SELECT ts_ms, scope, scope_id, pool, from_level, to_level, reason, evidence_json
            FROM flag_transitions WHERE ts_ms >= ? AND ts_ms < ?{where}{clause}
            ORDER BY ts_ms DESC, scope_id LIMIT ?
        ) ORDER BY ts_ms, scope_id"""
    params += [*values, check_limit(limit)]
    return _run(con, FLAGS_SCHEMA, ["flag_transitions"], sql, params)


def current_flags(
    con: duckdb.DuckDBPyConnection,
    *,
    scope: Literal["pool", "instance"] | None = None,
    at_ms: int | None = None,
) -> pa.Table:
    """The level of every scope at ``at_ms`` (default: its last transition): one row per scope,
    the transition that set it (``ts_ms`` = since when, ``to_level`` = the level)."""
    where, params = "WHERE true", list[object]()
    if scope is not None:
        where += " AND scope = ?"
        params.append(check_choice("scope", scope, ("pool", "instance")))
    if at_ms is not None:
        where += " AND ts_ms <= ?"
        params.append(check_ts_ms("at_ms", at_ms))
    sql = f"""
        SELECT ts_ms, scope, scope_id, pool, from_level, to_level, reason, evidence_json
        FROM flag_transitions {where}
        QUALIFY row_number() OVER (PARTITION BY scope, scope_id ORDER BY ts_ms DESC) = 1
        ORDER BY scope, scope_id"""
    return _run(con, FLAGS_SCHEMA, ["flag_transitions"], sql, params)


def _request_filter(
    start_ms: int, end_ms: int, bucket_ms: int, pool: str | None, instance: str | None
) -> tuple[int, str, list[object]]:
    grid = check_grid(start_ms, end_ms, bucket_ms)
    where = f"received_ts_ms >= ? AND received_ts_ms < ? AND {source_filter()}"
    params: list[object] = [grid.start_ms, grid.end_ms]
    for column, value in (("pool", pool), ("instance", instance)):
        clause, values = _optional(column, value, column)
        where, params = where + clause, params + values
    return grid.bucket_ms, where, params


def _request_scope(
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    by: object,
    pool: object,
    instance: object,
    source: object,
) -> RequestScope:
    return RequestScope(
        check_grid(start_ms, end_ms, bucket_ms),
        check_choice("by", by, ("pool", "instance")),
        None if pool is None else check_text("pool", pool),
        None if instance is None else check_text("instance", instance),
        check_choice("source", source, REQUEST_SOURCES),
    )


def latency_percentiles(
    con: duckdb.DuckDBPyConnection,
    *,
    metric: LatencyMetric,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    by: Breakdown = "pool",
    pool: str | None = None,
    instance: str | None = None,
    source: RequestSource = "tap",
) -> pa.Table:
    """Mean, p50, p90, p99 and max of one latency (seconds) per bucket and pool or instance.

    From request records received in the range: TTFT, TPOT and E2E one value per attempt
    that has it; ITL every gap between token chunks (chunk-weighted, DESIGN §3). ``source``
    ``tap`` (default) reads the users' requests as the stream taps saw them; ``probe`` the
    synthetic prober's (its ``instance`` is the probed entry point; it records no ITL).
    Where the request rollups reach (:mod:`slo.rollups.requests`, tap records only),
    percentiles come from its log bins: within 1 % (relative) of the sample of rank
    ⌊q·(n − 1)⌋; count, mean and max stay exact. Elsewhere, and for probe records, they are
    exact (``quantile_cont``). Raises :class:`QueryError` for an unknown ``source``.
    """
    name = check_choice("metric", metric, ("ttft", "tpot", "itl", "e2e"))
    scope = _request_scope(start_ms, end_ms, bucket_ms, by, pool, instance, source)
    tables, sql, params = latency_sql(con, name, scope)
    return _run(con, LATENCY_SCHEMA, tables, sql, params)


def outcome_counts(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    by: Breakdown = "pool",
    pool: str | None = None,
    instance: str | None = None,
    source: RequestSource = "tap",
) -> pa.Table:
    """Attempts and client requests (distinct ``original_request_id``) per outcome, bucket and
    pool or instance. ``source`` ``tap`` (default): the users' requests the stream taps saw;
    ``probe``: the synthetic prober's (per entry point with ``by="instance"``), read exactly.
    From the request rollups where they reach (tap records): there a client request whose
    same-outcome attempts fall in two buckets counts once, in the first. Raises
    :class:`QueryError` for an unknown ``source``."""
    scope = _request_scope(start_ms, end_ms, bucket_ms, by, pool, instance, source)
    tables, sql, params = outcome_sql(con, scope)
    return _run(con, OUTCOMES_SCHEMA, tables, sql, params)


def ghost_counts(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    ghost_grace_s: float = 2.0,
    pool: str | None = None,
    instance: str | None = None,
) -> pa.Table:
    """Per bucket and instance, the taps' side of ghost requests (DESIGN §3; probe records
    are no client's): client disconnects, attempts whose upstream closed more than
    ``ghost_grace_s`` after the client left, and tokens the engine generated after a
    disconnect (drain mode). The engine's side
    (running above the tap's in-flight) is in the ``ghost_requests`` findings."""
    grace_ms = round(check_seconds("ghost_grace_s", ghost_grace_s, high=3600.0) * 1000)
    bucket, where, params = _request_filter(start_ms, end_ms, bucket_ms, pool, instance)
    sql = f"""
        SELECT received_ts_ms // ? * ? AS bucket_ts_ms, instance, any_value(pool),
               count(*) FILTER (WHERE coalesce(client_disconnected, false)),
               count(*) FILTER (WHERE upstream_closed_ts_ms - disconnect_ts_ms > ?),
               coalesce(sum(tokens_after_disconnect), 0)
        FROM requests WHERE {where}
        GROUP BY bucket_ts_ms, instance
        HAVING count(*) FILTER (WHERE coalesce(client_disconnected, false)) > 0
        ORDER BY bucket_ts_ms, instance"""
    return _run(con, GHOSTS_SCHEMA, ["requests"], sql, [bucket, bucket, grace_ms, *params])


#: Rollups that outlive the raw rows they summarise (raw rows are pruned after
#: ``store.raw_retention_days``): per minute (row time: the minute's start), and per hour.
_MINUTE_ROLLUPS = ("slo_minute", "request_minute")
_HOUR_ROLLUPS = ("slo_hour", "request_hour")


def _first_rollup_ms(
    con: duckdb.DuckDBPyConnection, present: set[str], tables: tuple[str, ...]
) -> int | None:
    spans = [f"SELECT min(ts_ms) AS lo FROM {table}" for table in tables if table in present]
    if not spans:
        return None
    row = con.execute(f"SELECT min(lo) FROM ({' UNION ALL '.join(spans)})").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _first_data_ms(con: duckdb.DuckDBPyConnection, present: set[str], raw_start_ms: int) -> int:
    """The first time of the data: of the raw rows, or of the rollups where they reach back
    further than their own width (raw rows pruned; a rollup row's time is its minute's or
    hour's start, up to that width before its first event)."""
    first = raw_start_ms
    for tables, width_ms in ((_MINUTE_ROLLUPS, MINUTE_MS), (_HOUR_ROLLUPS, HOUR_MS)):
        rolled = _first_rollup_ms(con, present, tables)
        if rolled is not None and rolled <= first - width_ms:
            first = rolled
    return first


def meta(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """What the data covers, for the dashboards' filters (JSON-ready, not a table).

    ``data_start_ms``/``data_end_ms``: the first and last sample or request time (Unix epoch
    ms; null on an empty store; probe records count), the start reaching back to the first
    SLO or request rollup row where raw rows were pruned; ``pools``: sorted pool names;
    ``instances``: one ``{"instance", "pool", "address"}`` per engine instance seen in engine
    samples or the taps' request records (a probed entry point is none; ``address``: its
    host:port, or the instance where records carry none);
    ``slos``: SLO ids the jobs have rolled up or evaluated.
    """
    present = present_tables(con)
    spans, pairs, params = [], [], list[object]()
    if "requests" in present:
        spans.append("SELECT min(received_ts_ms) AS lo, max(received_ts_ms) AS hi FROM requests")
        names, params = request_names_sql(con)
        pairs.append(names)
    if "engine_samples_values" in present:
        spans.append("SELECT min(ts_ms), max(ts_ms) FROM engine_samples_values")
        pairs.append("SELECT DISTINCT instance, pool, address FROM engine_samples_series")
    start_ms = end_ms = None
    if spans:
        row = con.execute(f"SELECT min(lo), max(hi) FROM ({' UNION ALL '.join(spans)})").fetchone()
        start_ms, end_ms = (row[0], row[1]) if row else (None, None)
    if start_ms is not None:
        start_ms = _first_data_ms(con, present, start_ms)
    instances: dict[str, tuple[str | None, str | None]] = {}
    if pairs:
        sql = (
            f"SELECT instance, max(pool), max(address) FROM ({' UNION '.join(pairs)}) "
            "GROUP BY instance ORDER BY instance"
        )
        instances = {
            name: (pool, address) for name, pool, address in con.execute(sql, params).fetchall()
        }
    slos: set[str] = set()
    for table in ("slo_keys", "slo_status_current"):
        if table in present:
            slos |= {
                row[0] for row in con.execute(f"SELECT DISTINCT slo_id FROM {table}").fetchall()
            }
    return {
        "data_start_ms": start_ms,
        "data_end_ms": end_ms,
        "pools": sorted({pool for pool, _ in instances.values() if pool}),
        "instances": [
            {"instance": name, "pool": pool, "address": address or name}
            for name, (pool, address) in instances.items()
        ],
        "slos": sorted(slos),
    }
