"""StreamMeter: the DESIGN §3 definitions, driven with plain timestamps."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.tap.measure import StreamMeter, measure_json_response
from collectors.tap.sse import SseFramer
from tests.collectors.tap.fakes import chat_events


def chunk(
    delta: dict | None = None,
    *,
    text: str | None = None,
    finish: str | None = None,
    usage: dict | None = None,
    logprobs: list | None = None,
) -> bytes:
    choice: dict = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    if text is not None:
        choice["text"] = text
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    obj: dict = {"id": "x", "model": "m", "choices": [choice]}
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj).encode()


def usage_chunk(completion: int, prompt: int = 3) -> bytes:
    return json.dumps(
        {
            "id": "x",
            "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
        }
    ).encode()


def test_role_only_first_chunk_is_ttfb_not_ttft() -> None:
    meter = StreamMeter(t0_s=10.0)
    meter.on_data(chunk({"role": "assistant", "content": ""}), 10.1)
    meter.on_data(chunk({"content": "Hi"}), 10.5)
    m = meter.finish(11.0)
    assert m.ttfb_s == pytest.approx(0.1)
    assert m.ttft_s == pytest.approx(0.5)
    assert m.e2e_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    "delta",
    [
        {"reasoning_content": "thinking"},
        {"reasoning": "thinking"},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
    ],
    ids=[
        "reasoning_content counts as a token",
        "reasoning counts as a token",
        "a tool-call delta counts",
    ],
)
def test_reasoning_and_tool_call_deltas_are_tokens(delta: dict) -> None:
    meter = StreamMeter(0.0)
    meter.on_data(chunk({"content": ""}), 0.2)
    meter.on_data(chunk(delta), 0.3)
    assert meter.finish(None).ttft_s == pytest.approx(0.3)


def test_completions_text_is_a_token() -> None:
    meter = StreamMeter(0.0)
    meter.on_data(chunk(text=""), 0.1)
    meter.on_data(chunk(text="a"), 0.4)
    assert meter.finish(None).ttft_s == pytest.approx(0.4)


def test_tpot_uses_usage_completion_tokens_not_chunk_count() -> None:
    meter = StreamMeter(0.0)
    for i, t in enumerate([1.0, 1.1, 1.3]):
        meter.on_data(chunk({"content": "x"}, finish="stop" if i == 2 else None), t)
    meter.on_data(usage_chunk(5), 1.35)
    m = meter.finish(1.4)
    assert m.tpot_s == pytest.approx((1.3 - 1.0) / (5 - 1))
    assert m.itl_gaps_s == pytest.approx([0.1, 0.2])
    assert m.chunk_tokens == [1, 1, 1]
    assert (m.completion_tokens, m.prompt_tokens, m.finish_reason) == (5, 3, "stop")
    mean, p99, largest = m.itl_stats()
    assert (
        mean == pytest.approx(0.15) and p99 == pytest.approx(0.2) and largest == pytest.approx(0.2)
    )


@pytest.mark.parametrize("n", [0, 1], ids=["no tokens", "one token"])
def test_tpot_is_undefined_for_n_at_most_one(n: int) -> None:
    meter = StreamMeter(0.0)
    meter.on_data(chunk({"content": "x"}), 1.0)
    meter.on_data(usage_chunk(n), 1.1)
    assert meter.finish(1.2).tpot_s is None


def test_without_usage_n_is_counted_from_the_token_chunks() -> None:
    # DESIGN §3: an engine that ignores include_usage still sent every token
    # chunk; N comes from them (one per chunk unless logprobs say more), and says so.
    meter = StreamMeter(0.0)
    meter.on_data(chunk({"content": "x"}), 1.0)
    meter.on_data(chunk({"content": "y"}), 2.0)
    meter.on_data(chunk({"content": "zw"}, logprobs=[{}, {}]), 2.5)
    m = meter.finish(2.6)
    assert (m.completion_tokens, m.tokens_source) == (4, "chunks")
    assert m.tpot_s == pytest.approx((2.5 - 1.0) / (4 - 1))


def test_tokens_source_is_usage_when_the_engine_sends_it() -> None:
    meter = StreamMeter(0.0)
    meter.on_data(chunk({"content": "x"}), 1.0)
    meter.on_data(usage_chunk(1), 1.1)
    assert meter.finish(1.2).tokens_source == "usage"


def test_no_tokens_and_no_usage_has_no_source() -> None:
    meter = StreamMeter(0.0)
    meter.on_data(chunk({"role": "assistant", "content": ""}), 1.0)
    m = meter.finish(1.1)
    assert (m.tokens_source, m.completion_tokens, m.tpot_s) == (None, None, None)


def test_tokens_per_chunk_from_logprobs_and_continuous_usage() -> None:
    meter = StreamMeter(0.0)
    meter.on_data(chunk({"content": "ab"}, logprobs=[{}, {}, {}]), 1.0)
    meter.on_data(chunk({"content": "c"}, usage={"prompt_tokens": 2, "completion_tokens": 5}), 1.1)
    meter.on_data(chunk({"content": "d"}, usage={"prompt_tokens": 2, "completion_tokens": 7}), 1.2)
    assert meter.finish(None).chunk_tokens == [3, 2, 2]


def test_non_json_and_error_events_are_counted_not_raised() -> None:
    meter = StreamMeter(0.0)
    assert not meter.on_data(b"{not json", 0.1).is_json
    assert not meter.on_data(b"[1, 2]", 0.2).is_json
    assert meter.on_data(b'{"error": {"message": "boom"}}', 0.3).error
    m = meter.finish(None)
    assert m.not_json_events == 2 and m.error_event and m.ttft_s is None
    assert m.ttfb_s == pytest.approx(0.1)


@settings(max_examples=200, deadline=None)
@given(
    obj=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "choices",
                        "delta",
                        "content",
                        "usage",
                        "completion_tokens",
                        "text",
                        "finish_reason",
                        "logprobs",
                        "tool_calls",
                        "model",
                        "error",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_any_json_shape_is_survived(obj: object) -> None:
    meter = StreamMeter(0.0)
    meter.on_data(json.dumps(obj).encode(), 0.5)
    meter.finish(1.0)


def test_non_streamed_json_response_gives_usage_and_finish_reason() -> None:
    body = json.dumps(
        {
            "model": "m",
            "choices": [{"message": {"content": "secret"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 9},
        }
    ).encode()
    m = measure_json_response(body, 0.0)
    assert (m.prompt_tokens, m.completion_tokens, m.finish_reason) == (4, 9, "length")
    assert measure_json_response(b"<html>", 0.0).completion_tokens is None


def measure_pieces(pieces: list[tuple[bytes, float]]) -> tuple:
    framer, meter = SseFramer(), StreamMeter(0.0)
    for data, t in pieces:
        for event in framer.feed(data):
            if event.data is not None:
                meter.on_data(event.data, t)
    m = meter.finish(10.0)
    return (
        m.ttfb_s,
        m.ttft_s,
        m.tpot_s,
        m.itl_gaps_s,
        m.chunk_tokens,
        m.completion_tokens,
        m.finish_reason,
    )


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.integers(min_value=0, max_value=12),
    gaps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=20, max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30),
)
def test_any_rechunking_gives_identical_measurements(
    tokens: int, gaps: list[float], cuts: list[int]
) -> None:
    """Each event is written at its own time; the transport splits writes anywhere and may
    merge writes made at the same instant, but cannot deliver a byte before it was written."""
    events = chat_events(tokens)
    times: list[float] = []
    boundaries: set[int] = set()
    t = 0.0
    for i, event in enumerate(events):
        step = gaps[i % len(gaps)]
        if step:
            boundaries.add(len(times))  # a later write: never merged with the one before
        t += step
        times += [t] * len(event)
    stream = b"".join(events)
    reference = measure_pieces(
        [(e, times[sum(map(len, events[: i + 1])) - 1]) for i, e in enumerate(events)]
    )
    points = sorted({c % (len(stream) + 1) for c in cuts} | boundaries | {0, len(stream)})
    pieces = [(stream[a:b], times[b - 1]) for a, b in itertools.pairwise(points)]
    assert measure_pieces(pieces) == reference
