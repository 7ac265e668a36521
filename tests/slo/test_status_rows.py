"""``slo_status_current`` holds, row for row, what the row-wise rendering wrote:
``json.dumps(status.as_dict(), sort_keys=True)`` and the group's sorted-key JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.store import Store
from slo.budget import WindowCounts
from slo.evaluate import SloStatus
from slo.sinks import create_output_tables, write_status
from slo.spec import load_spec
from slo.spec.model import SloModel, build_model

ROOT = Path(__file__).resolve().parents[2]
#: Every SLI kind, groupings by pool and instance, pairs with and without the tickets.
MODEL: SloModel = build_model(load_spec(ROOT / "config" / "slo.example.yaml"))
TS_MS = 1_790_000_000_000

#: Few events (empty windows, the min-events guard), many, and counts near 2⁵³ and past it
#: (those fall back to the row-wise rendering).
_count = st.one_of(st.integers(0, 3), st.integers(0, 10**6), st.integers(2**53 - 2, 2**53 + 2))


@st.composite
def statuses(draw: st.DrawFn) -> list[SloStatus]:
    out = []
    for slo in MODEL.slos:
        for g in range(draw(st.integers(0, 3))):
            windows = {}
            for w in slo.catalog.windows_ms:
                total = draw(_count)
                windows[w] = WindowCounts(total, draw(st.integers(0, total)))
            group = {
                d: draw(st.sampled_from(["", "pool-ä", f"10.0.0.{g}:8000"])) for d in slo.group_by
            }
            out.append(SloStatus(slo, group, TS_MS + g, windows))
    return draw(st.permutations(out))  # SLOs interleaved: the rows keep the given order


def _row_wise(found: list[SloStatus]) -> list[tuple[Any, ...]]:
    """The rows as written before: one dict and two json.dumps per status."""
    return [
        (s.slo.id, json.dumps(dict(s.group), sort_keys=True), s.ts_ms,
         json.dumps(s.as_dict(), sort_keys=True))
        for s in found
    ]  # fmt: skip


def _written(con: duckdb.DuckDBPyConnection, found: list[SloStatus]) -> list[tuple[Any, ...]]:
    create_output_tables(con)
    write_status(con, found)
    return con.execute("SELECT * FROM slo_status_current ORDER BY rowid").fetchall()


@settings(max_examples=60, deadline=None)
@given(found=statuses())
def test_the_status_rows_are_the_row_wise_json_of_each_status(
    found: list[SloStatus],
) -> None:
    assert _written(duckdb.connect(), found) == _row_wise(found)


def test_a_burning_slo_alerts_and_a_quiet_one_is_guarded(tmp_path: Path) -> None:
    """Alerting and the min-events guard as :meth:`SloStatus.pairs` judges them."""
    slo = MODEL.slos[0]
    burning = {w: WindowCounts(1_000, 500) for w in slo.catalog.windows_ms}
    quiet = {w: WindowCounts(10, 5) for w in slo.catalog.windows_ms}
    found = [
        SloStatus(slo, {"pool": "a"}, TS_MS, burning),
        SloStatus(slo, {"pool": "b"}, TS_MS, quiet),
    ]
    with Store(tmp_path / "s.duckdb") as store:
        rows = _written(store.con, found)
    assert rows == _row_wise(found)
    pairs = [[(p["alerting"], p["guarded"]) for p in json.loads(r[3])["pairs"]] for r in rows]
    assert all(p == (True, False) for p in pairs[0]) and all(p == (False, True) for p in pairs[1])
