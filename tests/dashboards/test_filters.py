"""URL filters: deep links reproduce a view, bad parameters are reported and ignored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dashboards.filters import Filters, bucket_for, bucket_label, parse_filters, to_query
from pipeline.units import HOUR_MS, MINUTE_MS

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
    assert filters == Filters(1000, 7_201_000, None, "llama", "pod-3", "chat-ttft")
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


@given(span_ms=st.integers(min_value=1, max_value=90 * 86_400_000))
def test_buckets_are_at_most_240_per_range_and_whole_minutes_above_half_an_hour(
    span_ms: int,
) -> None:
    bucket = bucket_for(span_ms)
    assert bucket % MINUTE_MS == 0 or (span_ms <= 30 * MINUTE_MS and MINUTE_MS % bucket == 0)
    assert bucket >= 5_000
    assert span_ms / bucket <= 240 or span_ms > 60 * 86_400_000


def test_a_two_minute_demo_in_a_day_view_gets_five_second_buckets() -> None:
    """The sidebar's 24 h over 2.5 minutes of data: buckets follow the data, not the range."""
    data_start, data_end = END - 150_000, END
    filters, _ = parse_filters({}, data_end_ms=data_end, now_ms=END, data_start_ms=data_start)
    assert filters.end_ms - filters.start_ms == 24 * HOUR_MS
    assert filters.bucket_ms == 5_000 and bucket_label(filters.bucket_ms) == "5 s"
    assert filters.minute_bucket_ms == MINUTE_MS  # the SLO rollups' grain
    # Data covering the whole range keeps the range's buckets; data outside it too.
    history, _ = parse_filters({}, data_end_ms=data_end, now_ms=END, data_start_ms=0)
    assert history.bucket_ms == 15 * MINUTE_MS and bucket_label(history.bucket_ms) == "15 min"
    elsewhere, _ = parse_filters(
        {"from": "0", "to": str(7 * 86_400_000)}, data_end_ms=data_end, now_ms=END,
        data_start_ms=data_start,
    )  # fmt: skip
    assert elsewhere.bucket_ms == bucket_for(7 * 86_400_000)
