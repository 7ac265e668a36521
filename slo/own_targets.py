"""Requests' own SLO targets: the taps' per-request verdicts beside the router's counter.

llm-d's router sends each request's targets as ``x-llm-d-slo-ttft-ms`` / ``-tpot-ms``; the
tap records them with its own measurement (``requests.slo_ttft_s``, ``slo_tpot_s``,
``slo_met``), and the router counts the requests it judged to have missed them
(``llm_d_epp_request_slo_violation_total{type}``, signal ``gateway_slo_violations``).
The two are told apart, not merged: the router judges at the router (its own clock, the
requests it scheduled, counted when its response path sees the latency), the tap per
request and per attempt's client t₀ on the SSE path. :func:`compare_violations` sets
them side by side per pool and type, over one window (``llmslo slo report`` prints the
last hour's); a gap between them is a finding to
read (a router whose view of latency drifts from what clients got, or requests that
reach the pool without passing a tap), not an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from pipeline.units import HOUR_MS, MINUTE_MS
from slo.request_sources import source_filter

__all__ = ["REPORT_WINDOW_MS", "TARGET_TYPES", "ViolationComparison", "compare_violations"]

#: The router's ``type`` label values, and the request columns each one judges.
TARGET_TYPES: dict[str, tuple[str, str]] = {
    "ttft": ("ttft_s", "slo_ttft_s"),
    "tpot": ("tpot_s", "slo_tpot_s"),
}
#: The window ``llmslo slo report`` compares over, ending at its evaluation time.
REPORT_WINDOW_MS = HOUR_MS
#: One client request, whatever its attempts (retries come before the first token).
_CLIENT = "coalesce(original_request_id, request_id)"
#: Counter samples read before the window, so its first increase is known.
LOOKBACK_MS = 10 * MINUTE_MS


@dataclass(frozen=True)
class ViolationComparison:
    """One pool's and type's violations of requests' own targets over a window.

    ``tap_targeted``: client requests the taps recorded with this type's target;
    ``tap_violations``: those measured over it; ``router_violations``: the increase of the
    router's counter over the window (``None`` where no router's counter was scraped).
    """

    pool: str
    type: str
    tap_targeted: int
    tap_violations: int
    router_violations: float | None


def _tap_counts(
    con: duckdb.DuckDBPyConnection, start_ms: int, end_ms: int
) -> dict[tuple[str, str], tuple[int, int]]:
    selects = " UNION ALL ".join(
        f"SELECT coalesce(pool, '') AS pool, '{kind}' AS type, "
        f"count(DISTINCT {_CLIENT}) FILTER (WHERE {target} IS NOT NULL) AS targeted, "
        f"count(DISTINCT {_CLIENT}) FILTER (WHERE {value} > {target}) AS violated "
        "FROM requests WHERE received_ts_ms >= ? AND received_ts_ms < ? "
        f"AND {source_filter('tap')} GROUP BY ALL"
        for kind, (value, target) in sorted(TARGET_TYPES.items())
    )
    params = [start_ms, end_ms] * len(TARGET_TYPES)
    rows = con.execute(selects, params).fetchall()
    return {(pool, kind): (n, bad) for pool, kind, n, bad in rows if n}


def _router_increases(
    con: duckdb.DuckDBPyConnection, start_ms: int, end_ms: int
) -> dict[tuple[str, str], float]:
    # Per series, the sum of increases inside the window; a reset takes the new value.
    rows = con.execute(
        """
        WITH s AS (
            SELECT coalesce(pool, model, '') AS pool,
                   coalesce(json_extract_string(labels_json, '$.type'), '') AS type, ts_ms,
                   value, lag(value) OVER (
                       PARTITION BY instance, pool, model, labels_json ORDER BY ts_ms) AS prev
            FROM engine_samples
            WHERE signal = 'gateway_slo_violations' AND kind = 'counter'
              AND ts_ms >= ? AND ts_ms < ?)
        SELECT pool, type,
               sum(CASE WHEN prev IS NULL THEN 0 WHEN value < prev THEN value
                        ELSE value - prev END) FILTER (WHERE ts_ms >= ?)
        FROM s GROUP BY ALL""",
        [start_ms - LOOKBACK_MS, end_ms, start_ms],
    ).fetchall()
    return {(pool, kind): float(inc or 0.0) for pool, kind, inc in rows}


def compare_violations(
    con: duckdb.DuckDBPyConnection, start_ms: int, end_ms: int
) -> list[ViolationComparison]:
    """Per pool and type, the taps' and the router's violations over ``[start_ms, end_ms)``.

    Sorted by pool, then type; a pool appears when either side has data for it.
    """
    tap = _tap_counts(con, start_ms, end_ms)
    router = _router_increases(con, start_ms, end_ms)
    return [
        ViolationComparison(pool, kind, *tap.get((pool, kind), (0, 0)), router.get((pool, kind)))
        for pool, kind in sorted(tap.keys() | router.keys())
    ]
