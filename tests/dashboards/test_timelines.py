"""The Fleet strips' frames: alert state per bucket from stored rollups, level spans."""

from __future__ import annotations

import json
import random

import duckdb
import pandas as pd
import pytest

from dashboards.timelines import (
    Pair,
    alert_states,
    group_series,
    level_spans,
    merge_runs,
    status_pairs,
)
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo import queries
from slo.budget import WindowCounts, pair_alerting
from tests.dashboards.conftest import END_MS, History

BUCKET = 5 * MINUTE_MS
START, END = 100 * HOUR_MS, 106 * HOUR_MS
PAGE = Pair("page", 14.4, HOUR_MS, 5 * MINUTE_MS)
TICKET = Pair("ticket", 1.0, 6 * HOUR_MS, 30 * MINUTE_MS)


def _series(bad_from_ms: int, bad_to_ms: int, bad: int) -> pd.DataFrame:
    """1,000 events per bucket from 6 h before START, ``bad`` of them bad in the interval."""
    rows = [
        {"bucket_ts_ms": ts, "total": 1000, "bad": bad if bad_from_ms <= ts < bad_to_ms else 0}
        for ts in range(START - 6 * HOUR_MS, END, BUCKET)
    ]
    return pd.DataFrame(rows)


def _states(series: pd.DataFrame) -> pd.DataFrame:
    return alert_states(
        series, pairs=[PAGE, TICKET], objective=0.99, start_ms=START, end_ms=END, bucket_ms=BUCKET
    )


def test_an_outage_tickets_then_pages_while_both_windows_burn_then_recovers() -> None:
    # 50 % errors from +1 h to +3 h: burn 50 per bad bucket. The 6 h window passes 1 after
    # two bad buckets (2 × 0.69), the 1 h window 14.4 after four (4 × 4.17); when errors
    # stop the 5 m window clears at once, the 30 m window six buckets later.
    out = _states(_series(START + HOUR_MS, START + 3 * HOUR_MS, 500))
    assert len(out) == 6 * 12 and out["start_ms"].iloc[0] == START
    state = dict(zip((out["start_ms"] - START) // MINUTE_MS, out["state"], strict=True))
    assert [state[m] for m in (0, 55, 60, 65, 70, 75, 175)] == [
        "ok", "ok", "ok", "ticket", "ticket", "page", "page",
    ]  # fmt: skip
    assert [state[m] for m in (180, 200, 205, 355)] == ["ticket", "ticket", "ok", "ok"]
    assert out["detail"].iloc[0] == "page ×14.4: 0.0 / 0.0; ticket ×1: 0.0 / 0.0"


def test_no_events_is_its_own_state() -> None:
    out = _states(pd.DataFrame(columns=["bucket_ts_ms", "total", "bad"]))
    assert set(out["state"]) == {"no events"}


def test_the_pairs_are_read_from_the_stored_status() -> None:
    status = {
        "pairs": [
            {"id": "page-1h-5m", "severity": "page", "factor": 14.4},
            {"id": "ticket-3d-6h", "severity": "ticket", "factor": 1.0},
            {"id": "odd", "factor": 2.0},
        ]
    }
    assert status_pairs(json.dumps(status)) == [
        PAGE,
        Pair("ticket", 1.0, 72 * HOUR_MS, 6 * HOUR_MS),
    ]


def test_levels_hold_from_before_the_range_until_each_move() -> None:
    moves = [
        {"ts_ms": START + HOUR_MS, "scope_id": "a", "to_level": 2, "reason": "kv_free_ratio"},
        {"ts_ms": START + 2 * HOUR_MS, "scope_id": "a", "to_level": 1, "reason": "kv_free_ratio"},
    ]
    out = level_spans(moves, before={"a": 1}, instances=["a", "b"], start_ms=START, end_ms=END)
    rows = [
        tuple(r) for r in out[["instance", "level", "start_ms", "end_ms"]].itertuples(index=False)
    ]
    assert rows == [
        ("a", "L1", START, START + HOUR_MS),
        ("a", "L2", START + HOUR_MS, START + 2 * HOUR_MS),
        ("a", "L1", START + 2 * HOUR_MS, END),
        ("b", "L0", START, END),  # never moved: L0 all along
    ]


def test_every_cell_agrees_with_the_jobs_pair_rule() -> None:
    """The strip's arrays against :func:`slo.budget.pair_alerting` bucket by bucket, over
    bursty random traffic with empty stretches."""
    rng = random.Random(7)
    rows = []
    for ts in range(START - 6 * HOUR_MS, END, BUCKET):
        # Nothing until an hour into the range (every window empty), then bursts.
        total = rng.choice([0, 0, 5, 200, 1000]) if ts >= START + HOUR_MS else 0
        rows.append(
            {"bucket_ts_ms": ts, "total": total, "bad": rng.choice([0, total // 40, total // 2])}
        )
    series = pd.DataFrame(rows)
    out = _states(series)
    assert set(out["state"]) == {"page", "ticket", "ok", "no events"}  # every branch is met
    counts = series.set_index("bucket_ts_ms")
    for start_ms, state in zip(out["start_ms"], out["state"], strict=True):

        def window(ms: int, end: int = start_ms + BUCKET) -> WindowCounts:
            inside = counts[(counts.index >= end - ms) & (counts.index < end)]
            return WindowCounts(int(inside["total"].sum()), int(inside["bad"].sum()))

        firing = {
            p.severity
            for p in (PAGE, TICKET)
            if pair_alerting(window(p.short_ms), window(p.long_ms), 0.99, p.factor)
        }
        seen = any(window(p.long_ms).total for p in (PAGE, TICKET))
        expected = (
            ("page" if "page" in firing else "ticket")
            if firing
            else ("ok" if seen else "no events")
        )
        assert state == expected, start_ms


def test_runs_of_one_state_become_one_span_that_ends_with_the_last_bucket() -> None:
    cells = _states(_series(START + HOUR_MS, START + 3 * HOUR_MS, 500))
    spans = merge_runs(cells)
    assert list(spans["state"]) == ["ok", "ticket", "page", "ticket", "ok"]
    assert list((spans["start_ms"] - START) // MINUTE_MS) == [0, 65, 75, 180, 205]
    assert spans["end_ms"].iloc[-1] == END and spans["detail"].iloc[-1] == cells["detail"].iloc[-1]


@pytest.mark.parametrize(
    "bucket_ms", [5 * MINUTE_MS, HOUR_MS], ids=["minute rollups", "hour rollups"]
)
def test_one_read_of_every_group_equals_each_groups_own_budget_series(
    history_db: History, bucket_ms: int
) -> None:
    """The Fleet strip reads every group at once (``slo_series``); each group's share of it
    must be what ``budget_series`` answers for that group alone, bucket by bucket."""
    scope = {"start_ms": END_MS - 2 * DAY_MS, "end_ms": END_MS, "bucket_ms": bucket_ms}
    with duckdb.connect(str(history_db.path), read_only=True) as con:
        every = queries.slo_series(
            con, start_ms=scope["start_ms"], end_ms=scope["end_ms"], bucket_ms=bucket_ms
        ).to_pandas()
        status = queries.slo_status(con).to_pylist()
        assert len(status) == 1 + len(history_db.instances)  # availability + ttft per pod
        for row in status:
            group = json.loads(row["group_json"])
            alone = queries.budget_series(
                con, slo_id=row["slo_id"], objective=row["objective"], group=group or None,
                **scope,
            ).to_pandas()[["bucket_ts_ms", "total", "bad"]]  # fmt: skip
            shared = group_series(every, row["slo_id"], group)
            assert len(alone) > 10, row["slo_id"]
            pd.testing.assert_frame_equal(shared, alone, check_dtype=False)
        one = queries.slo_series(con, **scope, slo_id="chat-ttft").to_pandas()
    assert (
        set(one["slo_id"]) == {"chat-ttft"} and len(one) == (every["slo_id"] == "chat-ttft").sum()
    )
