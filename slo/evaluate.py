"""Evaluate every SLO of a model at one instant: SLI, budget left, burn rates, pair states.

Windows are whole minutes ending with the minute that holds ``now_ms``. A window's counts
come from ``slo_day`` for the whole UTC days it covers, from ``slo_hour`` for the whole hours
of the partial days at both ends and from ``slo_minute`` for the partial hours, so a 30-day
window reads ≤ 30 day, 46 hour and 118 minute rows per rollup key, whatever the traffic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import duckdb
import numpy as np

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, ceil_to, floor_to
from slo.budget import WindowCounts, budget_remaining, burn_rate, error_ratio, pair_alerting
from slo.spec.document import GROUP_DIMENSIONS
from slo.spec.model import Slo, SloModel
from slo.windows import AlertPair, format_duration

__all__ = ["PairState", "SloStatus", "count_matrix", "evaluate", "window_counts"]

RollupKey = tuple[str, ...]  # slo_id, then the GROUP_DIMENSIONS in their order


@dataclass(frozen=True)
class PairState:
    """One alert pair at evaluation time."""

    pair: AlertPair
    short_burn: float
    long_burn: float
    long_events: int
    alerting: bool
    guarded: bool  # the min-events guard held it back although both burn rates were over


@dataclass(frozen=True)
class SloStatus:
    """One SLO (or one group of it) evaluated at ``ts_ms``."""

    slo: Slo
    group: Mapping[str, str]
    ts_ms: int
    windows: Mapping[int, WindowCounts]  # window length ms → counts

    @property
    def period(self) -> WindowCounts:
        return self.windows[self.slo.period_ms]

    @property
    def sli(self) -> float | None:
        """Good fraction over the period, ``None`` without events."""
        ratio = error_ratio(self.period)
        return None if ratio is None else 1.0 - ratio

    @property
    def budget_remaining(self) -> float:
        return budget_remaining(self.period, self.slo.objective)

    def burn_rates(self) -> dict[int, float]:
        return {w: burn_rate(c, self.slo.objective) for w, c in sorted(self.windows.items())}

    def pairs(self) -> list[PairState]:
        states = []
        for pair in self.slo.pairs:
            short, long = self.windows[pair.short_ms], self.windows[pair.long_ms]
            over = pair_alerting(short, long, self.slo.objective, pair.factor)
            alerting = pair_alerting(
                short, long, self.slo.objective, pair.factor, self.slo.min_events
            )
            states.append(
                PairState(
                    pair,
                    burn_rate(short, self.slo.objective),
                    burn_rate(long, self.slo.objective),
                    long.total,
                    alerting,
                    over and not alerting,
                )
            )
        return states

    def as_dict(self) -> dict[str, object]:
        """JSON-ready view (used by ``slo report --json`` and the API)."""
        return {
            "slo": self.slo.id,
            "name": self.slo.name,
            "objective": self.slo.objective,
            "group": dict(self.group),
            "ts_ms": self.ts_ms,
            "sli": self.sli,
            "events": self.period.total,
            "bad": self.period.bad,
            "budget_remaining": self.budget_remaining,
            "burn_rates": {format_duration(w): b for w, b in self.burn_rates().items()},
            "pairs": [
                {
                    "id": p.pair.id,
                    "severity": p.pair.severity,
                    "factor": p.pair.factor,
                    "short_burn": p.short_burn,
                    "long_burn": p.long_burn,
                    "long_events": p.long_events,
                    "alerting": p.alerting,
                    "guarded": p.guarded,
                }
                for p in self.pairs()
            ],
        }


#: Rollup tables by grain, coarsest first.
_GRAINS = ((DAY_MS, "slo_day"), (HOUR_MS, "slo_hour"), (MINUTE_MS, "slo_minute"))
#: Finer ranges ending this close to the evaluation time share one scan per table.
_NEAR_MS = {HOUR_MS: 2 * DAY_MS, MINUTE_MS: 2 * HOUR_MS}


def _cover(start_ms: int, end_ms: int, grains: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(grain, start, end) ranges that exactly cover [start, end) (minute-aligned): the
    whole units of the coarsest grain inside, then finer ones at both edges."""
    if start_ms >= end_ms:
        return []
    grain, finer = grains[0], grains[1:]
    if not finer:
        return [(grain, start_ms, end_ms)]
    first, last = ceil_to(start_ms, grain), floor_to(end_ms, grain)
    if first >= last:
        return _cover(start_ms, end_ms, finer)
    return [*_cover(start_ms, first, finer), (grain, first, last), *_cover(last, end_ms, finer)]


def _sum_query(table: str, ranges: list[tuple[int, int]]) -> str:
    aggregates = ", ".join(
        f"CAST(coalesce(sum(total) FILTER (WHERE ts_ms >= {a} AND ts_ms < {b}), 0) AS BIGINT) AS t{i}, "
        f"CAST(coalesce(sum(bad) FILTER (WHERE ts_ms >= {a} AND ts_ms < {b}), 0) AS BIGINT) AS b{i}"
        for i, (a, b) in enumerate(ranges)
    )
    low, high = min(a for a, _ in ranges), max(b for _, b in ranges)
    return (
        f"SELECT key_id, {aggregates} FROM {table} "
        f"WHERE ts_ms >= {low} AND ts_ms < {high} GROUP BY key_id"
    )


def _plan(
    windows: list[int], end_ms: int, days: bool = True
) -> dict[tuple[str, int], list[tuple[int, tuple[int, int]]]]:
    """Queries to run: day ranges share one scan, hour and minute ranges near ``end`` one
    scan per table, and each far leading edge (of the 1 d, 3 d, 30 d windows) gets its own
    narrow scan. ``days=False``: a file without ``slo_day`` (hours serve the long windows)."""
    grains = tuple(g for g, _ in _GRAINS if days or g != DAY_MS)
    tables = dict(_GRAINS)
    batches: dict[tuple[str, int], list[tuple[int, tuple[int, int]]]] = defaultdict(list)
    for index, window in enumerate(windows):
        for grain, a, b in _cover(end_ms - window, end_ms, grains):
            table = tables[grain]
            near = grain == grains[0] or b > end_ms - _NEAR_MS[grain]
            batches[(table, 0 if near else a)].append((index, (a, b)))
    return batches


def count_matrix(
    con: duckdb.DuckDBPyConnection, slo_ids: list[str], windows: list[int], end_ms: int
) -> tuple[list[RollupKey], np.ndarray]:
    """Rollup keys of ``slo_ids`` and their counts: array[key, window, (total, bad)]."""
    marks = ", ".join("?" * len(slo_ids))
    rows = con.execute(
        f"SELECT key_id, slo_id, {', '.join(GROUP_DIMENSIONS)} FROM slo_keys "
        f"WHERE slo_id IN ({marks}) ORDER BY key_id",
        slo_ids,
    ).fetchall()
    key_ids = np.array([r[0] for r in rows], dtype=np.int64)
    keys: list[RollupKey] = [tuple(r[1:]) for r in rows]
    matrix = np.zeros((len(keys), len(windows), 2), dtype=np.int64)
    if not keys:
        return keys, matrix
    for (table, _), items in _plan(windows, end_ms, _has_days(con)).items():
        got = con.execute(_sum_query(table, [r for _, r in items])).fetchnumpy()
        ids = np.asarray(got["key_id"], dtype=np.int64)
        pos = np.clip(np.searchsorted(key_ids, ids), 0, len(key_ids) - 1)
        known = key_ids[pos] == ids  # rows of another spec's SLOs are ignored
        for i, (window_index, _) in enumerate(items):
            matrix[pos[known], window_index, 0] += np.asarray(got[f"t{i}"], dtype=np.int64)[known]
            matrix[pos[known], window_index, 1] += np.asarray(got[f"b{i}"], dtype=np.int64)[known]
    return keys, matrix


def window_counts(
    con: duckdb.DuckDBPyConnection, slo_ids: list[str], windows_ms: Iterable[int], end_ms: int
) -> dict[RollupKey, dict[int, WindowCounts]]:
    """Counts per rollup key and window ending at ``end_ms`` (minute-aligned)."""
    windows = sorted(set(windows_ms))
    keys, matrix = count_matrix(con, slo_ids, windows, end_ms)
    return {
        key: {
            w: WindowCounts(int(matrix[k, i, 0]), int(matrix[k, i, 1]))
            for i, w in enumerate(windows)
        }
        for k, key in enumerate(keys)
    }


def _has_days(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'slo_day'"
    ).fetchone()
    return bool(row and row[0])


def _has_rollups(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() "
        "WHERE table_name IN ('slo_minute', 'slo_hour', 'slo_keys')"
    ).fetchone()
    return bool(row and row[0] == 3)


class CountSource(Protocol):
    """Window counts kept across cycles (:class:`slo.window_sums.WindowSums`)."""

    def count_matrix(self, end_ms: int) -> tuple[list[RollupKey], np.ndarray]: ...


def evaluate(
    con: duckdb.DuckDBPyConnection,
    model: SloModel,
    now_ms: int,
    sums: CountSource | None = None,
) -> list[SloStatus]:
    """Every SLO of ``model`` (per group when it has ``group_by``) at ``now_ms``.

    An SLO (or group) without any event still gets a status: SLI ``None``, burn rates 0,
    budget 1.0; nothing is NaN. ``sums`` (of the same model and connection, told every
    rollup rewrite since its last use): the counts come from it, reading only what
    changed, with the same result as without.
    """
    end_ms = floor_to(now_ms, MINUTE_MS) + MINUTE_MS
    windows = sorted({w for slo in model.slos for w in slo.catalog.windows_ms})
    keys: list[RollupKey]
    if not _has_rollups(con):
        keys, matrix = [], np.zeros((0, len(windows), 2), dtype=np.int64)
    elif sums is not None:
        keys, matrix = sums.count_matrix(end_ms)
    else:
        keys, matrix = count_matrix(con, [slo.id for slo in model.slos], windows, end_ms)
    # Each SLO's keys by group (the positions of its group_by dimensions in a key), then
    # one sum per group: a Python step per key, none per key and window.
    positions = {
        slo.id: [1 + GROUP_DIMENSIONS.index(d) for d in slo.group_by] for slo in model.slos
    }
    members: dict[str, dict[tuple[str, ...], list[int]]] = defaultdict(dict)
    for k, key in enumerate(keys):
        group = tuple(key[i] for i in positions[key[0]])
        members[key[0]].setdefault(group, []).append(k)
    index = {w: i for i, w in enumerate(windows)}
    statuses = []
    for slo in model.slos:
        columns = [(w, index[w]) for w in slo.catalog.windows_ms]
        groups = members.get(slo.id) or {tuple("" for _ in slo.group_by): []}
        ordered = sorted(groups)
        # One vectorised sum per SLO over its keys in group order (a group has ≥ 1 key, but
        # for the one empty group of an SLO without keys).
        rows = [k for g in ordered for k in groups[g]]
        starts = np.cumsum([0] + [len(groups[g]) for g in ordered[:-1]])
        per_group = (
            np.add.reduceat(matrix[rows], starts, axis=0)
            if rows
            else np.zeros((len(ordered), len(windows), 2), dtype=np.int64)
        )
        for group, counts in zip(ordered, per_group.tolist(), strict=True):
            full = {w: WindowCounts(*counts[i]) for w, i in columns}
            statuses.append(
                SloStatus(slo, dict(zip(slo.group_by, group, strict=True)), now_ms, full)
            )
    return statuses
