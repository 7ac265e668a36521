"""The Fleet strip's former per-group path, kept verbatim as the reference that
:func:`slo.queries.slo_alert_spans` is checked against: one SLO group's events out of every
group's (``slo_series``), its alert state per bucket in numpy with the tooltip text, and
consecutive buckets of one state merged into spans; and the strip's former pandas fold of the
groups past its row limit (:func:`fold_groups`), which the read's ``most_rows`` replaced."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from slo.queries.alert_spans import ALERT_STATES, Pair


def _window_sums(values: np.ndarray, width: int) -> np.ndarray:
    """Sum of the last ``width`` values at each index (fewer at the start)."""
    running = np.concatenate(([0], np.cumsum(values)))
    ends = np.arange(1, len(values) + 1)
    return running[ends] - running[np.maximum(ends - width, 0)]


def _burns(
    total: np.ndarray, bad: np.ndarray, width: int, objective: float
) -> tuple[np.ndarray, np.ndarray]:
    """(events, burn rate) over the last ``width`` buckets at each bucket's end: the burn is
    :func:`slo.budget.burn_rate` over whole arrays (0 for a window without events)."""
    events, errors = _window_sums(total, width), _window_sums(bad, width)
    ratio = np.divide(errors, events, out=np.zeros(len(events)), where=events > 0)
    return events, ratio / (1.0 - objective)


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
    one) and ``detail`` (each pair's long/short burn rate, ``×`` budget, at the bucket's end).

    A pair fires as :func:`slo.budget.pair_alerting` says (both burns strictly above the
    factor), computed over whole arrays: a page of 30 days × 64 groups has 70,000 cells.
    ``series`` has ``bucket_ts_ms``, ``total`` and ``bad`` per bucket (missing buckets count
    zero); what it holds before ``start_ms`` fills the first buckets' long windows.
    """
    longest = max((p.long_ms for p in pairs), default=bucket_ms)
    grid = pd.RangeIndex((start_ms - longest) // bucket_ms * bucket_ms, end_ms, bucket_ms)
    total, bad = np.zeros(len(grid)), np.zeros(len(grid))
    slots = (series["bucket_ts_ms"].to_numpy(dtype=np.int64) - grid.start) // bucket_ms
    inside = (slots >= 0) & (slots < len(grid))
    np.add.at(total, slots[inside], series["total"].to_numpy(dtype=float)[inside])
    np.add.at(bad, slots[inside], series["bad"].to_numpy(dtype=float)[inside])
    states = np.full(len(grid), "no events", dtype=object)
    details = [""] * len(grid)
    for pair in sorted(pairs, key=lambda p: _rank(p.severity)):
        widths = [max(1, round(ms / bucket_ms)) for ms in (pair.long_ms, pair.short_ms)]
        (long_total, long_burn), (_, short_burn) = [
            _burns(total, bad, n, objective) for n in widths
        ]
        seen = long_total > 0
        firing = seen & (long_burn > pair.factor) & (short_burn > pair.factor)
        states[seen & ~firing & (states == "no events")] = "ok"
        states[firing] = pair.severity
        label = f"{pair.severity} ×{pair.factor:g}: "
        details = [
            f"{label}{lb:,.1f} / {sb:,.1f}" + ("; " if d else "") + d if s else d
            for d, s, lb, sb in zip(details, seen, long_burn, short_burn, strict=True)
        ]
    rows = pd.DataFrame(
        {"start_ms": grid, "end_ms": grid + bucket_ms, "state": states, "detail": details}
    )
    return rows[rows["end_ms"] > start_ms].reset_index(drop=True)


def group_series(series: pd.DataFrame, slo_id: str, group: Mapping[str, str]) -> pd.DataFrame:
    """One SLO group's ``bucket_ts_ms``, ``total``, ``bad`` out of every group's
    (:func:`slo.queries.slo_series`): the keys whose columns equal the group's values,
    summed per bucket, as :func:`slo.queries.budget_series` reads them."""
    mask = series["slo_id"] == slo_id
    for column, value in group.items():
        mask &= series[column] == value if column in series else False
    mine = series[mask]
    return mine.groupby("bucket_ts_ms", as_index=False)[["total", "bad"]].sum()


def merge_runs(cells: pd.DataFrame) -> pd.DataFrame:
    """:func:`alert_states` rows with consecutive buckets of one state joined into one span
    (``start_ms`` of the first, ``end_ms`` and ``detail`` of the last): a browser draws a
    few hundred rectangles for a fleet instead of tens of thousands."""
    if cells.empty:
        return cells
    run = (cells["state"] != cells["state"].shift()).cumsum()
    spans = cells.groupby(run, sort=False).agg(
        start_ms=("start_ms", "first"),
        end_ms=("end_ms", "last"),
        state=("state", "first"),
        detail=("detail", "last"),
    )
    return spans.reset_index(drop=True)


def fold_groups(spans: pd.DataFrame, *, most: int) -> pd.DataFrame:
    """The rows an alert strip draws from ``spans`` (:func:`slo.queries.slo_alert_spans`
    columns without ``folded``): every group its own row when there are at most ``most``; else the ``most``
    groups in ``page`` at the end, then in ``ticket`` there, then the longest in ``page``,
    then in ``ticket`` (ties by SLO and group), and the other
    groups of each SLO folded into one row whose spans are their worst state at each time
    (:data:`~slo.queries.alert_spans.ALERT_STATES` order; other states rank below).

    Adds ``folded``: 0 on a group's own row, the number of groups on a folded one (whose
    ``group_json`` is null and ``burns`` empty)."""
    keys = ["slo_id", "group_json"]
    if spans.empty or spans[keys].drop_duplicates().shape[0] <= most:
        return spans.assign(folded=0)
    length = spans["end_ms"] - spans["start_ms"]
    time_in = spans.assign(
        page_ms=length.where(spans["state"] == "page", 0),
        ticket_ms=length.where(spans["state"] == "ticket", 0),
    )
    ranked = time_in.groupby(keys, as_index=False)[["page_ms", "ticket_ms"]].sum()
    last = spans.loc[spans.groupby(keys)["end_ms"].idxmax(), [*keys, "state"]]
    now = last.assign(now=last["state"].map({"page": 2, "ticket": 1}).fillna(0))
    ranked = ranked.merge(now[[*keys, "now"]], on=keys).sort_values(
        ["now", "page_ms", "ticket_ms", *keys], ascending=[False, False, False, True, True]
    )
    own = ranked.head(most)[keys]
    mine = spans.merge(own, on=keys, how="left", indicator=True)["_merge"].eq("both").to_numpy()
    rest = spans[~mine]
    folded = [_worst_of(slo_id, group) for slo_id, group in rest.groupby("slo_id", sort=True)]
    return pd.concat([spans[mine].assign(folded=0), *folded], ignore_index=True)


def _worst_of(slo_id: str, spans: pd.DataFrame) -> pd.DataFrame:
    """One row of the worst state among ``spans`` (several groups of one SLO) at each time."""
    worst_first = {state: len(ALERT_STATES) - i for i, state in enumerate(ALERT_STATES)}
    bounds = np.unique(np.concatenate([spans["start_ms"], spans["end_ms"]]))
    rank = np.zeros(len(bounds) - 1, dtype=int)
    first = np.searchsorted(bounds, spans["start_ms"].to_numpy())
    last = np.searchsorted(bounds, spans["end_ms"].to_numpy())
    for i, j, state in zip(first, last, spans["state"], strict=True):
        rank[i:j] = np.maximum(rank[i:j], worst_first.get(state, 0))
    names = np.array(["", *reversed(ALERT_STATES)], dtype=object)
    cells = pd.DataFrame({"start_ms": bounds[:-1], "end_ms": bounds[1:], "state": names[rank]})
    run = (cells["state"] != cells["state"].shift()).cumsum()
    rows = cells.groupby(run, sort=False).agg(
        start_ms=("start_ms", "first"), end_ms=("end_ms", "last"), state=("state", "first")
    )
    groups = spans["group_json"].nunique()
    return rows.reset_index(drop=True).assign(
        slo_id=slo_id, group_json=None, burns=[[] for _ in range(len(rows))], folded=groups
    )
