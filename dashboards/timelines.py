"""The Fleet page's strips as frames: the rows and tooltips of the SLO groups' alert spans
(the spans themselves come from :func:`slo.queries.slo_alert_spans`), and the degradation
level of every instance over time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from slo.queries.alert_spans import ALERT_STATES

__all__ = ["LEVEL_NAMES", "STRIP_ROWS", "alert_detail", "fold_groups", "level_spans"]

LEVEL_NAMES = ("L0", "L1", "L2", "L3")
#: Most SLO groups an alert strip gives a row of their own: a browser draws a fleet's
#: 256 groups × a month of spans (thousands of rectangles, a megabyte) in seconds.
STRIP_ROWS = 40


def alert_detail(burns: Sequence[Mapping[str, object]]) -> str:
    """A span's tooltip text from its ``burns`` (:func:`slo.queries.slo_alert_spans`, worst
    pair first): ``page ×14.4: 20.3 / 31.0; ticket ×1: …``, each pair's long and short burn
    rate (× budget) at the span's last bucket."""
    return "; ".join(
        f"{b['severity']} ×{b['factor']:g}: {b['long_burn']:,.1f} / {b['short_burn']:,.1f}"
        for b in burns
    )


def fold_groups(spans: pd.DataFrame, *, most: int = STRIP_ROWS) -> pd.DataFrame:
    """The rows an alert strip draws from ``spans`` (:func:`slo.queries.slo_alert_spans`
    columns): every group its own row when there are at most ``most``; else the ``most``
    groups longest in ``page``, then in ``ticket`` (ties by SLO and group), and the other
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
    ranked = ranked.sort_values(
        ["page_ms", "ticket_ms", *keys], ascending=[False, False, True, True]
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
