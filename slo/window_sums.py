"""Window counts kept from one evaluation to the next, so a cycle reads only what changed.

:func:`slo.evaluate.count_matrix` sums, per rollup key and window, the ``slo_day``,
``slo_hour`` and ``slo_minute`` rows that exactly cover the window; at 4,096 instances that
is ~200 rows per key and ~5 M rows a cycle, although between two cycles 15 s apart almost
none of them changed. :class:`WindowSums` splits each window [end − w, end) the same way:

* its **body**, the whole days and hours in [ceil_hour(end − w), floor_hour(end)): the day
  and hour rows the full evaluation reads there, summed once per key and kept until the
  body moves (an edge crosses an hour) or the rollup rewrites one of its rows;
* its **minutes**, [end − w, ceil_hour(end − w)) and [floor_hour(end), end) (all of
  [end − w, end) for a window without a whole hour), taken from one per-key array of the
  minutes of each hour an edge is in: read once per hour, then only the minutes the rollup
  rewrote since (the open minute and late rows).

Every count is a sum of the very rows the full evaluation sums, so the answers are the
same, not close. What the rollup rewrote is told by
:meth:`slo.rollups.counts.Rollup.take_changes` (:meth:`WindowSums.note_changes`); rows
written otherwise (another process, a test inserting rollup rows) are not seen: evaluate
there without sums.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import numpy as np

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, ceil_to, floor_to
from slo.evaluate import _GRAINS, _NEAR_MS, RollupKey, _cover, _has_days, _sum_query
from slo.rollups.counts import RollupChange
from slo.spec.document import GROUP_DIMENSIONS
from slo.spec.model import SloModel

__all__ = ["WindowSums", "model_windows"]

log = logging.getLogger(__name__)

_MINUTES = HOUR_MS // MINUTE_MS
Range = tuple[str, int, int]  # table, start ms, end ms


def model_windows(model: SloModel) -> list[int]:
    """Every window length (ms) of the model's SLOs, ascending: the columns of a count matrix."""
    return sorted({w for slo in model.slos for w in slo.catalog.windows_ms})


@dataclass
class _Body:
    """A window's whole days and hours: the rows of ``ranges`` summed per key."""

    ranges: tuple[Range, ...]
    sums: np.ndarray  # [key, (total, bad)]


@dataclass
class _Lead:
    """A window's leading minutes [start, end) (end: the next whole hour) summed per key."""

    start_ms: int
    end_ms: int
    sums: np.ndarray  # [key, (total, bad)]


class WindowSums:
    """Per-key counts of every window of ``model``, kept across :meth:`count_matrix` calls
    on ``con``; told the rollup's rewrites with :meth:`note_changes`."""

    def __init__(self, con: duckdb.DuckDBPyConnection, model: SloModel) -> None:
        self.con = con
        self.slo_ids = [slo.id for slo in model.slos]
        self.windows = model_windows(model)
        self._key_ids = np.zeros(0, dtype=np.int64)
        self._keys: list[RollupKey] = []
        self._days: bool | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every kept sum: the next call reads every row it needs."""
        self._bodies: dict[int, _Body] = {}  # window length → its whole days and hours
        self._leads: dict[int, _Lead] = {}  # window length → its leading minutes
        self._tail_hour: int | None = None  # the hour of the minutes kept per key
        # [minute, key, (total, bad)]: a run of minutes sums as whole rows
        self._tail = np.zeros((_MINUTES, len(self._keys), 2), dtype=np.int64)
        self._stale: list[tuple[int, int]] = []  # minutes of the tail hour rewritten since

    def note_changes(self, changes: Iterable[RollupChange]) -> None:
        """Forget what ``changes`` rewrote: a body holding a rewritten day or hour row and
        leading minutes holding a rewritten minute are summed again, rewritten minutes of
        the kept hour read again, at the next :meth:`count_matrix`."""
        for change in changes:
            a, b = change.start_ms, change.end_ms
            if change.table != "slo_minute":
                self._bodies = {
                    w: body
                    for w, body in self._bodies.items()
                    if not any(t == change.table and s < b and a < e for t, s, e in body.ranges)
                }
                continue
            self._leads = {
                w: lead
                for w, lead in self._leads.items()
                if not (lead.start_ms < b and a < lead.end_ms)
            }
            hour = self._tail_hour
            if hour is not None and max(a, hour) < min(b, hour + HOUR_MS):
                self._stale.append((max(a, hour), min(b, hour + HOUR_MS)))

    def count_matrix(self, end_ms: int) -> tuple[list[RollupKey], np.ndarray]:
        """Rollup keys and their counts for the windows ending at ``end_ms`` (minute-aligned):
        array[key, window, (total, bad)], equal to :func:`slo.evaluate.count_matrix`'s."""
        self._sync_keys()
        matrix = np.zeros((len(self._keys), len(self.windows), 2), dtype=np.int64)
        if not self._keys:
            return self._keys, matrix
        if self._days is None:
            self._days = _has_days(self.con)
        hour = floor_to(end_ms, HOUR_MS)
        self._load_tail(hour)
        bodies, leads = {}, {}
        for w in self.windows:
            start = end_ms - w
            if start >= hour:  # within the kept hour
                matrix[:, self.windows.index(w)] = self._minutes(start, end_ms)
                continue
            bodies[w] = self._body_ranges(ceil_to(start, HOUR_MS), hour)
            leads[w] = (start, ceil_to(start, HOUR_MS))
        self._load_bodies(bodies, end_ms)
        self._load_leads(leads)
        tail = self._minutes(hour, end_ms)
        for w in bodies:
            i = self.windows.index(w)
            matrix[:, i] = self._leads[w].sums + tail
            if bodies[w]:
                matrix[:, i] += self._bodies[w].sums
        return self._keys, matrix

    def _minutes(self, start_ms: int, end_ms: int) -> np.ndarray:
        """Per-key sums of the kept hour's minutes in [start, end)."""
        hour = self._tail_hour
        assert hour is not None
        first, last = (start_ms - hour) // MINUTE_MS, (end_ms - hour) // MINUTE_MS
        return np.asarray(self._tail[first:last].sum(axis=0))

    def _body_ranges(self, start_ms: int, end_ms: int) -> tuple[Range, ...]:
        """The day and hour ranges that exactly cover [start, end) (hour-aligned), as the
        full evaluation's cover does."""
        grains = tuple(g for g, _ in _GRAINS if g != MINUTE_MS and (self._days or g != DAY_MS))
        tables = dict(_GRAINS)
        return tuple((tables[g], a, b) for g, a, b in _cover(start_ms, end_ms, grains))

    def _sync_keys(self) -> None:
        """Take up keys the rollup added since (kept sums get zeros for them: a new key's
        rows are in ranges the rollup rewrote, which are read again)."""
        marks = ", ".join("?" * len(self.slo_ids))
        row = self.con.execute(
            f"SELECT count(*) FROM slo_keys WHERE slo_id IN ({marks})", self.slo_ids
        ).fetchone()
        if row is not None and int(row[0]) == len(self._keys):
            return
        rows = self.con.execute(
            f"SELECT key_id, slo_id, {', '.join(GROUP_DIMENSIONS)} FROM slo_keys "
            f"WHERE slo_id IN ({marks}) ORDER BY key_id",
            self.slo_ids,
        ).fetchall()
        old = self._key_ids
        self._key_ids = np.array([r[0] for r in rows], dtype=np.int64)
        self._keys = [tuple(r[1:]) for r in rows]
        pos, known = self._positions(old)
        if not known.all():  # a key went (the file's keys rewritten): nothing kept holds
            self.reset()
            return
        keys = len(self._keys)
        for body in self._bodies.values():
            body.sums = _moved(body.sums, pos, keys)
        for lead in self._leads.values():
            lead.sums = _moved(lead.sums, pos, keys)
        self._tail = _moved(self._tail.swapaxes(0, 1), pos, keys).swapaxes(0, 1).copy()

    def _positions(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``ids`` among the keys, and which of them are keys at all (rows of
        another spec's SLOs are not)."""
        key_ids = self._key_ids
        if not len(key_ids):
            return np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
        pos = np.clip(np.searchsorted(key_ids, ids), 0, len(key_ids) - 1)
        return pos, key_ids[pos] == ids

    def _sums(self, table: str, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
        """Per-key sums of ``table``'s rows in each of ``ranges``, in one scan."""
        got = self.con.execute(_sum_query(table, ranges)).fetchnumpy()
        pos, known = self._positions(np.asarray(got["key_id"], dtype=np.int64))
        sums = []
        for i in range(len(ranges)):
            counts = np.zeros((len(self._keys), 2), dtype=np.int64)
            counts[pos[known], 0] = np.asarray(got[f"t{i}"], dtype=np.int64)[known]
            counts[pos[known], 1] = np.asarray(got[f"b{i}"], dtype=np.int64)[known]
            sums.append(counts)
        return sums

    def _batched(self, ranges: Iterable[Range], end_ms: int | None) -> dict[Range, np.ndarray]:
        """Per-key sums of each range: one scan per table for the day ranges and the hour
        ranges of the 2 days before ``end``, one per other range (a window's far edge;
        every range when ``end`` is ``None``)."""
        batches: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        for table, a, b in ranges:
            near = end_ms is not None and (table == "slo_day" or b > end_ms - _NEAR_MS[HOUR_MS])
            batch = batches[(table, 0 if near else a)]
            if (a, b) not in batch:
                batch.append((a, b))
        sums: dict[Range, np.ndarray] = {}
        for (table, _), batch in batches.items():
            for (a, b), counts in zip(batch, self._sums(table, batch), strict=True):
                sums[(table, a, b)] = counts
        return sums

    def _load_bodies(self, bodies: dict[int, tuple[Range, ...]], end_ms: int) -> None:
        """Sum the bodies that are not kept (moved, or a row of theirs rewritten)."""
        todo = {
            w: ranges
            for w, ranges in bodies.items()
            if ranges and (w not in self._bodies or self._bodies[w].ranges != ranges)
        }
        sums = self._batched((r for ranges in todo.values() for r in ranges), end_ms)
        for w, ranges in todo.items():
            total = np.zeros((len(self._keys), 2), dtype=np.int64)
            for r in ranges:
                total += sums[r]
            self._bodies[w] = _Body(ranges, total)

    def _load_leads(self, leads: dict[int, tuple[int, int]]) -> None:
        """Bring each window's leading minutes to [start, end): a kept sum over the same end
        that starts earlier loses the minutes the window left (the same rows, unchanged since:
        a rewrite of one forgets the sum); any other is read whole."""
        left: dict[int, Range] = {}
        whole: dict[int, Range] = {}
        for w, (start, end) in leads.items():
            kept = self._leads.get(w)
            if kept is not None and kept.end_ms == end and kept.start_ms <= start:
                if kept.start_ms < start:
                    left[w] = ("slo_minute", kept.start_ms, start)
            else:
                whole[w] = ("slo_minute", start, end)
        sums = self._batched([*left.values(), *(r for r in whole.values() if r[1] < r[2])], None)
        for w, r in left.items():
            kept = self._leads[w]
            self._leads[w] = _Lead(r[2], kept.end_ms, kept.sums - sums[r])
        for w, (_, start, end) in whole.items():
            counts = sums[("slo_minute", start, end)] if start < end else None
            if counts is None:
                counts = np.zeros((len(self._keys), 2), dtype=np.int64)
            self._leads[w] = _Lead(start, end, counts.copy())

    def _load_tail(self, hour: int) -> None:
        """The minutes of ``hour`` per key: read whole when the hour is new, else only the
        minutes rewritten since."""
        if self._tail_hour != hour:
            self._tail_hour, self._stale = hour, [(hour, hour + HOUR_MS)]
            self._tail = np.zeros((_MINUTES, len(self._keys), 2), dtype=np.int64)
        for a, b in _merged(self._stale):
            self._read_minutes(hour, a, b)
        self._stale = []

    def _read_minutes(self, hour: int, start_ms: int, end_ms: int) -> None:
        got = self.con.execute(
            f"""SELECT key_id, (ts_ms - {hour}) // {MINUTE_MS} AS m,
                       CAST(sum(total) AS BIGINT) AS t, CAST(sum(bad) AS BIGINT) AS b
                FROM slo_minute WHERE ts_ms >= {start_ms} AND ts_ms < {end_ms}
                GROUP BY ALL"""
        ).fetchnumpy()
        first, last = (start_ms - hour) // MINUTE_MS, (end_ms - hour) // MINUTE_MS
        self._tail[first:last] = 0
        pos, known = self._positions(np.asarray(got["key_id"], dtype=np.int64))
        minute = np.asarray(got["m"], dtype=np.int64)[known]
        self._tail[minute, pos[known], 0] = np.asarray(got["t"], dtype=np.int64)[known]
        self._tail[minute, pos[known], 1] = np.asarray(got["b"], dtype=np.int64)[known]


def _moved(array: np.ndarray, pos: np.ndarray, keys: int) -> np.ndarray:
    """``array``'s rows at positions ``pos`` of a ``keys``-row array of zeros."""
    moved = np.zeros((keys, *array.shape[1:]), dtype=array.dtype)
    moved[pos] = array
    return moved


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching [a, b) ranges merged (the rollup rewrites the same recent
    minutes for every SLO), minute-aligned outwards."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted((floor_to(a, MINUTE_MS), ceil_to(b, MINUTE_MS)) for a, b in ranges):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
