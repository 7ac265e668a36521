"""The alert state of every SLO group over time, in one read (re-exported by :mod:`slo.queries`).

No table stores the alert state per evaluation (``slo_status_current`` holds the last one),
so :func:`slo_alert_spans` recomputes it from the SLO rollups for every group at once, in
SQL: at the end of each bucket, the burn rate over each alert pair's long and short window
(counted in whole buckets, at least one) against the pair's factor, with the jobs' own rule
(:func:`slo.budget.pair_alerting`: both windows strictly above). The low-traffic guard
(``min_events``) is not in the stored status, so it is not applied. Consecutive buckets of
one state come back as one span, with each pair's burns at the span's last bucket.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from pipeline.errors import QueryError
from pipeline.units import HOUR_MS, MINUTE_MS
from slo.queries._params import check_grid, check_text
from slo.queries._schemas import ALERT_SPANS_SCHEMA
from slo.queries._sql import present_tables, run_query
from slo.spec.document import GROUP_DIMENSIONS
from slo.windows import parse_duration_ms

__all__ = ["ALERT_STATES", "Pair", "slo_alert_spans", "status_pairs"]

#: The states of a span, worst first: the worst pair firing at that time, ``ok`` when no
#: pair fires but some pair's long window holds events, else ``no events``.
ALERT_STATES = ("page", "ticket", "ok", "no events")


@dataclass(frozen=True)
class Pair:
    """One alert window pair as stored in an SLO status: fires above ``factor`` on both."""

    severity: str
    factor: float
    long_ms: int
    short_ms: int
    id: str = ""


def status_pairs(status_json: str) -> list[Pair]:
    """The alert pairs of a stored status (``slo_status_current.status_json``); a pair whose
    id is not ``severity-long-short`` is skipped."""
    pairs = []
    for raw in json.loads(status_json or "{}").get("pairs", []):
        pair_id = str(raw.get("id", ""))
        severity, _, windows = pair_id.partition("-")
        long, _, short = windows.partition("-")
        try:
            pairs.append(
                Pair(
                    severity,
                    float(raw["factor"]),
                    parse_duration_ms(long),
                    parse_duration_ms(short),
                    pair_id,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return pairs


def _rank(severity: str) -> int:
    """Worse severities rank higher and win the bucket (an unknown one ranks lowest)."""
    return -ALERT_STATES.index(severity) if severity in ALERT_STATES else -len(ALERT_STATES)


def _bind(
    status: Sequence[dict[str, object]], start_ms: int, bucket_ms: int
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Rows of :data:`_GROUP_TYPES` and :data:`_PAIR_TYPES`: each status row a group (``gid``
    its index) with its constraints on the key columns (null: any; ``known`` false when it
    has a label no key column holds), the share of events its objective allows to fail and
    the first bucket its longest window reaches; each of its pairs with its rank and its
    windows in whole buckets (at least one), in ms."""
    groups, pairs = [], []
    for gid, row in enumerate(status):
        group = json.loads(str(row["group_json"] or "{}"))
        found = status_pairs(str(row["status_json"]))
        longest = max((p.long_ms for p in found), default=bucket_ms)
        labels = [group.get(column) for column in GROUP_DIMENSIONS]
        known = set(group) <= set(GROUP_DIMENSIONS)
        allowed = 1.0 - float(row["objective"])  # type: ignore[arg-type]
        first_ms = (start_ms - longest) // bucket_ms * bucket_ms
        groups.append((gid, row["slo_id"], row["group_json"], known, *labels, allowed, first_ms))
        for pos, p in enumerate(found):
            widths = [max(1, round(ms / bucket_ms)) * bucket_ms for ms in (p.long_ms, p.short_ms)]
            pairs.append((gid, pos, p.id, p.severity, _rank(p.severity), p.factor, *widths))
    return groups, pairs


def _unnest(
    prefix: str, rows: Sequence[tuple[object, ...]], types: dict[str, str]
) -> tuple[str, dict[str, list[object]]]:
    """``SELECT unnest($prefix_name::T[]) AS name, …`` over ``rows`` (columns in the order
    of ``types``), and the columns to bind by those names."""
    columns = [list(column) for column in zip(*rows, strict=True)] or [[] for _ in types]
    select = ", ".join(f'unnest(${prefix}_{name}::{types[name]}[]) AS "{name}"' for name in types)
    params = {f"{prefix}_{name}": column for name, column in zip(types, columns, strict=True)}
    return f"SELECT {select}", params


_GROUP_TYPES = {
    "gid": "INTEGER", "slo_id": "VARCHAR", "group_json": "VARCHAR", "known": "BOOLEAN",
    **dict.fromkeys(GROUP_DIMENSIONS, "VARCHAR"),  # in _bind's order
    "allowed": "DOUBLE", "from": "BIGINT",
}  # fmt: skip
_PAIR_TYPES = {
    "gid": "INTEGER", "pos": "INTEGER", "pair": "VARCHAR", "severity": "VARCHAR",
    "rank": "INTEGER", "factor": "DOUBLE", "long_ms": "BIGINT", "short_ms": "BIGINT",
}  # fmt: skip

# Window sums are differences of running sums over each group's buckets (from its longest
# window before the range): the events in (t − w, t] are cum(t) − cum(t − w), zero before
# the group's first bucket. Only the range's buckets are evaluated.
_SQL = """
WITH grp AS ({groups}),
pairs AS ({pairs}),
members AS (
    SELECT g.gid, k.slo_id, k.key_id, g."from"
    FROM grp g JOIN slo_keys k ON k.slo_id = g.slo_id
    WHERE g.known AND (g.pool IS NULL OR k.pool = g.pool)
      AND (g.instance IS NULL OR k.instance = g.instance)
      AND (g.tenant IS NULL OR k.tenant = g.tenant) AND (g.route IS NULL OR k.route = g.route)
),
events AS (
    SELECT m.gid, s.ts_ms // $bucket * $bucket AS ts, sum(s.total) AS total, sum(s.bad) AS bad
    FROM {source} s JOIN members m ON m.slo_id = s.slo_id AND m.key_id = s.key_id
    WHERE s.ts_ms >= $read_from AND s.ts_ms < $end AND s.ts_ms >= m."from"
    GROUP BY ALL
),
grid AS (
    SELECT gid, unnest(generate_series("from", $end - 1, $bucket)) AS ts FROM grp
),
cum AS MATERIALIZED (
    SELECT c.gid, c.ts, sum(coalesce(e.total, 0)) OVER w AS c_total,
           sum(coalesce(e.bad, 0)) OVER w AS c_bad
    FROM grid c LEFT JOIN events e ON e.gid = c.gid AND e.ts = c.ts
    WINDOW w AS (PARTITION BY c.gid ORDER BY c.ts)
),
cells AS (SELECT gid, ts FROM cum WHERE ts >= $first),
windows AS (
    SELECT q.gid, q.ts, p.pos, p.pair, p.severity, p.rank, p.factor,
           q.c_total - coalesce(l.c_total, 0) AS long_total,
           q.c_bad - coalesce(l.c_bad, 0) AS long_bad,
           q.c_total - coalesce(s.c_total, 0) AS short_total,
           q.c_bad - coalesce(s.c_bad, 0) AS short_bad
    FROM cum q JOIN pairs p ON p.gid = q.gid
    LEFT JOIN cum l ON l.gid = q.gid AND l.ts = q.ts - p.long_ms
    LEFT JOIN cum s ON s.gid = q.gid AND s.ts = q.ts - p.short_ms
    WHERE q.ts >= $first
),
rated AS MATERIALIZED (
    SELECT w.*, w.long_total > 0 AS seen,
           (CASE WHEN w.long_total > 0 THEN w.long_bad::DOUBLE / w.long_total::DOUBLE
                 ELSE 0.0 END) / g.allowed AS long_burn,
           (CASE WHEN w.short_total > 0 THEN w.short_bad::DOUBLE / w.short_total::DOUBLE
                 ELSE 0.0 END) / g.allowed AS short_burn
    FROM windows w JOIN grp g ON g.gid = w.gid
),
states AS MATERIALIZED (
    SELECT c.gid, c.ts,
           coalesce(
               arg_max(r.severity, r.rank * 1000000 + r.pos)
                   FILTER (WHERE r.seen AND r.long_burn > r.factor AND r.short_burn > r.factor),
               CASE WHEN coalesce(bool_or(r.seen), false) THEN 'ok' ELSE 'no events' END
           ) AS state
    FROM cells c LEFT JOIN rated r ON r.gid = c.gid AND r.ts = c.ts
    GROUP BY c.gid, c.ts
),
placed AS (
    SELECT s.gid, row_number() OVER (
               ORDER BY arg_max(CASE s.state WHEN 'page' THEN 2 WHEN 'ticket' THEN 1 ELSE 0 END,
                                s.ts) DESC,
                        count(*) FILTER (WHERE s.state = 'page') DESC,
                        count(*) FILTER (WHERE s.state = 'ticket') DESC, g.slo_id, g.group_json
           ) AS place
    FROM states s JOIN grp g ON g.gid = s.gid GROUP BY s.gid, g.slo_id, g.group_json
),
own AS (
    SELECT gid FROM placed
    WHERE place <= $rows OR (SELECT count(*) FROM placed) <= $rows
),
folded_cells AS (
    SELECT g.slo_id, s.ts, count(*) AS groups,
           max(CASE s.state WHEN 'page' THEN 4 WHEN 'ticket' THEN 3 WHEN 'ok' THEN 2
                            WHEN 'no events' THEN 1 ELSE 0 END) AS worst
    FROM states s JOIN grp g ON g.gid = s.gid
    WHERE s.gid NOT IN (SELECT gid FROM own)
    GROUP BY g.slo_id, s.ts
),
rows_cells AS (
    SELECT gid AS row_id, NULL::VARCHAR AS slo_id, 0 AS folded, ts, state
    FROM states WHERE gid IN (SELECT gid FROM own)
    UNION ALL
    SELECT NULL, slo_id, groups, ts,
           ['', 'no events', 'ok', 'ticket', 'page'][worst + 1]
    FROM folded_cells
),
runs AS (
    SELECT *, sum(CASE WHEN state = prev THEN 0 ELSE 1 END)
                  OVER (PARTITION BY row_id, slo_id ORDER BY ts) AS run
    FROM (SELECT *, lag(state) OVER (PARTITION BY row_id, slo_id ORDER BY ts) AS prev
          FROM rows_cells)
),
spans AS (
    SELECT row_id AS gid, slo_id, any_value(folded) AS folded, min(ts) AS start_ms,
           max(ts) + $bucket AS end_ms, any_value(state) AS state, max(ts) AS last_ts
    FROM runs GROUP BY row_id, slo_id, run
)
SELECT coalesce(g.slo_id, s.slo_id) AS slo_id, g.group_json, s.start_ms, s.end_ms, s.state,
       coalesce(
           list({{'pair': r.pair, 'severity': r.severity, 'factor': r.factor,
                  'long_burn': r.long_burn, 'short_burn': r.short_burn}}
                ORDER BY r.rank DESC, r.pos DESC) FILTER (WHERE r.seen),
           []
       ) AS burns,
       s.folded
FROM spans s LEFT JOIN grp g ON g.gid = s.gid
LEFT JOIN rated r ON r.gid = s.gid AND r.ts = s.last_ts
GROUP BY 1, g.group_json, s.start_ms, s.end_ms, s.state, s.folded
ORDER BY s.folded > 0, 1, g.group_json, s.start_ms"""


def slo_alert_spans(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    slo_id: str | None = None,
    pool: str | None = None,
    instance: str | None = None,
    most_rows: int | None = None,
) -> pa.Table:
    """Every SLO group's alert state per bucket of ``[start_ms, end_ms)``, as spans.

    The groups are those of ``slo_status_current`` (of ``slo_id`` only, if given; with
    ``pool``/``instance``, those whose label is absent or equal), each with the alert pairs
    and objective of its stored status; a group with an empty label value (records without
    that label: its status and the rollup keys do not say the same thing) has no spans.
    A group's events are the rollup rows whose key columns equal its labels, summed per
    bucket, from the longest window before ``start_ms`` (as :func:`budget_series` reads one
    group). At each bucket's end, each pair's burn rate over its long and short window
    (whole buckets, at least one; error ratio / (1 − objective), 0 without events); the
    bucket's ``state`` is the worst pair firing (both burns strictly above its factor),
    else ``ok`` if some pair's long window holds events, else ``no events``.

    One row per run of buckets of one state: ``slo_id``, ``group_json``, ``start_ms`` of
    its first bucket (the first may start before ``start_ms``), ``end_ms`` of its last,
    ``state``, and ``burns``: at the last bucket, each pair whose long window holds events
    (``pair`` id, ``severity``, ``factor``, ``long_burn``, ``short_burn``), worst first.
    Ordered by SLO, group and time; ``folded`` is 0.

    With ``most_rows`` and more groups than that, the ``most_rows`` groups first in this
    order keep their spans: those in ``page`` at the last bucket, then those in ``ticket``
    there (what is wrong now), then the longest in ``page``, then in ``ticket`` over the
    range (ties by SLO and group). The other groups of each SLO come back folded into one
    row: at each bucket their worst state (:data:`ALERT_STATES` order), merged into runs,
    ``group_json`` null, ``burns`` empty and ``folded`` the number of groups folded; these
    rows follow the groups' own, by SLO and time. (A strip of a fleet's 256 groups × a
    month drew thousands of rectangles; folding here leaves the burns of the folded groups
    uncomputed.) Reads ``slo_hour`` when buckets are whole hours, else ``slo_minute``
    (buckets are whole minutes). Raises :class:`pipeline.errors.QueryError` naming a bad
    parameter.
    """
    grid = check_grid(start_ms, end_ms, bucket_ms, unit_ms=MINUTE_MS)
    rows = _check_most_rows(most_rows)
    wanted = {
        name: check_text(name, value)
        for name, value in (("slo_id", slo_id), ("pool", pool), ("instance", instance))
        if value is not None
    }
    if not {"slo_status_current", "slo_keys"} <= present_tables(con):
        return ALERT_SPANS_SCHEMA.empty_table()
    sql = (
        "SELECT slo_id, group_json, (status_json->>'objective')::DOUBLE AS objective, status_json "
    )
    sql += "FROM slo_status_current WHERE slo_id = coalesce(?, slo_id) ORDER BY slo_id, group_json"
    status = [
        row
        for row in con.sql(sql, params=[wanted.get("slo_id")]).to_arrow_table().to_pylist()
        if _drawn(json.loads(row["group_json"] or "{}"), wanted)
    ]
    if not status:
        return ALERT_SPANS_SCHEMA.empty_table()
    groups, pairs = _bind(status, grid.start_ms, grid.bucket_ms)
    groups_sql, group_params = _unnest("g", groups, _GROUP_TYPES)
    pairs_sql, pair_params = _unnest("p", pairs, _PAIR_TYPES)
    source = "slo_hour" if grid.bucket_ms % HOUR_MS == 0 else "slo_minute"
    params = {
        **group_params,
        **pair_params,
        "bucket": grid.bucket_ms,
        "read_from": min(group_params["g_from"]),  # type: ignore[type-var]
        "end": grid.end_ms,
        "first": grid.start_ms // grid.bucket_ms * grid.bucket_ms,
        "rows": rows,
    }
    sql = _SQL.format(groups=groups_sql, pairs=pairs_sql, source=source)
    return run_query(con, ALERT_SPANS_SCHEMA, [source], sql, params)


def _check_most_rows(most_rows: object) -> int:
    """``most_rows`` (None: every group a row, bound as the largest 32-bit count)."""
    if most_rows is None:
        return 2**31 - 1
    if isinstance(most_rows, bool) or not isinstance(most_rows, int) or most_rows < 1:
        raise QueryError("most_rows", f"must be a positive integer, got {most_rows!r}")
    return most_rows


def _drawn(group: dict[str, str], wanted: dict[str, str]) -> bool:
    """A group with every label valued, matching the pool and instance asked for."""
    if not all(group.values()):
        return False
    return all(group.get(k) in (None, wanted[k]) for k in ("pool", "instance") if k in wanted)
