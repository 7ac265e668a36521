"""Records of bounded size: exact ITL summaries and a fixed-size
log-bucket histogram instead of every gap; raw gaps only up to ``record_max_gaps``."""

from __future__ import annotations

import asyncio
import json
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.tap.measure import ITL_HISTOGRAM_BOUNDS_S, ItlSummary, StreamMeter
from collectors.tap.sinks import rows_to_table
from pipeline.codec import encode_arrow
from pipeline.schema import REQUEST_RECORDS
from tests.collectors.tap.fakes import CHAT, Script, ScriptedUpstream, chat_events, post, tap_over


def token(i: int) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}).encode()


def test_itl_summaries_are_exact_nearest_rank_statistics() -> None:
    gaps_ms = [float(g) for g in range(1, 101)]  # 1 … 100 ms, shuffled below
    order = [(i * 37) % 100 for i in range(100)]
    meter, t = StreamMeter(0.0), 1.0
    meter.on_data(token(0), t)
    for i in order:
        t += gaps_ms[i] / 1000
        meter.on_data(token(i), t)
    summary = meter.finish(t).itl_summary()
    assert summary.count == 100
    assert summary.mean_s == pytest.approx(0.0505)
    assert (summary.p50_s, summary.p90_s, summary.p99_s, summary.max_s) == pytest.approx(
        (0.050, 0.090, 0.099, 0.100)
    )
    assert summary.jitter_s == pytest.approx(0.099 - 0.050)
    assert (
        sum(summary.histogram) == 100 and len(summary.histogram) == len(ITL_HISTOGRAM_BOUNDS_S) + 1
    )


def test_histogram_buckets_hold_gaps_up_to_their_bound() -> None:
    meter, t = StreamMeter(0.0), 0.0
    meter.on_data(token(0), t)
    for gap in (ITL_HISTOGRAM_BOUNDS_S[0], ITL_HISTOGRAM_BOUNDS_S[5] * 1.01, 1000.0):
        t += gap
        meter.on_data(token(1), t)
    histogram = meter.finish(t).itl_summary().histogram
    assert histogram[0] == 1 and histogram[6] == 1 and histogram[-1] == 1


def test_jitter_needs_ten_token_chunks() -> None:
    meter = StreamMeter(0.0)
    for i in range(9):
        meter.on_data(token(i), 1.0 + i * 0.01)
    summary = meter.finish(2.0).itl_summary()
    assert summary.count == 8 and summary.p99_s is not None and summary.jitter_s is None


def stream_record(tokens: int, **overrides: object) -> dict:
    async def scenario() -> dict:
        events = chat_events(tokens)
        up = ScriptedUpstream(lambda req: Script([(0.0, b"".join(events))]))
        # the whole stream is one burst: kernel receive stamps would (rightly) vouch for
        # no gap between events of one read; this is about the record's size
        overrides.setdefault("kernel_timestamps", False)
        # ... and every gap vouched for: on a loaded host the loop-watch bound leaves out
        # gaps read late (by design, collectors/tap/README.md), which is not this test's
        overrides.setdefault("gap_error_max_s", 3600.0)
        async with tap_over([up], **overrides) as (url, sink, _):
            status, _, problem = await post(url, CHAT, timeout_s=60)
        assert (status, problem) == (200, None)
        [row] = sink.requests
        return row

    return asyncio.run(scenario())


def test_a_25000_token_stream_gives_a_record_of_bounded_size() -> None:
    row = stream_record(25_000)
    json_bytes = len(json.dumps(row).encode())
    arrow_bytes = len(encode_arrow(REQUEST_RECORDS, rows_to_table(REQUEST_RECORDS, [row])))
    assert json_bytes < 8_000, f"JSON record {json_bytes} bytes"
    # A one-row Arrow message is mostly its schema (~60 documented columns, ~14 KB); what
    # matters is that it no longer grows with the stream (it was 110 KB at 25,000 tokens).
    assert arrow_bytes < 20_000, f"Arrow record {arrow_bytes} bytes"
    assert (row["completion_tokens"], row["token_chunks"], row["itl_count"]) == (
        25_000,
        25_000,
        24_999,
    )
    assert len(row["itl_gaps_s"]) == 256 and len(row["chunk_tokens"]) == 257
    assert sum(row["itl_histogram"]) == 24_999
    assert row["itl_p99_s"] <= row["itl_max_s"] and row["itl_jitter_s"] is not None


def test_record_max_gaps_is_configurable_and_short_streams_keep_every_gap() -> None:
    assert len(stream_record(50)["itl_gaps_s"]) == 49
    row = stream_record(50, record_max_gaps=0)
    assert (row["itl_gaps_s"], row["chunk_tokens"], row["itl_count"]) == ([], [], 49)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=100.0), max_size=300))
def test_summary_agrees_with_the_gaps_it_summarises(gaps: list[float]) -> None:
    summary = ItlSummary.of(gaps)
    assert summary.count == len(gaps) == sum(summary.histogram)
    if not gaps:
        assert summary.mean_s is None and summary.jitter_s is None
        return
    assert summary.p50_s is not None and summary.p90_s is not None
    assert summary.p99_s is not None and summary.max_s is not None
    assert min(gaps) <= summary.p50_s <= summary.p90_s <= summary.p99_s <= summary.max_s
    assert {summary.p50_s, summary.p90_s, summary.p99_s} <= set(gaps)  # nearest rank
    assert summary.mean_s == pytest.approx(sum(gaps) / len(gaps))
    assert (summary.jitter_s is None) == (len(gaps) + 1 < 10)
    for gap in gaps:  # each gap lies in a bucket whose bounds hold it
        k = bisect_left(ITL_HISTOGRAM_BOUNDS_S, gap)
        assert summary.histogram[k] > 0
        assert k == len(ITL_HISTOGRAM_BOUNDS_S) or gap <= ITL_HISTOGRAM_BOUNDS_S[k]
        assert k == 0 or gap > ITL_HISTOGRAM_BOUNDS_S[k - 1]


def test_the_tap_itl_histogram_still_sees_every_gap_when_records_keep_none() -> None:
    async def scenario() -> tuple[dict, bytes]:
        up = ScriptedUpstream(lambda req: Script([(0.0, b"".join(chat_events(300)))]))
        async with tap_over([up], record_max_gaps=0) as (url, sink, proxy):
            await post(url, CHAT, timeout_s=60)
            return sink.requests[0], generate_latest(proxy.metrics.registry)

    row, text = asyncio.run(scenario())
    count = sum(
        s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
        if s.name == "llmslo_tap_itl_seconds_count"
    )
    assert row["itl_gaps_s"] == [] and row["itl_count"] == 299 and count == 299
