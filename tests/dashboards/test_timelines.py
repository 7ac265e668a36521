"""The Fleet strips' frames: level spans, every group's events in one read, and the
reference fold of the alert strip's groups past its row limit."""

from __future__ import annotations

import json

import duckdb
import pandas as pd
import pytest

from dashboards.timelines import level_spans
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo import queries
from tests.dashboards.conftest import END_MS, History
from tests.slo.queries.alert_reference import fold_groups, group_series

START, END = 100 * HOUR_MS, 106 * HOUR_MS


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


def _spans(group: str, *runs: tuple[str, int, int]) -> list[dict[str, object]]:
    return [
        {
            "slo_id": "a", "group_json": group, "start_ms": START + h0 * HOUR_MS,
            "end_ms": START + h1 * HOUR_MS, "state": state, "burns": [{"pair": "p"}],
        }
        for state, h0, h1 in runs
    ]  # fmt: skip


FOUR_GROUPS = pd.DataFrame(
    _spans("a1", ("page", 0, 2), ("ok", 2, 6))
    + _spans("a2", ("ticket", 0, 3), ("ok", 3, 6))
    + _spans("a3", ("ok", 0, 1), ("page", 1, 2), ("ok", 2, 6))
    + _spans("a4", ("no events", 0, 6))
)


def test_past_the_row_limit_the_groups_alerting_least_share_a_row_of_their_worst() -> None:
    rows = fold_groups(FOUR_GROUPS, most=1)
    own, folded = rows[rows["folded"] == 0], rows[rows["folded"] > 0]
    assert set(own["group_json"]) == {"a1"}  # two hours of page beat one
    mine = FOUR_GROUPS[FOUR_GROUPS["group_json"] == "a1"]
    assert own.drop(columns="folded").to_dict("records") == mine.to_dict("records")
    worst = [
        (state, (start - START) // HOUR_MS, (end - START) // HOUR_MS)
        for state, start, end in zip(
            folded["state"], folded["start_ms"], folded["end_ms"], strict=True
        )
    ]
    assert worst == [("ticket", 0, 1), ("page", 1, 2), ("ticket", 2, 3), ("ok", 3, 6)]
    assert set(folded["folded"]) == {3} and folded["group_json"].isna().all()


def test_within_the_row_limit_every_group_keeps_its_row() -> None:
    rows = fold_groups(FOUR_GROUPS, most=4)
    assert rows.drop(columns="folded").equals(FOUR_GROUPS) and set(rows["folded"]) == {0}
