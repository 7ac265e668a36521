"""Reads of what the pipeline raised and measured: its own alerts (path B) and the chaos
drills' results (re-exported by :mod:`slo.queries`).

Same conventions as :mod:`slo.queries`: ranges ``[start_ms, end_ms)`` in Unix epoch ms,
values bound as parameters, listings at most ``limit`` rows; a bad parameter raises
:class:`pipeline.errors.QueryError` naming it; a table not created yet reads as empty.
"""

from __future__ import annotations

import time
from typing import Literal

import duckdb
import pyarrow as pa

from pipeline.errors import QueryError
from pipeline.schema import JOBS_HEARTBEATS
from slo.queries._params import check_choice, check_limit, check_range, check_ts_ms
from slo.queries._schemas import ALERTS_SCHEMA, DRILLS_SCHEMA
from slo.queries._sql import optional_equal, run_query

__all__ = ["alerts", "drills", "last_heartbeat"]

_ALERT_COLUMNS = (
    "ts_ms, fingerprint, alertname, state, severity, labels_json, annotations_json, "
    "starts_ts_ms, ends_ts_ms, generator_url"
)


def last_heartbeat(
    con: duckdb.DuckDBPyConnection, at_ms: int | None = None
) -> tuple[int, float | None] | None:
    """The newest jobs heartbeat ``(ts_ms, interval_s)`` (at or before ``at_ms``), or None.

    A store written before heartbeats existed has no such table: no heartbeat, not an error.
    """
    where, params = ("WHERE ts_ms <= ?", [at_ms]) if at_ms is not None else ("", [])
    try:
        row = con.execute(
            f"SELECT max(ts_ms), arg_max(interval_s, ts_ms) FROM {JOBS_HEARTBEATS.table} {where}",
            params,
        ).fetchone()
    except duckdb.CatalogException:
        return None
    return None if row is None or row[0] is None else (int(row[0]), row[1])


def alerts(
    con: duckdb.DuckDBPyConnection,
    *,
    at_ms: int | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
    state: Literal["firing", "resolved"] | None = None,
    alertname: str | None = None,
    severity: str | None = None,
    limit: int = 1_000,
    ttl_ms: int | None = None,
) -> pa.Table:
    """The alerts the pipeline computed itself (path B, the ``alerts`` table).

    Without a range: the alerts active at ``at_ms`` (default: now), i.e. each alert
    (``fingerprint``) whose last change up to then is ``firing``, ordered by severity, alert
    name and labels. With ``ttl_ms`` (the pusher's :func:`~alerts.push.alert_ttl_s`, set by
    the server, never by a caller) an alert is active only while an SLO jobs cycle confirmed
    it: its last change or the newest jobs heartbeat up to ``at_ms`` is at most ``ttl_ms``
    old, so a stopped pipeline's alerts expire here as they do in Alertmanager. Without
    ``ttl_ms`` every firing alert is listed, however old.

    With ``start_ms`` and ``end_ms``: every state change in ``[start_ms, end_ms)``, newest
    first, at most ``limit``, filtered by ``state``. ``alertname`` and ``severity`` narrow
    both. ``at_ms`` with a range, or half a range, is a :class:`~pipeline.errors.QueryError`.
    """
    where, params = "", list[object]()
    for column, value in (("alertname", alertname), ("severity", severity)):
        clause, values = optional_equal(column, value, column)
        where, params = where + clause, params + values
    if start_ms is None and end_ms is None:
        if state is not None:
            raise QueryError("state", "only with start_ms and end_ms (active alerts are firing)")
        if at_ms is not None:
            where, params = where + " AND ts_ms <= ?", [*params, check_ts_ms("at_ms", at_ms)]
        confirmed = ""
        if ttl_ms is not None:
            now_ms = at_ms if at_ms is not None else int(time.time() * 1000)
            beat = last_heartbeat(con, at_ms)
            confirmed = " AND greatest(ts_ms, ?) >= ?"
            params += [beat[0] if beat else 0, now_ms - ttl_ms]
        sql = f"""
            SELECT * FROM (
                SELECT {_ALERT_COLUMNS} FROM alerts WHERE true{where}
                QUALIFY row_number() OVER (PARTITION BY fingerprint ORDER BY ts_ms DESC,
                                           state = 'resolved' DESC) = 1
            ) WHERE state = 'firing'{confirmed} ORDER BY severity, alertname, labels_json LIMIT ?"""
        return run_query(con, ALERTS_SCHEMA, ["alerts"], sql, [*params, check_limit(limit)])
    if at_ms is not None:
        raise QueryError("at_ms", "give either at_ms or start_ms and end_ms, not both")
    if start_ms is None or end_ms is None:
        missing = "start_ms" if start_ms is None else "end_ms"
        raise QueryError(missing, "a range needs both start_ms and end_ms")
    start, end = check_range(start_ms, end_ms)
    if state is not None:
        where += " AND state = ?"
        params.append(check_choice("state", state, ("firing", "resolved")))
    sql = f"""
        SELECT {_ALERT_COLUMNS} FROM alerts WHERE ts_ms >= ? AND ts_ms < ?{where}
        ORDER BY ts_ms DESC, alertname, labels_json LIMIT ?"""
    return run_query(con, ALERTS_SCHEMA, ["alerts"], sql, [start, end, *params, check_limit(limit)])


def drills(
    con: duckdb.DuckDBPyConnection, *, run_ts_ms: int | None = None, limit: int = 1_000
) -> pa.Table:
    """``llmslo drill`` results: one row per mode of the run started at ``run_ts_ms``
    (default: the latest run), in mode order."""
    where, params = "(SELECT max(run_ts_ms) FROM drills)", []
    if run_ts_ms is not None:
        where, params = "?", [check_ts_ms("run_ts_ms", run_ts_ms)]
    sql = f"""
        SELECT run_ts_ms, mode, fleet, instance, fault, injected_ts_ms, removed_ts_ms, detected,
               detected_by, detect_s, first_finding_s, first_flag_s, first_alert_s, clear_s,
               other_signals, false_positives, profile_json
        FROM drills WHERE run_ts_ms = {where} ORDER BY mode LIMIT ?"""
    return run_query(con, DRILLS_SCHEMA, ["drills"], sql, [*params, check_limit(limit)])
