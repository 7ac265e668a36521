"""``slo_status_current`` rows of one cycle's statuses, rendered per SLO over arrays.

Private to ``slo`` (:func:`slo.sinks.write_status` writes them). Each row's ``status_json``
is the text ``json.dumps(status.as_dict(), sort_keys=True)`` gives
(:meth:`slo.evaluate.SloStatus.as_dict`): the same numbers from the same IEEE operations
(:mod:`slo.budget`: a ratio of two integers below 2⁵³, then one division), floats written
as Python writes them (``repr``), keys in sorted order. It is built once per SLO from
columns joined element-wise by Arrow, not once per status: rendering each status's dict
cost ~60 µs (a quarter of a second at 4,096 instances). An SLO whose statuses hold a
count of 2⁵³ or more, or a non-finite figure, is rendered status by status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import chain
from operator import attrgetter
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slo.evaluate import SloStatus
from slo.spec.model import Slo
from slo.windows import format_duration

__all__ = ["status_table"]

#: Counts up to this convert to float exactly, so a ratio of two is rounded once, as in Python.
_EXACT_INT = 2**53

Column: TypeAlias = "str | pa.Array"  # a constant, or one value per status


def status_table(statuses: Sequence[SloStatus]) -> pa.Table:
    """The ``slo_status_current`` rows of ``statuses``, in their order."""
    by_slo: dict[str, list[int]] = {}
    for i, status in enumerate(statuses):
        by_slo.setdefault(status.slo.id, []).append(i)
    groups: dict[tuple[tuple[str, str], ...], str] = {}
    parts = []
    for positions in by_slo.values():
        members = [statuses[i] for i in positions]
        group_json = [_group_json(s.group, groups) for s in members]
        parts.append(
            pa.table(
                {
                    "slo_id": pa.array([members[0].slo.id] * len(members), pa.string()),
                    "group_json": pa.array(group_json, pa.string()),
                    "ts_ms": pa.array([s.ts_ms for s in members], pa.int64()),
                    "status_json": _status_json(members[0].slo, members, group_json),
                }
            )
        )
    if not parts:
        names = ("slo_id", "group_json", "ts_ms", "status_json")
        types = (pa.string(), pa.string(), pa.int64(), pa.string())
        return pa.schema(list(zip(names, types, strict=True))).empty_table()
    order = np.concatenate([np.asarray(p, dtype=np.int64) for p in by_slo.values()])
    return pa.concat_tables(parts).take(pa.array(np.argsort(order, kind="stable")))


def _group_json(group: Mapping[str, str], seen: dict[tuple[tuple[str, str], ...], str]) -> str:
    key = tuple(group.items())
    text = seen.get(key)
    if text is None:
        text = seen[key] = json.dumps(dict(group), sort_keys=True)
    return text


def _status_json(slo: Slo, statuses: list[SloStatus], group_json: list[str]) -> pa.Array:
    windows = sorted(slo.catalog.windows_ms)
    counts = _counts(slo, statuses, windows)
    if counts is None:
        return pa.array([json.dumps(s.as_dict(), sort_keys=True) for s in statuses], pa.string())
    total, bad = counts[..., 0], counts[..., 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = bad / total  # inf/nan where total is 0: never read there
    burn = np.where(total > 0, ratio / (1.0 - slo.objective), 0.0)
    period = windows.index(slo.period_ms)
    sli = np.where(total[:, period] > 0, 1.0 - ratio[:, period], np.nan)
    figures = [burn, sli[total[:, period] > 0], 1.0 - burn[:, period]]
    if not all(np.isfinite(f).all() for f in figures):
        return pa.array([json.dumps(s.as_dict(), sort_keys=True) for s in statuses], pa.string())
    burn_text = {w: _floats(burn[:, i]) for i, w in enumerate(windows)}
    rates: list[Column] = []
    for w in sorted(windows, key=format_duration):  # json sorts the keys as text
        rates += [f"{', ' if rates else ''}{json.dumps(format_duration(w))}: ", burn_text[w]]
    pieces: list[Column] = [
        '{"bad": ', _ints(bad[:, period]),
        ', "budget_remaining": ', _floats(1.0 - burn[:, period]),
        ', "burn_rates": {', *rates,
        '}, "events": ', _ints(total[:, period]),
        ', "group": ', pa.array(group_json, pa.string()),
        f', "name": {json.dumps(slo.name)}, "objective": {json.dumps(slo.objective)}, "pairs": [',
        *_pairs(slo, windows, total, burn, burn_text),
        '], "sli": ', _optional_floats(sli, total[:, period] > 0),
        f', "slo": {json.dumps(slo.id)}, "ts_ms": ', _ints(np.array([s.ts_ms for s in statuses])),
        "}",
    ]  # fmt: skip
    return pc.binary_join_element_wise(*pieces, "")


def _pairs(
    slo: Slo,
    windows: list[int],
    total: np.ndarray,
    burn: np.ndarray,
    burn_text: dict[int, pa.Array],
) -> list[Column]:
    """The ``pairs`` list's elements, as :meth:`SloStatus.pairs` judges them."""
    pieces: list[Column] = []
    for n, pair in enumerate(slo.pairs):
        short, long = windows.index(pair.short_ms), windows.index(pair.long_ms)
        over = (burn[:, short] > pair.factor) & (burn[:, long] > pair.factor)
        alerting = over & (total[:, long] >= slo.min_events)
        pieces += [
            f'{", " if n else ""}{{"alerting": ', _bools(alerting),
            f', "factor": {json.dumps(pair.factor)}, "guarded": ', _bools(over & ~alerting),
            f', "id": {json.dumps(pair.id)}, "long_burn": ', burn_text[pair.long_ms],
            ', "long_events": ', _ints(total[:, long]),
            f', "severity": {json.dumps(pair.severity)}, "short_burn": ', burn_text[pair.short_ms],
            "}",
        ]  # fmt: skip
    return pieces


def _counts(slo: Slo, statuses: list[SloStatus], windows: list[int]) -> np.ndarray | None:
    """(status, window, total|bad) counts, or ``None`` when the statuses are not all of
    ``slo`` with its windows, or a count's magnitude reaches 2⁵³ (a float division of two is
    then not Python's)."""
    keys = set(windows)
    if any(s.slo is not slo or list(s.windows) != windows for s in statuses):
        if any(s.slo is not slo or s.windows.keys() != keys for s in statuses):
            return None
        statuses = [replace(s, windows={w: s.windows[w] for w in windows}) for s in statuses]
    # Flat iterators of ints, no container per status: a list per status made the
    # collector scan the heap over and over (~50 µs a status).
    try:
        counts = np.stack(
            [
                np.fromiter(
                    chain.from_iterable(map(get, s.windows.values()) for s in statuses),
                    np.int64,
                    len(statuses) * len(windows),
                )
                for get in (attrgetter("total"), attrgetter("bad"))
            ],
            axis=-1,
        ).reshape(len(statuses), len(windows), 2)
    except (OverflowError, TypeError, ValueError):
        return None
    return counts if (np.abs(counts) < _EXACT_INT).all() else None


def _floats(values: np.ndarray) -> pa.Array:
    return pa.array(list(map(float.__repr__, values.tolist())), pa.string())


def _optional_floats(values: np.ndarray, present: np.ndarray) -> pa.Array:
    return pa.array(
        [repr(v) if p else "null" for v, p in zip(values.tolist(), present.tolist(), strict=True)],
        pa.string(),
    )


def _ints(values: np.ndarray) -> pa.Array:
    return pa.array(values.astype(np.int64)).cast(pa.string())


def _bools(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.bool_()).cast(pa.string())
