"""The router's timing of a response against a request's own targets: which chunks are
tokens, pieces split anywhere, and header values that are no target."""

from __future__ import annotations

import pytest

from simulator.openai import DONE, StreamRenderer
from simulator.own_targets import OwnTargets, ResponseTimer, read_targets


def _stream(tokens: int) -> bytes:
    render = StreamRenderer("r1", "m", 0, chat=True)
    chunks = [render.role_chunk()]
    chunks += [render.token_chunk(i, "length" if i == tokens - 1 else None) for i in range(tokens)]
    return b"".join([*chunks, render.usage_chunk(5, tokens), DONE])


@pytest.mark.parametrize("piece", [1, 7, 10_000], ids=["byte by byte", "7 bytes", "whole"])
def test_only_token_chunks_count_wherever_the_pieces_split(piece: int) -> None:
    body = _stream(3)
    timer = ResponseTimer(OwnTargets(ttft_s=0.5, tpot_s=0.1), received_s=0.0)
    for i, start in enumerate(range(0, len(body), piece)):
        timer.feed(body[start : start + piece], now_s=1.0 + i)
    # a token has arrived when its chunk has: the piece holding its closing blank line
    first_token_at = (body.index(b"\n\n", body.index(b'"content": " the"')) + 1) // piece
    assert timer.tokens == 3 and timer.first_token_s == 1.0 + first_token_at
    assert timer.missed() == []  # not ended: no verdict
    timer.finish(timer.first_token_s + 0.1, streamed=True)
    assert timer.missed() == ["ttft"]  # TTFT ≥ 1 s against 0.5; TPOT 0.05 against 0.1


def test_a_response_that_is_not_a_stream_counts_its_whole_latency_as_ttft() -> None:
    timer = ResponseTimer(OwnTargets(ttft_s=0.5, tpot_s=0.001), received_s=2.0)
    timer.finish(2.4, streamed=False)
    assert timer.missed() == []  # 0.4 s; no TPOT without tokens counted
    timer.finish(2.6, streamed=False)
    assert timer.missed() == ["ttft"]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-llm-d-slo-ttft-ms": "250", "x-llm-d-slo-tpot-ms": "12.5"}, OwnTargets(0.25, 0.0125)),
        ({"x-llm-d-slo-tpot-ms": "40"}, OwnTargets(None, 0.04)),
        ({"x-llm-d-slo-ttft-ms": "0"}, None),
        ({"x-llm-d-slo-ttft-ms": "-5"}, None),
        ({"x-llm-d-slo-ttft-ms": "nan"}, None),
        ({"x-llm-d-slo-ttft-ms": "fast"}, None),
        ({"x-llm-d-slo-ttft-ms": "700000"}, None),
        ({}, None),
    ],
    ids=["both", "tpot alone", "zero", "negative", "nan", "a word", "over 10 minutes", "none"],
)
def test_only_positive_numbers_up_to_ten_minutes_are_targets(
    headers: dict[str, str], expected: OwnTargets | None
) -> None:
    assert read_targets(headers) == expected
