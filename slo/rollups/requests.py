"""Per-minute (and per-hour) rollups of the taps' request records, for long-range reads.

Only user traffic is rolled up: the records of the stream taps (``source`` null), not the
synthetic prober's (``source = 'probe'``, ``llmslo probe``), whose few requests per minute
are read raw when asked for (:func:`slo.request_sources.source_filter`).

Tables (declared in :mod:`slo.tables`, created here):

* ``request_minute`` / ``request_hour``: attempts and client requests per minute (hour) ×
  pool × instance × outcome;
* ``request_latency_minute`` / ``request_latency_hour``: TTFT, TPOT, E2E (one value per
  attempt) and ITL (every gap) as fixed log-bin histograms with each bin's count, sum and
  max, so a percentile over any set of minutes is a sum of bins;
* ``request_latency_pool_hour``: the hours summed over each pool's instances (pool bands);
* ``request_rollup_state``: one row, how far the rollups reach.

**Bins.** A value ``v`` (seconds, clamped to [:data:`MIN_S`, :data:`MAX_S`]) falls in bin
``i = ceil(ln v / ln γ)``, i.e. ``v ∈ (γ^(i−1), γ^i]``, with ``γ = (1 + α) / (1 − α)`` and
``α`` = :data:`RELATIVE_ERROR` (1 %). A bin is reported as ``2γ^i / (γ + 1)`` (capped at the
bin's own maximum), which is within ``α`` *relative* of every value in the bin (DDSketch's
layout). So a reported percentile q is within 1 % of the order statistic of rank
⌊q·(n − 1)⌋ (numpy ``method="lower"``) for values in [1 µs, 10⁵ s]; means and maxima are
exact. About 1,270 bins cover that range; a minute stores only the bins it has.

**Client requests** are counted once per (``original_request_id``, instance, outcome) in
the minute of their first such attempt (``requests``), and once per (id, pool, outcome)
(``pool_requests``), so sums over minutes equal the raw ``count(DISTINCT …)`` unless one
request's same-outcome attempts fall into two buckets of a query (then the rollup counts it
once, in the first). Earlier attempts are looked for :data:`RETRY_LOOKBACK_MS` before a
recomputed range (retries happen before the first token, within the client's deadline).

Like :mod:`slo.rollups.counts`, minutes are always *recomputed* from raw rows (delete, insert, in
one transaction), never incremented, so re-running any range gives the same rows. Each
update recomputes from ``watermark − settle`` (late records), or, told what was written
since (:meth:`RequestRollup.note_written`, the Iceberg mirror's report), from the earliest
minute the new records fell in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import duckdb

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, ceil_to, floor_to
from slo.request_sources import RequestSource, source_filter
from slo.rollups._written import NO_CHANGE, earliest
from slo.tables import REQUEST_ROLLUP_TABLES

__all__ = [
    "BIN_GAMMA",
    "MAX_S",
    "MIN_S",
    "RELATIVE_ERROR",
    "REQUEST_ROLLUP_VERSION",
    "RETRY_LOOKBACK_MS",
    "RequestCoverage",
    "RequestRollup",
    "bin_value_sql",
    "create_request_rollup_tables",
    "latency_minutes_sql",
    "outcome_minutes_sql",
    "read_coverage",
    "rollup_history",
]

log = logging.getLogger(__name__)

#: Relative error of a reported bin value (α).
RELATIVE_ERROR = 0.01
#: Ratio of consecutive bin bounds, γ = (1 + α) / (1 − α).
BIN_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
#: Values are clamped to [MIN_S, MAX_S] seconds before binning (the bound holds inside).
MIN_S, MAX_S = 1e-6, 1e5
#: Bumped when the bin layout or the counting rules change: stored rollups are rebuilt.
#: 2: probe records are left out (version 1 counted them as user requests).
REQUEST_ROLLUP_VERSION = 2
#: How far before a recomputed range earlier attempts of the same client request are sought.
RETRY_LOOKBACK_MS = 10 * MINUTE_MS
_LN_GAMMA = math.log(BIN_GAMMA)
#: Request-record column of each latency metric (ITL: every gap, chunk-weighted).
LATENCY_COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "itl": "gap_s"}


def _bin_sql(value: str) -> str:
    return f"ceil(ln(greatest(least({value}, {MAX_S!r}), {MIN_S!r})) / {_LN_GAMMA!r})::SMALLINT"


def bin_value_sql(bin_: str) -> str:
    """SQL of the value (seconds) a bin reports: within α of every value in the bin."""
    return f"(2 * pow({BIN_GAMMA!r}, {bin_}) / {BIN_GAMMA + 1!r})"


def outcome_minutes_sql(
    start_ms: int, end_ms: int, source: RequestSource = "tap"
) -> tuple[str, list[object]]:
    """SQL of ``request_minute`` rows for attempts received in ``[start_ms, end_ms)`` (any ms,
    need not be whole minutes), from raw ``requests`` of ``source`` (the taps',
    user traffic, by default); the columns of the table."""
    # Only retried requests (an attempt > 1 in the read: the tap numbers a request's
    # attempts) need ranking; every other record is its own request's first attempt. Ranking
    # every record of the lookback cost ~2.7 s of CPU at 2,048 requests/s.
    sql = f"""
        WITH attempts AS (
            SELECT received_ts_ms, pool::VARCHAR AS pool, instance::VARCHAR AS instance,
                   address::VARCHAR AS address, outcome, request_id, original_request_id,
                   attempt, coalesce(original_request_id, request_id) AS client
            FROM requests
            WHERE received_ts_ms >= ? AND received_ts_ms < ? AND {source_filter(source)}),
        retried AS (
            SELECT DISTINCT original_request_id AS client FROM attempts WHERE attempt > 1),
        ranked AS (
            SELECT received_ts_ms, pool, instance, address, outcome, true AS first_here,
                   true AS first_in_pool
            FROM attempts ANTI JOIN retried USING (client)
            WHERE received_ts_ms >= ?
            UNION ALL
            SELECT * FROM (
                SELECT received_ts_ms, pool, instance, address, outcome,
                       row_number() OVER (PARTITION BY client, instance, outcome
                                          ORDER BY received_ts_ms, request_id) = 1,
                       row_number() OVER (PARTITION BY client, pool, outcome
                                          ORDER BY received_ts_ms, request_id) = 1
                FROM attempts SEMI JOIN retried USING (client))
            WHERE received_ts_ms >= ?)
        SELECT received_ts_ms // {MINUTE_MS} * {MINUTE_MS} AS ts_ms, pool, instance, address,
               outcome::VARCHAR AS outcome, count(*) AS attempts,
               count(*) FILTER (WHERE first_here) AS requests,
               count(*) FILTER (WHERE first_in_pool) AS pool_requests
        FROM ranked
        GROUP BY ALL"""
    return sql, [start_ms - RETRY_LOOKBACK_MS, end_ms, start_ms, start_ms]


def latency_minutes_sql(
    start_ms: int,
    end_ms: int,
    metrics: tuple[str, ...] = tuple(LATENCY_COLUMNS),
    source: RequestSource = "tap",
) -> tuple[str, list[object]]:
    """SQL of ``request_latency_minute`` rows of ``metrics`` for attempts received in
    ``[start_ms, end_ms)``, from raw ``requests`` of ``source`` (the taps',
    user traffic, by default); the columns of the table."""
    parts, params = [], list[object]()
    rows = f"received_ts_ms >= ? AND received_ts_ms < ? AND {source_filter(source)}"
    for metric in metrics:
        column = LATENCY_COLUMNS[metric]
        records = (
            "(SELECT received_ts_ms, pool, instance, unnest(itl_gaps_s)::DOUBLE AS gap_s "
            f"FROM requests WHERE {rows})"
            if metric == "itl"
            else f"(SELECT * FROM requests WHERE {rows})"
        )
        parts.append(
            f"""SELECT received_ts_ms // {MINUTE_MS} * {MINUTE_MS} AS ts_ms,
                       pool::VARCHAR AS pool, instance::VARCHAR AS instance,
                       '{metric}' AS metric, {_bin_sql(column)} AS bin, count(*) AS samples,
                       sum({column}) AS sum_s, max({column}) AS max_s
                FROM {records} WHERE {column} IS NOT NULL AND isfinite({column})
                GROUP BY ALL"""
        )
        params += [start_ms, end_ms]
    return " UNION ALL ".join(parts), params


def create_request_rollup_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the request rollup tables if missing (idempotent)."""
    for table in REQUEST_ROLLUP_TABLES.values():
        table.create(con)


@dataclass(frozen=True)
class RequestCoverage:
    """The rollups hold every minute in ``[start_ms, settled_ms)`` as final, and minutes up to
    ``watermark_ms`` as of the last update; reads take raw rows outside ``[start, settled)``."""

    start_ms: int
    settled_ms: int
    watermark_ms: int


def read_coverage(con: duckdb.DuckDBPyConnection) -> RequestCoverage | None:
    """The rollups' reach, or ``None`` when absent, of another version, or empty."""
    present = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND table_name IN (SELECT unnest(?))",
        [list(REQUEST_ROLLUP_TABLES)],
    ).fetchone()
    if not present or present[0] != len(REQUEST_ROLLUP_TABLES):
        return None
    row = con.execute(
        "SELECT start_ts_ms, settled_ts_ms, watermark_ts_ms FROM request_rollup_state "
        "WHERE version = ?",
        [REQUEST_ROLLUP_VERSION],
    ).fetchone()
    if row is None or row[1] <= row[0]:
        return None
    return RequestCoverage(int(row[0]), int(row[1]), int(row[2]))


class RequestRollup:
    """Keeps the request rollups current over one DuckDB connection (the writer's).

    ``settle_ms``: how far behind the watermark each update recomputes when it is not told
    what was written (late records), and the raw tail reads take; ``horizon_ms``: how far
    back a first build or a rebuild reads.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        settle_ms: int = 10 * MINUTE_MS,
        horizon_ms: int = 7 * DAY_MS,
    ) -> None:
        self.con = con
        self.settle_ms = settle_ms
        self.horizon_ms = horizon_ms
        #: The earliest record time written since the last update (``None``: unknown, so
        #: the settle window; :data:`NO_CHANGE`: nothing).
        self._changed_from: int | None = None
        self._told = False  # whether a writer tells its writes (note_written) at all
        create_request_rollup_tables(con)

    def note_written(self, changed_from_ms: Mapping[str, int | None]) -> None:
        """Tell the rollup what was written to the raw tables since the last call: table →
        earliest event time (ms) of its new rows (``requests`` absent: no new records;
        ``None``: anything may have changed), as :meth:`slo.rollups.counts.Rollup.note_written`
        is told. An update then recomputes only from the minute the new records fell in
        (late ones included) instead of ``watermark − settle``."""
        self._told = True
        new = changed_from_ms.get("requests", NO_CHANGE)
        self._changed_from = earliest(self._changed_from, new)

    def update(self, now_ms: int) -> int:
        """Recompute to the minute of ``now_ms``: from the minute of the earliest record
        written since the last update when told (:meth:`note_written`; the last minute
        computed at least), else from ``watermark − settle`` (first, from the horizon);
        returns the minute rows written."""
        written = self._update(now_ms, self._changed_from)
        self._changed_from = NO_CHANGE if self._told else None  # once written, not before
        return written

    def _update(self, now_ms: int, changed: int | None) -> int:
        row = self.con.execute(
            "SELECT version, watermark_ts_ms FROM request_rollup_state"
        ).fetchone()
        end = floor_to(now_ms, MINUTE_MS) + MINUTE_MS
        if row is None or row[0] != REQUEST_ROLLUP_VERSION:
            if row is not None:  # another layout: nothing of it may be summed with the new
                for table in REQUEST_ROLLUP_TABLES:
                    self.con.execute(f"DELETE FROM {table}")
            first = self.con.execute("SELECT min(received_ts_ms) FROM requests").fetchone()
            oldest = first[0] if first and first[0] is not None else now_ms
            start = max(floor_to(now_ms - self.horizon_ms, HOUR_MS), floor_to(oldest, MINUTE_MS))
            return self.recompute_by_day(min(start, end - MINUTE_MS), end)
        watermark = int(row[1])
        if changed is None:
            start = floor_to(watermark - self.settle_ms, MINUTE_MS)
        else:  # the last minute computed (it was open then) and every minute written since
            start = floor_to(min(watermark - MINUTE_MS, changed), MINUTE_MS)
        return self.recompute_by_day(min(start, end - MINUTE_MS), max(end, watermark))

    def recompute(self, start_ms: int, end_ms: int, *, final: bool = False) -> int:
        """Replace the minutes of ``[start_ms, end_ms)`` (whole minutes) from raw rows, then
        their hours, and extend the recorded reach; returns the minute rows written.

        ``final``: nothing more will arrive for these minutes (a generated history), so they
        are settled at once; otherwise the last ``settle_ms`` stay unsettled."""
        if start_ms % MINUTE_MS or end_ms % MINUTE_MS or end_ms <= start_ms:
            raise ValueError(f"whole minutes needed, got [{start_ms}, {end_ms})")
        con = self.con
        con.execute("BEGIN")
        try:
            written = self._replace_minutes(start_ms, end_ms)
            settled = self._extend_state(start_ms, end_ms, final)
            self._rebuild_hours(floor_to(start_ms, HOUR_MS), ceil_to(end_ms, HOUR_MS), *settled)
            con.execute("COMMIT")
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise
        return written

    def recompute_by_day(self, start_ms: int, end_ms: int, *, final: bool = False) -> int:
        """:meth:`recompute` a day per transaction (bounded memory on a first build)."""
        written = 0
        while start_ms < end_ms:
            stop = min(end_ms, floor_to(start_ms, DAY_MS) + DAY_MS)
            written += self.recompute(start_ms, stop, final=final)
            start_ms = stop
        return written

    def _replace_minutes(self, start_ms: int, end_ms: int) -> int:
        written = 0
        for table, (sql, params) in (
            ("request_minute", outcome_minutes_sql(start_ms, end_ms)),
            ("request_latency_minute", latency_minutes_sql(start_ms, end_ms)),
        ):
            self.con.execute(
                f"DELETE FROM {table} WHERE ts_ms >= ? AND ts_ms < ?", [start_ms, end_ms]
            )
            result = self.con.execute(
                f"INSERT INTO {table} SELECT * FROM ({sql}) ORDER BY ts_ms", params
            ).fetchone()
            written += int(result[0]) if result else 0
        return written

    def _rebuild_hours(
        self, start_ms: int, end_ms: int, settled_before_ms: int, settled_ms: int
    ) -> None:
        """Re-sum the hours of ``[start_ms, end_ms)`` (hour-aligned) from their minutes: the
        outcome hours all, the latency hours only where wholly settled (reads take the
        unsettled tail raw, :class:`RequestCoverage`), and those that became so as the
        settled bound moved from ``settled_before_ms`` to ``settled_ms``. Re-summing the
        open hour's latency bins every update cost more than the minutes it had changed
        (at 4,096 instances ~10⁷ minute rows for ~3·10⁵ new ones)."""
        hour = f"ts_ms // {HOUR_MS} * {HOUR_MS}"
        self._resum(
            "request_hour",
            f"SELECT {hour} AS h, pool, instance, address, outcome, sum(attempts), sum(requests), "
            "sum(pool_requests) FROM request_minute",
            (start_ms, end_ms),
            (start_ms, end_ms),
        )
        before, after = floor_to(settled_before_ms, HOUR_MS), floor_to(settled_ms, HOUR_MS)
        ranges = [((start_ms, end_ms), (start_ms, min(end_ms, after)))]  # unsettled: deleted
        ranges += [((a, b), (a, b)) for a, b in ((before, min(start_ms, after)),
                                                 (max(before, end_ms), after)) if a < b]  # fmt: skip
        for delete, insert in ranges:
            self._resum(
                "request_latency_hour",
                f"SELECT {hour} AS h, pool, instance, metric, bin, sum(samples), sum(sum_s), "
                "max(max_s) FROM request_latency_minute",
                delete,
                insert,
            )
            self._resum(  # after the instances' hours, from them
                "request_latency_pool_hour",
                "SELECT ts_ms AS h, pool, metric, bin, sum(samples), sum(sum_s), max(max_s) "
                "FROM request_latency_hour",
                delete,
                insert,
            )

    def _resum(
        self, table: str, select: str, delete: tuple[int, int], insert: tuple[int, int]
    ) -> None:
        """Delete ``table``'s rows in ``delete`` and insert ``select``'s in ``insert``."""
        self.con.execute(f"DELETE FROM {table} WHERE ts_ms >= ? AND ts_ms < ?", list(delete))
        if insert[0] < insert[1]:
            self.con.execute(
                f"INSERT INTO {table} {select} WHERE ts_ms >= ? AND ts_ms < ? "
                "GROUP BY ALL ORDER BY h",
                list(insert),
            )

    def _extend_state(self, start_ms: int, end_ms: int, final: bool) -> tuple[int, int]:
        """Record the reach extended by ``[start_ms, end_ms)``; returns the settled bound
        (ms) before and after (before a first build: ``start_ms``)."""
        row = self.con.execute(
            "SELECT start_ts_ms, settled_ts_ms, watermark_ts_ms FROM request_rollup_state "
            "WHERE version = ?",
            [REQUEST_ROLLUP_VERSION],
        ).fetchone()
        since, settled, watermark = (start_ms, start_ms, end_ms) if row is None else row
        since, watermark = min(int(since), start_ms), max(int(watermark), end_ms)
        before = int(settled)
        settled = max(before, watermark if final else watermark - self.settle_ms)
        self.con.execute("DELETE FROM request_rollup_state")
        self.con.execute(
            "INSERT INTO request_rollup_state VALUES (?, ?, ?, ?)",
            [REQUEST_ROLLUP_VERSION, since, max(since, settled), watermark],
        )
        return before, max(since, settled)

    def prune(self, before_ts_ms: int) -> int:
        """Drop minute rows older than ``before_ts_ms``; hours stay. Returns rows dropped."""
        dropped = 0
        for table in ("request_minute", "request_latency_minute"):
            result = self.con.execute(
                f"DELETE FROM {table} WHERE ts_ms < ?", [before_ts_ms]
            ).fetchone()
            dropped += int(result[0]) if result else 0
        return dropped


def rollup_history(con: duckdb.DuckDBPyConnection) -> int:
    """Roll up every request record of a generated history (nothing more will arrive), a day
    per transaction so memory stays bounded; returns the minute rows written (0: no records)."""
    rollup = RequestRollup(con)
    span = con.execute("SELECT min(received_ts_ms), max(received_ts_ms) FROM requests").fetchone()
    if span is None or span[0] is None:
        return 0
    start, end = floor_to(int(span[0]), MINUTE_MS), floor_to(int(span[1]), MINUTE_MS) + MINUTE_MS
    written = rollup.recompute_by_day(start, end, final=True)
    log.info("request rollups built over %d minute rows", written)
    return written
