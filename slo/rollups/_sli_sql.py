"""SQL for one SLO's per-minute good/total counts, from request records or engine histograms.

Request records are the taps' (``source`` null) or the prober's (``source = 'probe'``); an
SLO counts one kind only, by its ``sli.source``.

Private: :mod:`slo.rollups.counts` runs these. Thresholds are validated floats rendered with
``repr``; selector values are always bound parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.units import MINUTE_MS
from slo.request_sources import source_filter
from slo.spec import AvailabilitySpec, GoodputSpec, LatencySpec
from slo.spec.model import Slo
from slo.spec.outcomes import OUTCOME_CLASSES, OutcomeClasses

__all__ = ["engine_minutes_sql", "outcome_class_sql", "records_of", "tap_minutes_sql"]

#: Counter samples read before the range so the first minute's increase is known.
ENGINE_LOOKBACK_MS = 10 * MINUTE_MS
#: Attempts read before the range so a retried request finds its first attempt: retries
#: happen before the first token, within the request's deadline, far inside this.
RETRY_LOOKBACK_MS = 10 * MINUTE_MS

_TAP_VALUE = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
_ITL_VALUE = {
    "p99": "itl_p99_s",
    "max": "itl_max_s",
    "mean": "itl_mean_s",
    # p99 gap − median gap, exact per request; null under 10 chunks (no event), DESIGN §4
    "jitter": "itl_jitter_s",
}


def _in(column: str, values: tuple[object, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def outcome_class_sql(classes: OutcomeClasses) -> str:
    """A SQL expression over ``requests`` giving each record's class (``'good'``, ``'bad'``,
    ``'excluded'``), as :meth:`OutcomeClasses.classify` does. Every literal is a validated
    outcome name or status number."""
    cases = []
    for family in (False, True):  # exact statuses first, then status classes
        for klass in OUTCOME_CLASSES:
            if family:
                values = classes.families(klass)
                test = _in("http_status // 100", values)
            else:
                values = classes.codes(klass)
                test = _in("http_status", values)
            if values:
                cases.append(f"WHEN outcome <> 'ok' AND {test} THEN '{klass}'")
    for klass in ("good", "excluded"):
        if outcomes := classes.outcomes_of(klass):
            cases.append(f"WHEN {_in('outcome', outcomes)} THEN '{klass}'")
    return f"(CASE {' '.join(cases)} ELSE 'bad' END)"


def _tap_value(metric: str, statistic: str = "p99") -> str:
    return _ITL_VALUE[statistic] if metric == "itl" else _TAP_VALUE[metric]


def _selector_sql(selector: Mapping[str, tuple[str, ...]]) -> tuple[str, list[object]]:
    clauses: list[str] = []
    params: list[object] = []
    for column in sorted(selector):
        values = selector[column]
        clauses.append(f"{column} IN ({', '.join('?' * len(values))})")
        params.extend(values)
    return (" AND " + " AND ".join(clauses)) if clauses else "", params


def _tap_good_eligible(slo: Slo) -> tuple[str, str]:
    sli = slo.sli
    klass = outcome_class_sql(slo.outcome_classes)
    good, bad = f"{klass} = 'good'", f"{klass} = 'bad'"
    counted = f"{klass} <> 'excluded'"
    if isinstance(sli, AvailabilitySpec):
        return good, counted
    if isinstance(sli, LatencySpec):
        value = _tap_value(sli.metric, sli.statistic)
        measured = f"{value} IS NOT NULL"
        if sli.metric == "itl":
            # Gaps the tap read too late to vouch for (its loop lagged past the bound,
            # itl_uncertain) are no event: they would be the tap's lateness, not the engine's.
            measured += " AND NOT coalesce(itl_uncertain, false)"
        # A good request without the value (TPOT with one token, TTFT of a non-streamed
        # response) is not an event of this SLI; a bad one always is.
        return (
            f"{good} AND {value} <= {sli.threshold_s!r}",
            f"({bad} OR ({counted} AND {measured}))",
        )
    assert isinstance(sli, GoodputSpec)
    if sli.own_targets:
        # The tap judged each request against its own targets (slo_met, null where nothing
        # targeted was measured: its outcome decides); a request without targets is no event.
        has_targets = "(slo_ttft_s IS NOT NULL OR slo_tpot_s IS NOT NULL)"
        return f"{good} AND coalesce(slo_met, true)", f"{counted} AND {has_targets}"
    met = " AND ".join(
        f"coalesce({_tap_value(metric)} <= {threshold!r}, true)"
        for metric, threshold in sorted(sli.targets_s.items())
    )
    return f"{good} AND {met}", counted


def records_of(slo: Slo) -> str:
    """The request records an SLO counts: the prober's for ``source: probe``, else the taps'."""
    return source_filter("probe" if slo.sli.source == "probe" else "tap")


def _dims(slo: Slo) -> str:
    tenant = "coalesce(tenant, '')" if "tenant" in slo.group_by else "''"
    route = "coalesce(route, '')" if "route" in slo.group_by else "''"
    return f"coalesce(pool, '') AS pool, instance, {tenant} AS tenant, {route} AS route"


def tap_minutes_sql(slo: Slo, start_ms: int, end_ms: int) -> tuple[str, list[object]]:
    """Rows (slo_id, ts_ms, pool, instance, tenant, route, total, bad) from ``requests``
    (the taps' records, or the prober's for ``sli.source: probe``).

    One event per **client request** (``original_request_id``; a record without one is its
    own request), DESIGN §4: the request's last attempt decides good or bad (it is what the
    client got; its TTFT is measured from the client's t₀, so the failed attempts' time is
    in it) and its instance and pool own the event. The minute is the one the client's
    request arrived in (its first attempt). Attempts up to :data:`RETRY_LOOKBACK_MS` before
    ``start_ms`` are read so a retry near the range's start finds its first attempt; the
    attempts stay in ``requests`` as evidence (``attempt``, ``request_id``).
    """
    good, eligible = _tap_good_eligible(slo)
    where, params = _selector_sql(slo.selector)
    client = "coalesce(original_request_id, request_id)"
    # Only retried requests need grouping (a small set): the rest are their own event, so
    # the join's build side stays small and a first build costs about what it did per attempt.
    # An event's minute is its first attempt's, so only attempts in [start, end) can be
    # events of the range; the lookback is read for the retried requests' ids, attempts and
    # times only (the columns an event's value needs are read for the range alone).
    sql = f"""
        WITH lookback AS (
            SELECT {client} AS client, attempt, received_ts_ms, original_request_id
            FROM requests
            WHERE received_ts_ms >= ? AND received_ts_ms < ? AND {records_of(slo)}),
        retried AS (
            SELECT client, max(attempt) AS last_attempt, min(received_ts_ms) AS first_ts_ms
            FROM lookback
            WHERE client IN (SELECT original_request_id FROM lookback WHERE attempt > 1)
            GROUP BY ALL),
        scoped AS (
            SELECT * FROM requests
            WHERE received_ts_ms >= ? AND received_ts_ms < ? AND {records_of(slo)}),
        events AS (
            SELECT scoped.*, coalesce(first_ts_ms, received_ts_ms) AS client_ts_ms
            FROM scoped LEFT JOIN retried ON retried.client = {client}
            WHERE retried.client IS NULL OR attempt = last_attempt)
        SELECT ? AS slo_id, (client_ts_ms // {MINUTE_MS}) * {MINUTE_MS} AS ts_ms, {_dims(slo)},
               count(*) FILTER (WHERE {eligible}) AS total,
               count(*) FILTER (WHERE {eligible} AND NOT coalesce({good}, false)) AS bad
        FROM events
        WHERE client_ts_ms >= ? AND client_ts_ms < ?{where}
        GROUP BY ALL HAVING count(*) FILTER (WHERE {eligible}) > 0"""
    return sql, [
        start_ms - RETRY_LOOKBACK_MS,
        end_ms,
        start_ms,
        end_ms,
        slo.id,
        start_ms,
        end_ms,
        *params,
    ]


def engine_minutes_sql(slo: Slo, start_ms: int, end_ms: int) -> tuple[str, list[object]]:
    """The same rows from histogram counters: total = Δcount, bad = Δcount − Δbucket{le=T}.

    Increases are per series and per minute of scrape time; a counter reset takes the new
    value as the increase; a series' first sample counts 0. bad is clamped to [0, total]
    because bucket and count may be scraped a moment apart. An instance whose histogram has
    no bucket at the threshold (another dialect in the same pool) is left out, never counted
    as all bad; ``slo validate --db`` and the jobs' start-up report such thresholds.
    ``start_ms`` is minute-aligned (a minute is computed whole).
    """
    sli = slo.sli
    assert isinstance(sli, LatencySpec)
    where, params = _selector_sql(slo.selector)
    threshold, tolerance = sli.threshold_s, sli.threshold_s * 1e-9
    series = "instance, pool, engine, labels_json, kind"
    # A BETWEEN on le, unlike abs(le − T) ≤ ε, is pushed below the view's join: only the
    # count and the threshold's bucket are joined (a fifth of the histogram's rows).
    samples = f"""
        SELECT instance, coalesce(pool, '') AS pool, coalesce(engine, '') AS engine,
               coalesce(labels_json, '') AS labels_json, kind, ts_ms, value
        FROM engine_samples
        WHERE signal = ? AND ts_ms >= ? AND ts_ms < ?{where}
          AND (kind = 'count' OR (kind = 'bucket' AND le BETWEEN
               {threshold - tolerance!r} AND {threshold + tolerance!r}))"""
    # The lookback is needed only for each series' last value before the range (what the
    # range's first minute increased from): one arg_max per series, not a value per minute
    # and a window over the lookback's minutes.
    sql = f"""
        WITH s AS (
            SELECT {series}, (ts_ms // {MINUTE_MS}) * {MINUTE_MS} AS minute,
                   arg_max(value, ts_ms) AS v
            FROM ({samples}) GROUP BY ALL),
        before AS (
            SELECT {series}, arg_max(value, ts_ms) AS v FROM ({samples}) GROUP BY ALL),
        d AS (
            SELECT s.*, CASE WHEN row_number() OVER w = 1 THEN before.v
                             ELSE lag(s.v) OVER w END AS pv
            FROM s LEFT JOIN before USING ({series})
            WINDOW w AS (PARTITION BY {series} ORDER BY minute)),
        inc AS (
            SELECT instance, pool, kind, minute,
                   CASE WHEN pv IS NULL THEN 0 WHEN v < pv THEN v ELSE v - pv END AS inc
            FROM d),
        per AS (
            SELECT minute, pool, instance,
                   round(coalesce(sum(inc) FILTER (WHERE kind = 'count'), 0)) AS total,
                   round(coalesce(sum(inc) FILTER (WHERE kind = 'bucket'), 0)) AS good
            FROM inc
            WHERE instance IN (SELECT instance FROM s WHERE kind = 'bucket'
                               UNION ALL SELECT instance FROM before WHERE kind = 'bucket')
            GROUP BY ALL)
        SELECT ? AS slo_id, minute AS ts_ms, pool, instance, '' AS tenant, '' AS route,
               CAST(total AS BIGINT) AS total,
               CAST(least(total, greatest(0, total - good)) AS BIGINT) AS bad
        FROM per WHERE total > 0"""
    return sql, [
        *(sli.metric, start_ms, end_ms, *params),  # s: the range
        *(sli.metric, start_ms - ENGINE_LOOKBACK_MS, start_ms, *params),  # before: the lookback
        slo.id,
    ]
