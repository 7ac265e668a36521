"""SQL of :func:`slo.queries.latency_percentiles` and :func:`slo.queries.outcome_counts`.

Private to ``slo``. A range is read from the request rollups where they are settled
(:class:`slo.rollups.requests.RequestCoverage`): whole hours from the ``*_hour`` tables when
the buckets are whole hours, the edges from the ``*_minute`` tables, and raw ``requests``
before and after (the unsettled tail, a range edge inside a minute), turned into the same
minute rows by the rollup's own SQL. So one answer never mixes exact and binned
percentiles. Without rollups (an older file), and for buckets finer than the rollups'
minute, the exact SQL over raw records answers.
Reads count the taps' records (user traffic) unless the scope asks for the prober's
(``source = "probe"``): those are few and never rolled up, so they are always read exactly.
Parameters arrive validated; every value is bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from pipeline.units import HOUR_MS, MINUTE_MS, ceil_to, floor_to
from slo.queries._params import Grid
from slo.request_sources import RequestSource, source_filter
from slo.rollups.requests import (
    LATENCY_COLUMNS,
    RequestCoverage,
    bin_value_sql,
    latency_minutes_sql,
    outcome_minutes_sql,
    read_coverage,
)

__all__ = ["RequestScope", "latency_sql", "outcome_sql", "request_names_sql"]

_QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class RequestScope:
    """A validated request query: grid, breakdown (``pool`` | ``instance``), filters and
    whose records (``source``: ``tap``, the users' requests, or ``probe``)."""

    grid: Grid
    by: str
    pool: str | None = None
    instance: str | None = None
    source: RequestSource = "tap"

    def coverage(self, con: duckdb.DuckDBPyConnection) -> RequestCoverage | None:
        """The rollups' reach for this scope: none for probe records (never rolled up) and
        for buckets that are not whole minutes (finer than the rollups)."""
        if self.source != "tap" or self.grid.bucket_ms % MINUTE_MS:
            return None
        return read_coverage(con)

    def where(self) -> tuple[str, list[object]]:
        """Filter clauses (`` AND …``) on ``pool``/``instance`` and their values."""
        clauses, params = "", list[object]()
        for column, value in (("pool", self.pool), ("instance", self.instance)):
            if value is not None:
                clauses += f" AND {column} = ?"
                params.append(value)
        return clauses, params

    def columns(self) -> tuple[str, str, str]:
        """(group column, pool expression, instance expression) of the breakdown."""
        if self.by == "pool":
            return "pool", "pool", "NULL"
        return "instance", "any_value(pool)", "instance"


Query = tuple[list[str], str, list[object]]  # tables needed, SQL, parameters


def _pieces(grid: Grid, coverage: RequestCoverage | None) -> list[tuple[str, int, int]]:
    """(``raw`` | ``minute`` | ``hour``, start, end) pieces covering the grid's range."""
    start, end = grid.start_ms, grid.end_ms
    if coverage is None:
        return [("raw", start, end)]
    lo = max(ceil_to(start, MINUTE_MS), coverage.start_ms)
    hi = min(end // MINUTE_MS * MINUTE_MS, coverage.settled_ms)
    if lo >= hi:
        return [("raw", start, end)]
    pieces = [("raw", start, lo)] if start < lo else []
    h_lo, h_hi = ceil_to(lo, HOUR_MS), floor_to(hi, HOUR_MS)
    if grid.bucket_ms % HOUR_MS == 0 and h_lo < h_hi:
        pieces += [("minute", lo, h_lo), ("hour", h_lo, h_hi), ("minute", h_hi, hi)]
    else:
        pieces.append(("minute", lo, hi))
    if hi < end:
        pieces.append(("raw", hi, end))
    return [piece for piece in pieces if piece[1] < piece[2]]


def _union(
    pieces: list[tuple[str, int, int]],
    table: str,
    columns: str,
    raw: object,
    hour_table: tuple[str, str] | None = None,
) -> Query:
    """``hour_table``: (table, its columns) that serves the ``hour`` pieces instead."""
    parts, params, tables = [], list[object](), {"request_rollup_state"}
    for kind, lo, hi in pieces:
        if kind == "raw":
            sql, bound = raw(lo, hi)  # type: ignore[operator]
            parts.append(f"SELECT {columns} FROM ({sql})")
            params += bound
            tables.add("requests")
        else:
            name, read = f"{table}_{kind}", columns
            if kind == "hour" and hour_table is not None:
                name, read = hour_table
            parts.append(f"SELECT {read} FROM {name} WHERE ts_ms >= ? AND ts_ms < ?")
            params += [lo, hi]
            tables.add(name)
    return sorted(tables), " UNION ALL ".join(parts), params


def latency_sql(con: duckdb.DuckDBPyConnection, metric: str, scope: RequestScope) -> Query:
    """Samples, mean, p50/p90/p99 and max of ``metric`` per bucket and group (LATENCY_SCHEMA)."""
    coverage = scope.coverage(con)
    if coverage is None:
        return _exact_latency_sql(metric, scope)
    pieces = _pieces(scope.grid, coverage)
    columns = "ts_ms, pool, instance, metric, bin, samples, sum_s, max_s"
    # A pool band needs no instance: whole hours come from the pools' hours (64× fewer rows).
    per_pool = scope.by == "pool" and scope.instance is None
    rows_table, rows_sql, rows_params = _union(
        pieces,
        "request_latency",
        columns,
        lambda lo, hi: latency_minutes_sql(lo, hi, (metric,), scope.source),
        ("request_latency_pool_hour", columns.replace("instance", "NULL AS instance"))
        if per_pool
        else None,
    )
    group = scope.columns()[0]
    pool_out, instance_out = ("g", "NULL") if group == "pool" else ("any_value(pool)", "g")
    where, filters = scope.where()
    value = f"least({bin_value_sql('bin')}, mx)"
    ranks = ", ".join(
        f"arg_min({value}, bin) FILTER (WHERE cum >= floor({q!r} * (tot - 1)) + 1)"
        for q in _QUANTILES
    )
    sql = f"""
        WITH binned AS (
            SELECT ts_ms // ? * ? AS bucket_ts_ms, {group} AS g, any_value(pool) AS pool, bin,
                   sum(samples) AS n, sum(sum_s) AS s, max(max_s) AS mx
            FROM ({rows_sql}) WHERE metric = ?{where}
            GROUP BY bucket_ts_ms, g, bin
        ), ranked AS (
            SELECT *, sum(n) OVER (PARTITION BY bucket_ts_ms, g ORDER BY bin
                                   ROWS UNBOUNDED PRECEDING) AS cum,
                      sum(n) OVER (PARTITION BY bucket_ts_ms, g) AS tot
            FROM binned
        )
        SELECT bucket_ts_ms, {pool_out}, {instance_out}, any_value(tot)::BIGINT,
               sum(s) / any_value(tot), {ranks}, max(mx)
        FROM ranked GROUP BY bucket_ts_ms, g ORDER BY bucket_ts_ms, g"""
    bucket = scope.grid.bucket_ms
    return rows_table, sql, [bucket, bucket, *rows_params, metric, *filters]


def outcome_sql(con: duckdb.DuckDBPyConnection, scope: RequestScope) -> Query:
    """Attempts and client requests per bucket, group and outcome (OUTCOMES_SCHEMA)."""
    coverage = scope.coverage(con)
    group, pool_sql, instance_sql = scope.columns()
    where, filters = scope.where()
    bucket = scope.grid.bucket_ms
    if coverage is None:
        grid = scope.grid
        sql = f"""
            SELECT received_ts_ms // ? * ? AS bucket_ts_ms, {pool_sql}, {instance_sql}, outcome,
                   count(*), count(DISTINCT coalesce(original_request_id, request_id))
            FROM requests
            WHERE received_ts_ms >= ? AND received_ts_ms < ?{where}
              AND {source_filter(scope.source)}
            GROUP BY bucket_ts_ms, {group}, outcome ORDER BY bucket_ts_ms, {group}, outcome"""
        return ["requests"], sql, [bucket, bucket, grid.start_ms, grid.end_ms, *filters]
    tables, rows_sql, rows_params = _union(
        _pieces(scope.grid, coverage),
        "request",
        "ts_ms, pool, instance, outcome, attempts, requests, pool_requests",
        lambda lo, hi: outcome_minutes_sql(lo, hi, scope.source),
    )
    # One instance's attempts: its first attempts are the distinct requests in any grouping.
    requests = "pool_requests" if group == "pool" and scope.instance is None else "requests"
    sql = f"""
        SELECT ts_ms // ? * ? AS bucket_ts_ms, {pool_sql}, {instance_sql}, outcome,
               sum(attempts)::BIGINT, sum({requests})::BIGINT
        FROM ({rows_sql}) WHERE true{where}
        GROUP BY bucket_ts_ms, {group}, outcome ORDER BY bucket_ts_ms, {group}, outcome"""
    return tables, sql, [bucket, bucket, *rows_params, *filters]


def _exact_latency_sql(metric: str, scope: RequestScope) -> Query:
    column = LATENCY_COLUMNS[metric]
    group, pool_sql, instance_sql = scope.columns()
    where, filters = scope.where()
    grid = scope.grid
    rows = f"received_ts_ms >= ? AND received_ts_ms < ?{where} AND {source_filter(scope.source)}"
    source = (
        f"(SELECT *, unnest(itl_gaps_s)::DOUBLE AS gap_s FROM requests WHERE {rows})"
        if metric == "itl"
        else f"(SELECT * FROM requests WHERE {rows})"
    )
    sql = f"""
        SELECT received_ts_ms // ? * ? AS bucket_ts_ms, {pool_sql}, {instance_sql}, count(*),
               avg({column}), quantile_cont({column}, 0.5), quantile_cont({column}, 0.9),
               quantile_cont({column}, 0.99), max({column})
        FROM {source} WHERE {column} IS NOT NULL AND isfinite({column})
        GROUP BY bucket_ts_ms, {group} ORDER BY bucket_ts_ms, {group}"""
    bucket = grid.bucket_ms
    return ["requests"], sql, [bucket, bucket, grid.start_ms, grid.end_ms, *filters]


def request_names_sql(con: duckdb.DuckDBPyConnection) -> tuple[str, list[object]]:
    """SQL of the distinct (instance, pool, address) of the taps' request records (a probed
    entry point is no engine instance): the rollup's hours where it reaches, raw records
    elsewhere (a 30-day file: ~10⁵ rows instead of ~10⁷)."""
    coverage = read_coverage(con)
    raw = f"SELECT DISTINCT instance, pool, address FROM requests WHERE {source_filter()}"
    if coverage is None:
        return raw, []
    return (
        "SELECT DISTINCT instance, pool, address FROM request_hour UNION "
        f"{raw} AND (received_ts_ms < ? OR received_ts_ms >= ?)",
        [coverage.start_ms, coverage.settled_ms],
    )
