"""URL filters: deep links reproduce a view, bad parameters are reported and ignored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dashboards.filters import RANGES, Filters, bucket_for, parse_filters, to_query
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS
from slo.queries._params import check_grid

END = 1_790_000_000_000


def test_without_a_range_the_view_is_the_last_day_of_the_data_not_of_the_clock() -> None:
    filters, problems = parse_filters({}, data_end_ms=END, now_ms=END + 90 * 86_400_000)
    assert problems == []
    assert filters.end_ms == (END // MINUTE_MS + 1) * MINUTE_MS
    assert filters.end_ms - filters.start_ms == 24 * HOUR_MS


def test_an_alert_deep_link_sets_every_filter() -> None:
    query = {
        "slo": "chat-ttft",
        "pool": "llama",
        "instance": "pod-3",
        "from": "1000",
        "to": "7201000",
    }
    filters, problems = parse_filters(query, data_end_ms=END, now_ms=END)
    assert problems == []
    assert filters == Filters(1000, 7_201_000, None, "llama", "pod-3", "chat-ttft", None, END)
    assert to_query(filters) == query


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ({"from": "yesterday"}, "from='yesterday' is not epoch milliseconds"),
        ({"range": "2y"}, "range='2y' is not one of"),
        ({"from": "5", "to": "5"}, "from must be before to"),
    ],
    ids=["words for a time", "an unknown range", "an empty range"],
)
def test_a_bad_parameter_is_reported_and_the_default_used(
    query: dict[str, str], problem: str
) -> None:
    filters, problems = parse_filters(query, data_end_ms=END, now_ms=END)
    assert any(problem in p for p in problems)
    assert filters.end_ms - filters.start_ms == 24 * HOUR_MS


@given(span_ms=st.integers(min_value=1, max_value=90 * DAY_MS))
def test_buckets_are_whole_seconds_at_most_60_under_a_minute_and_240_up_to_60_days(
    span_ms: int,
) -> None:
    bucket = bucket_for(span_ms)
    assert bucket % SECOND_MS == 0
    assert span_ms / bucket <= (60 if bucket < MINUTE_MS else 240) or span_ms > 60 * DAY_MS
    rollup = bucket_for(span_ms, least_ms=MINUTE_MS)
    assert rollup % MINUTE_MS == 0 and rollup == max(bucket, rollup)


#: (data covers, bucket width): the demo's 2.5 minutes, sub-minute up to 30 minutes.
COVERED = [
    (150 * SECOND_MS, 5 * SECOND_MS),
    (5 * MINUTE_MS, 5 * SECOND_MS),
    (12 * MINUTE_MS, 15 * SECOND_MS),
    (30 * MINUTE_MS, 30 * SECOND_MS),
    (45 * MINUTE_MS, MINUTE_MS),
    (3 * HOUR_MS, MINUTE_MS),
]


@pytest.mark.parametrize(("covered_ms", "bucket_ms"), COVERED, ids=[str(c) for c, _ in COVERED])
def test_under_a_longer_range_the_bucket_follows_the_span_the_data_covers(
    covered_ms: int, bucket_ms: int
) -> None:
    data_start = END - covered_ms + 1  # the last record at END: covers [start, END + 1)
    filters, _ = parse_filters({}, data_end_ms=END, now_ms=END, data_start_ms=data_start)
    assert filters.range_name == "24h" and filters.end_ms - filters.start_ms == DAY_MS
    assert filters.covered == (data_start, END + 1)
    assert filters.bucket_ms == bucket_ms
    assert filters.series_scope() == {
        "start_ms": data_start,
        "end_ms": END + 1,
        "bucket_ms": bucket_ms,
    }
    assert filters.request_scope()["bucket_ms"] == bucket_ms
    # The SLO budget series reads per-minute rollups: never finer than a minute.
    assert filters.rollup_bucket_ms == max(bucket_ms, MINUTE_MS)
    assert filters.series_scope(rollup=True)["bucket_ms"] == max(bucket_ms, MINUTE_MS)


@pytest.mark.parametrize("name", list(RANGES))
def test_data_covering_the_whole_range_keeps_the_ranges_buckets(name: str) -> None:
    filters, _ = parse_filters({"range": name}, data_end_ms=END, now_ms=END, data_start_ms=0)
    span = filters.end_ms - filters.start_ms
    assert filters.bucket_ms == filters.rollup_bucket_ms == bucket_for(span)
    assert filters.bucket_ms >= MINUTE_MS  # an hour and up never reads raw seconds


@pytest.mark.parametrize(
    ("data_start", "data_end"),
    [(None, None), (END + DAY_MS, END + 2 * DAY_MS), (0, 1_000)],
    ids=["unknown extent", "data after the range", "data before the range"],
)
def test_without_data_in_the_range_the_whole_range_is_bucketed(
    data_start: int | None, data_end: int | None
) -> None:
    filters = Filters(END - DAY_MS, END, data_start_ms=data_start, data_end_ms=data_end)
    assert filters.covered == (END - DAY_MS, END)
    assert filters.bucket_ms == 15 * MINUTE_MS


@given(
    start=st.integers(min_value=0, max_value=4_000_000_000_000),
    span=st.integers(min_value=1, max_value=90 * DAY_MS),
    data_from=st.integers(min_value=-100 * DAY_MS, max_value=100 * DAY_MS),
    data_span=st.integers(min_value=0, max_value=100 * DAY_MS),
)
def test_every_series_scope_is_a_grid_the_queries_accept(
    start: int, span: int, data_from: int, data_span: int
) -> None:
    data_start = max(0, start + data_from)
    filters = Filters(
        start, start + span, None, data_start_ms=data_start, data_end_ms=data_start + data_span
    )
    check_grid(**filters.series_scope())
    check_grid(**filters.series_scope(rollup=True), unit_ms=MINUTE_MS)
