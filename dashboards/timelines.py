"""The Fleet page's strips as frames: the tooltips of the SLO groups' alert spans (the
spans themselves, folded past :data:`STRIP_ROWS` groups, come from
:func:`slo.queries.slo_alert_spans`), and the degradation level of every instance over time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

__all__ = ["LEVEL_NAMES", "STRIP_ROWS", "alert_detail", "level_spans"]

LEVEL_NAMES = ("L0", "L1", "L2", "L3")
#: Most SLO groups an alert strip gives a row of their own (those alerting at the range's
#: end first): a browser draws a fleet's 256 groups × a month of spans (thousands of
#: rectangles, a megabyte) in seconds, and each row costs it about 30 rectangles.
STRIP_ROWS = 12


def alert_detail(burns: Sequence[Mapping[str, object]]) -> str:
    """A span's tooltip text from its ``burns`` (:func:`slo.queries.slo_alert_spans`, worst
    pair first): ``page ×14.4: 20.3 / 31.0; ticket ×1: …``, each pair's long and short burn
    rate (× budget) at the span's last bucket."""
    return "; ".join(
        f"{b['severity']} ×{b['factor']:g}: {b['long_burn']:,.1f} / {b['short_burn']:,.1f}"
        for b in burns
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
