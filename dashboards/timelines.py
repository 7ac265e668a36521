"""The Fleet page's strips as frames: the alert state of every SLO group over time, and the
degradation level of every instance over time.

No table stores the alert state per evaluation (``slo_status_current`` holds the last one),
so :func:`alert_states` recomputes it from the SLO rollups the jobs store
(``budget_series``): at the end of each bucket, the burn rate over each alert pair's long
and short window (counted in whole buckets, at least one) against the pair's factor, with
the jobs' own rule (:func:`slo.budget.pair_alerting`, both windows strictly above). The
low-traffic guard (``min_events``) is not in the stored status, so it is not applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from slo.budget import WindowCounts, pair_alerting
from slo.windows import parse_duration_ms

__all__ = [
    "ALERT_STATES",
    "LEVEL_NAMES",
    "Pair",
    "alert_states",
    "level_spans",
    "status_pairs",
]

#: Strip colours, worst first: a cell shows the worst pair alerting at that time.
ALERT_STATES = ("page", "ticket", "ok", "no events")
LEVEL_NAMES = ("L0", "L1", "L2", "L3")


@dataclass(frozen=True)
class Pair:
    """One alert window pair as stored in an SLO status: fires above ``factor`` on both."""

    severity: str
    factor: float
    long_ms: int
    short_ms: int


def status_pairs(status_json: str) -> list[Pair]:
    """The alert pairs of a stored status (``slo_status_current.status_json``); a pair whose
    id is not ``severity-long-short`` is skipped."""
    pairs = []
    for raw in json.loads(status_json or "{}").get("pairs", []):
        severity, _, windows = str(raw.get("id", "")).partition("-")
        long, _, short = windows.partition("-")
        try:
            pairs.append(
                Pair(
                    severity,
                    float(raw["factor"]),
                    parse_duration_ms(long),
                    parse_duration_ms(short),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return pairs


def _rolling(values: pd.Series, width: int) -> list[int]:
    return [int(v) for v in values.rolling(width, min_periods=1).sum()]


def _rank(severity: str) -> int:
    """Worse severities rank higher, so they are applied last and win the cell."""
    return -ALERT_STATES.index(severity) if severity in ALERT_STATES else -len(ALERT_STATES)


def alert_states(
    series: pd.DataFrame,
    *,
    pairs: Sequence[Pair],
    objective: float,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
) -> pd.DataFrame:
    """One row per bucket of ``[start_ms, end_ms)``: ``start_ms``/``end_ms`` of the bucket,
    ``state`` (``page``, ``ticket``, ``ok``, or ``no events`` when no pair's long window holds
    one) and ``detail`` (each pair's long/short burn rate, ``×`` budget).

    ``series`` has ``bucket_ts_ms``, ``total`` and ``bad`` per bucket (missing buckets count
    zero); what it holds before ``start_ms`` fills the first buckets' long windows.
    """
    longest = max((p.long_ms for p in pairs), default=bucket_ms)
    grid = pd.RangeIndex((start_ms - longest) // bucket_ms * bucket_ms, end_ms, bucket_ms)
    counts = series.groupby("bucket_ts_ms")[["total", "bad"]].sum().reindex(grid, fill_value=0)
    states = ["no events"] * len(grid)
    details: list[list[str]] = [[] for _ in grid]
    allowed = 1.0 - objective
    for pair in sorted(pairs, key=lambda p: _rank(p.severity)):
        widths = [max(1, round(ms / bucket_ms)) for ms in (pair.long_ms, pair.short_ms)]
        (long_total, long_bad), (short_total, short_bad) = [
            (_rolling(counts["total"], n), _rolling(counts["bad"], n)) for n in widths
        ]
        for i in range(len(grid)):
            long = WindowCounts(long_total[i], long_bad[i])
            short = WindowCounts(short_total[i], short_bad[i])
            if long.total == 0:
                continue
            if pair_alerting(short, long, objective, pair.factor):
                states[i] = pair.severity
            elif states[i] == "no events":
                states[i] = "ok"
            burns = [c.bad / c.total / allowed if c.total else 0.0 for c in (long, short)]
            details[i].insert(
                0, f"{pair.severity} ×{pair.factor:g}: {burns[0]:,.1f} / {burns[1]:,.1f}"
            )
    rows = pd.DataFrame(
        {
            "start_ms": grid,
            "end_ms": grid + bucket_ms,
            "state": states,
            "detail": ["; ".join(d) for d in details],
        }
    )
    return rows[rows["end_ms"] > start_ms].reset_index(drop=True)


def level_spans(
    transitions: Iterable[Mapping[str, object]],
    *,
    before: Mapping[str, int],
    instances: Iterable[str],
    start_ms: int,
    end_ms: int,
) -> pd.DataFrame:
    """Degradation level per instance as spans: ``instance``, ``level`` (``L0``–``L3``),
    ``start_ms``, ``end_ms``, ``reason``. ``transitions`` are the range's (oldest first, with
    ``ts_ms``, ``scope_id``, ``to_level``, ``reason``), ``before`` each instance's level at
    ``start_ms`` (absent: L0), ``instances`` those to show even if no flag ever moved."""
    moves: dict[str, list[tuple[int, int, str]]] = {name: [] for name in instances}
    for name in before:
        moves.setdefault(name, [])
    for row in transitions:
        moves.setdefault(str(row["scope_id"]), []).append(
            (int(row["ts_ms"]), int(row["to_level"]), str(row.get("reason") or ""))  # type: ignore[call-overload]
        )
    rows = []
    for name in sorted(moves):
        level, since, reason = int(before.get(name, 0)), start_ms, "before the range"
        for ts_ms, to_level, why in sorted(moves[name]):
            if ts_ms > since:
                rows.append((name, f"L{level}", since, ts_ms, reason))
            level, since, reason = to_level, max(ts_ms, start_ms), why
        rows.append((name, f"L{level}", since, end_ms, reason))
    return pd.DataFrame(rows, columns=["instance", "level", "start_ms", "end_ms", "reason"])
