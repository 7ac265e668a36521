"""Per-minute and per-hour good/total counts per SLO × (pool, instance, tenant, route).

Tables (declared in :mod:`slo.tables`, created here):

* ``slo_keys``: one row per SLO × (pool, instance, tenant, route), with its integer key;
* ``slo_minute``: one row per key and minute that had events;
* ``slo_hour``: the same summed per hour;
* ``slo_day``: the same summed per UTC day, so a 30-day window reads ~30 day rows, ≤ 46 hour
  rows and ≤ 118 minute rows per key (at 4,096 instances, hours alone were 3 M rows a cycle);
* ``slo_rollup_state``: per SLO, the spec fingerprint and the watermark reached.

A minute is always *recomputed* from raw rows (delete, then insert, in one transaction),
never incremented, so re-running any range gives the same rows (idempotent). Each update
recomputes from the watermark (the last minute it computed, open then) to the minute of
``now``, and before it the minutes that rows written since may have changed: given what was
written (``changed_from_ms``, the Iceberg mirror's report), from the earliest new event
time (for request SLOs, from the first attempt of any client retried since); not given,
from ``watermark − settle`` (late records). When an SLO's definition changes its rows are
rebuilt from whatever raw data is still retained.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import duckdb

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, ceil_to, floor_to
from slo.rollups._sli_sql import (
    RETRY_LOOKBACK_MS,
    engine_minutes_sql,
    records_of,
    tap_minutes_sql,
)
from slo.rollups._written import NO_CHANGE, earliest
from slo.spec.model import Slo, SloModel
from slo.tables import ROLLUP_TABLES

__all__ = ["ROLLUP_TABLES", "Rollup", "RollupChange", "RollupStats", "create_rollup_tables"]

log = logging.getLogger(__name__)

#: The integer key of one (SLO, pool, instance, tenant, route): evaluations group by an
#: integer, not by four strings. Any key_id is fine as long as slo_keys maps it (the
#: evaluator re-aggregates by the dimensions), so DuckDB's hash() may change across versions.
_KEY_ID = "(hash(slo_id, pool, instance, tenant, route) >> 1)::BIGINT"


def create_rollup_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the rollup tables if missing (idempotent). A file whose rollups predate
    ``slo_day`` gets it filled from ``slo_hour`` once, so long windows keep their history."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND table_name = 'slo_day'"
    ).fetchone()
    had_days = bool(row and row[0])
    for table in ROLLUP_TABLES.values():
        table.create(con)
    if not had_days:
        con.execute(f"INSERT INTO slo_day {_DAYS_SQL} GROUP BY ALL ORDER BY day", [-(2**62), 2**62])


#: ``slo_day`` rows of one SLO's (or every SLO's) hours in [?, ?).
_DAYS_SQL = f"""SELECT slo_id, key_id, (ts_ms // {DAY_MS}) * {DAY_MS} AS day, sum(total), sum(bad)
    FROM slo_hour WHERE ts_ms >= ? AND ts_ms < ?"""


#: Bumped when the meaning of an event changes, so stored rollups are rebuilt once:
#: 2 = tap events per client request (``original_request_id``), no longer per attempt;
#: 3 = outcome classes (client 4xx and cancellations excluded by default).
EVENTS_VERSION = 3


def fingerprint(slo: Slo) -> str:
    """Hash of everything that decides which events are good or bad."""
    text = repr(
        (
            EVENTS_VERSION,
            slo.sli.model_dump(),
            sorted(slo.selector.items()),
            sorted(slo.group_by),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class RollupStats:
    """What one :meth:`Rollup.update` did."""

    minutes_rows: int = 0
    rebuilt: int = 0


@dataclass(frozen=True)
class RollupChange:
    """Rows of ``table`` (``slo_minute``, ``slo_hour`` or ``slo_day``) in [start, end)
    (ms) that one write replaced or deleted, whatever their SLO."""

    table: str
    start_ms: int
    end_ms: int


def _ranges_sql(ranges: list[tuple[str, int, int]]) -> tuple[str, list[object]]:
    """A condition keeping the rows of each (slo_id, start, end) (ms), and its parameters:
    the outer [min start, max end) lets DuckDB skip the row groups outside it."""
    each = " OR ".join(["(slo_id = ? AND ts_ms >= ? AND ts_ms < ?)"] * len(ranges))
    bounds = [min(a for _, a, _ in ranges), max(b for _, _, b in ranges)]
    return f"ts_ms >= ? AND ts_ms < ? AND ({each})", [*bounds, *(v for r in ranges for v in r)]


def source_table(slo: Slo) -> str:
    """The raw table an SLO's minutes are computed from."""
    return "engine_samples" if slo.sli.source == "engine" else "requests"


class Rollup:
    """Keeps ``slo_minute`` / ``slo_hour`` / ``slo_day`` current for every SLO of a model.

    ``settle_ms``: how far behind the watermark an update recomputes when it is not told
    what was written (late records). ``horizon_ms``: the raw-data horizon; a first build or
    a rebuild starts there.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        model: SloModel,
        *,
        settle_ms: int = 10 * MINUTE_MS,
        horizon_ms: int = 7 * DAY_MS,
    ) -> None:
        self.con = con
        self.model = model
        self.settle_ms = settle_ms
        self.horizon_ms = horizon_ms
        #: Per SLO, the earliest event time written since its last recompute by this object
        #: (``None``: unknown, so the settle window); an SLO absent is unknown too.
        self._changed_from: dict[str, int | None] = {}
        self._told = False  # whether a writer tells its writes (note_written) at all
        self._first_attempts: dict[tuple[int, str], int] = {}  # per change time, kind
        self._any_records: dict[tuple[str, int, int], bool] = {}  # per kind, range (_idle)
        self._changes: list[RollupChange] = []
        create_rollup_tables(con)

    def take_changes(self) -> list[RollupChange]:
        """The rollup rows this object replaced or deleted since the last call (in the
        order written), for a reader that keeps sums of them
        (:class:`slo.window_sums.WindowSums`); the list is emptied."""
        changes, self._changes = self._changes, []
        return changes

    def note_written(self, changed_from_ms: Mapping[str, int | None]) -> None:
        """Tell the rollup what was written to the raw tables since the last call: table →
        earliest event time (ms) of its new rows (a table absent: nothing; ``None``: anything
        may have changed). A writer that tells every write (the Iceberg mirror's
        :attr:`~pipeline.iceberg.mirror.MirrorReport.changed_from_ms`) makes each update
        recompute only the minutes the new rows fell in, late ones included."""
        self._told = True
        for slo in self.model.slos:
            known = self._changed_from.get(slo.id)
            new = changed_from_ms.get(source_table(slo), NO_CHANGE)
            self._changed_from[slo.id] = earliest(known, new)

    def update(self, now_ms: int) -> RollupStats:
        """Recompute each SLO's minutes up to the minute of ``now_ms``: from its watermark
        or the earliest minute written since (:meth:`note_written`), whichever is first; from
        watermark − settle when the writes since its last update are unknown (none told, or
        its first update by this object)."""
        self._first_attempts = {}
        self._any_records = {}
        stats = RollupStats()
        end = floor_to(now_ms, MINUTE_MS) + MINUTE_MS
        rows = self.con.execute(
            "SELECT slo_id, fingerprint, watermark_ts_ms FROM slo_rollup_state"
        ).fetchall()
        state = {slo_id: (fp, watermark) for slo_id, fp, watermark in rows}
        pending: list[tuple[Slo, int, str]] = []  # (SLO, start, fingerprint) to recompute
        for slo in self.model.slos:
            fp = fingerprint(slo)
            known = state.get(slo.id)
            if known is None or known[0] != fp:
                start = floor_to(now_ms - self.horizon_ms, HOUR_MS)
                stats.rebuilt += known is not None
                self._delete(slo.id, 0, end)
            else:
                start = self._start(slo, int(known[1]))
            if self._idle(slo, start, end):
                self._advance(slo.id, fp, start, end)
            else:
                pending.append((slo, start, fp))
        if pending:
            stats.minutes_rows += self._recompute_all(pending, end)
        for slo in self.model.slos:
            self._changed_from[slo.id] = NO_CHANGE if self._told else None
        return stats

    def _idle(self, slo: Slo, start_ms: int, end_ms: int) -> bool:
        """Whether recomputing [start, end) of a request SLO would change nothing: none of
        its records (the events' minute is their first attempt's, so in the range) and none
        of its minutes there. Its hours and days are its minutes' sums, so they stand too;
        the prober's SLOs are idle most cycles, and a recompute costs its statements. The
        records are looked for once per kind and range (the SLOs of a kind share a range)."""
        if source_table(slo) != "requests":
            return False
        key = (records_of(slo), start_ms, end_ms)
        if key not in self._any_records:
            row = self.con.execute(
                f"""SELECT EXISTS (SELECT 1 FROM requests WHERE received_ts_ms >= ?
                                   AND received_ts_ms < ? AND {key[0]})""",
                [start_ms, end_ms],
            ).fetchone()
            self._any_records[key] = bool(row and row[0])
        if self._any_records[key]:
            return False
        row = self.con.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM slo_minute WHERE slo_id = ? "
            "AND ts_ms >= ? AND ts_ms < ?)",
            [slo.id, start_ms, end_ms],
        ).fetchone()
        return bool(row and row[0])

    def _advance(self, slo_id: str, fp: str, start_ms: int, end_ms: int) -> None:
        """Record [start, end) as computed (the watermark a recompute would leave)."""
        self.con.execute(
            "INSERT OR REPLACE INTO slo_rollup_state VALUES (?, ?, ?)",
            [slo_id, fp, max(end_ms - MINUTE_MS, start_ms)],
        )

    def _start(self, slo: Slo, watermark_ms: int) -> int:
        """Where an update of ``slo`` starts: see :meth:`update`."""
        changed = self._changed_from.get(slo.id)
        if changed is None:
            return floor_to(watermark_ms - self.settle_ms, MINUTE_MS)
        start = min(watermark_ms, changed)
        if source_table(slo) == "requests" and changed < NO_CHANGE:
            start = min(start, self._first_attempt_from(changed, records_of(slo)))
        return floor_to(start, MINUTE_MS)

    def _first_attempt_from(self, changed_ms: int, records: str) -> int:
        """The first attempt's time of any request of ``records`` (the SLO's kind, a
        :func:`~slo.request_sources.source_filter` condition) retried at or after
        ``changed_ms``: a new attempt moves its request's event to that attempt's minute
        (:func:`~slo.rollups._sli_sql.tap_minutes_sql`), up to RETRY_LOOKBACK_MS before."""
        key = (changed_ms, records)
        if key not in self._first_attempts:
            row = self.con.execute(
                f"""SELECT min(received_ts_ms) FROM requests
                   WHERE received_ts_ms >= ? AND {records}
                     AND coalesce(original_request_id, request_id) IN
                       (SELECT original_request_id FROM requests
                        WHERE received_ts_ms >= ? AND attempt > 1 AND {records})""",
                [changed_ms - RETRY_LOOKBACK_MS, changed_ms],
            ).fetchone()
            found = row[0] if row else None
            self._first_attempts[key] = NO_CHANGE if found is None else int(found)
        return self._first_attempts[key]

    def recompute(self, slo: Slo, start_ms: int, end_ms: int, fp: str | None = None) -> int:
        """Replace the SLO's minutes in [start, end) from raw rows, then its hours; returns rows."""
        return self._recompute_all([(slo, start_ms, fp or fingerprint(slo))], end_ms)

    def _recompute_all(self, pending: list[tuple[Slo, int, str]], end_ms: int) -> int:
        """Replace each (SLO, start, fingerprint)'s minutes in [start, end), then their hours
        and days, in one transaction (one commit, one re-sum of hours and of days for all)."""
        con = self.con
        con.execute("BEGIN")
        try:
            inserted = sum(self._write_minutes(slo, start, end_ms) for slo, start, _ in pending)
            self._rebuild_hours_of(
                [
                    (slo.id, floor_to(start, HOUR_MS), floor_to(end_ms - 1, HOUR_MS) + HOUR_MS)
                    for slo, start, _ in pending
                ]
            )
            for slo, start, fp in pending:
                self._advance(slo.id, fp, start, end_ms)
            con.execute("COMMIT")
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise
        return inserted

    def _write_minutes(self, slo: Slo, start_ms: int, end_ms: int) -> int:
        """Replace the SLO's minutes in [start, end) (in the caller's transaction)."""
        build = engine_minutes_sql if slo.sli.source == "engine" else tap_minutes_sql
        sql, params = build(slo, start_ms, end_ms)
        con = self.con
        self._changes.append(RollupChange("slo_minute", start_ms, end_ms))  # even if rolled back
        con.execute(
            "DELETE FROM slo_minute WHERE slo_id = ? AND ts_ms >= ? AND ts_ms < ?",
            [slo.id, start_ms, end_ms],
        )
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE _slo_new AS SELECT *, {_KEY_ID} AS key_id FROM ({sql})",
            params,
        )
        con.execute(
            "INSERT INTO slo_keys "
            "SELECT DISTINCT key_id, slo_id, pool, instance, tenant, route "
            "FROM _slo_new ANTI JOIN slo_keys USING (key_id)"
        )
        # The range was emptied above: the rows inserted are the range's rows.
        inserted = con.execute(
            "INSERT INTO slo_minute "
            "SELECT slo_id, key_id, ts_ms, total, bad FROM _slo_new ORDER BY ts_ms"
        ).fetchone()
        con.execute("DROP TABLE _slo_new")
        return int(inserted[0]) if inserted else 0

    def rebuild_hours(self, slo_id: str, start_ms: int, end_ms: int) -> None:
        """Recompute ``slo_hour`` for [start, end) (hour-aligned) from ``slo_minute``, then
        ``slo_day`` for the days those hours are in."""
        self._rebuild_hours_of([(slo_id, start_ms, end_ms)])

    def _rebuild_hours_of(self, ranges: list[tuple[str, int, int]]) -> None:
        """:meth:`rebuild_hours` of several (SLO, start, end): one statement per table."""
        days = [(slo_id, floor_to(a, DAY_MS), ceil_to(b, DAY_MS)) for slo_id, a, b in ranges]
        for (_, a, b), (_, day_a, day_b) in zip(ranges, days, strict=True):
            self._changes.append(RollupChange("slo_hour", a, b))
            self._changes.append(RollupChange("slo_day", day_a, day_b))
        hours_in, hour_params = _ranges_sql(ranges)
        days_in, day_params = _ranges_sql(days)
        self.con.execute(f"DELETE FROM slo_hour WHERE {hours_in}", hour_params)
        self.con.execute(
            f"""INSERT INTO slo_hour
                SELECT slo_id, key_id, (ts_ms // {HOUR_MS}) * {HOUR_MS} AS hour,
                       sum(total), sum(bad)
                FROM slo_minute WHERE {hours_in}
                GROUP BY ALL ORDER BY hour""",
            hour_params,
        )
        self.con.execute(f"DELETE FROM slo_day WHERE {days_in}", day_params)
        self.con.execute(
            f"INSERT INTO slo_day {_DAYS_SQL} AND {days_in} GROUP BY ALL ORDER BY day",
            [*day_params[:2], *day_params],
        )

    def _delete(self, slo_id: str, start_ms: int, end_ms: int) -> None:
        for table in ("slo_minute", "slo_hour", "slo_day"):
            self._changes.append(RollupChange(table, start_ms, end_ms))
            self.con.execute(
                f"DELETE FROM {table} WHERE slo_id = ? AND ts_ms >= ? AND ts_ms < ?",
                [slo_id, start_ms, end_ms],
            )

    def prune(self, before_ts_ms: int) -> int:
        """Drop minute rows older than ``before_ts_ms`` (keep ≥ the longest period); hours and
        days stay."""
        result = self.con.execute(
            "DELETE FROM slo_minute WHERE ts_ms < ?", [before_ts_ms]
        ).fetchone()
        return int(result[0]) if result else 0
