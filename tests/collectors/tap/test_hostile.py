"""Hostile engines and clients: the tap neither crashes nor hangs, and reports each case."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.collectors.tap.fakes import (
    CHAT,
    Script,
    ScriptedUpstream,
    chat_events,
    post,
    stream_script,
    tap_over,
    wait_for,
)


def run(coro):
    return asyncio.run(coro)


def dropped(proxy, reason: str) -> float:
    return (
        proxy.metrics.registry.get_sample_value("llmslo_dropped_total", {"reason": reason}) or 0.0
    )


def test_malformed_sse_and_non_json_lines_pass_through_and_are_counted() -> None:
    junk = [
        b"data {no colon}\n\n",
        b"data: {not json}\n\n",
        b"\x00\xff\xfe garbage\n\n",
        b"event: weird\nid: 7\nretry: x\n\n",
        b"data: [1,2,3]\n\n",
        b": comment\n\n",
    ]
    events = chat_events(3)
    pieces = [(0.0, events[0]), *[(0.0, j) for j in junk], *[(0.0, e) for e in events[1:]]]

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: Script(pieces))
        async with tap_over([up]) as (url, sink, proxy):
            status, via_tap, error = await post(url, CHAT)
            _, direct, _ = await post(up.url, CHAT)
            assert dropped(proxy, "not_json") == 2
        assert (status, error) == (200, None) and via_tap == direct
        [row] = sink.requests
        assert row["outcome"] == "ok" and row["token_chunks"] == 3 and row["completion_tokens"] == 3

    run(scenario())


def test_a_10_mb_event_is_forwarded_in_pieces_and_counted() -> None:
    big = (
        b'data: {"choices":[{"index":0,"delta":{"content":"'
        + b"x" * (10 * 1024 * 1024)
        + b'"}}]}\n\n'
    )
    events = chat_events(2)

    async def scenario() -> None:
        up = ScriptedUpstream(
            lambda req: Script([(0.0, events[0]), (0.0, big), *[(0.0, e) for e in events[1:]]])
        )
        async with tap_over([up]) as (url, sink, proxy):
            status, via_tap, error = await post(url, CHAT, timeout_s=60)
            assert dropped(proxy, "oversized_event") == 1
        assert (status, error) == (200, None)
        assert via_tap == events[0] + big + b"".join(e for e in events[1:] if b'"usage"' not in e)
        [row] = sink.requests
        assert (
            row["outcome"] == "ok" and row["token_chunks"] == 2
        )  # the oversized one is not parsed

    run(scenario())


def test_non_sse_answer_to_a_stream_request_is_reported() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(
            lambda req: Script([(0.0, b"<html>oops</html>")], headers={"Content-Type": "text/html"})
        )
        async with tap_over([up], max_attempts=1) as (url, sink, _):
            status, body, error = await post(url, CHAT)
        # a non-SSE answer to a streamed request must not reach the client as a chunked body never terminated
        assert status == 200 and body == b"<html>oops</html>" and error is None
        [row] = sink.requests
        assert (row["outcome"], row["error_kind"]) == (
            "error_before_first_token",
            "not_event_stream",
        )

    run(scenario())


def test_reset_before_any_byte_with_one_upstream_is_a_502() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: Script([], end="reset"))
        async with tap_over([up], max_attempts=1) as (url, sink, _):
            status, _, _ = await post(url, CHAT)
        assert status == 502
        assert sink.requests[0]["outcome"] == "error_before_first_token"

    run(scenario())


def test_a_client_that_never_reads_is_dropped_and_pushes_back_on_the_engine() -> None:
    token = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"y" * 32_000 + b'"}}]}\n\n'
    total = 2000 * len(token)  # ~64 MB the engine would like to send

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: Script([(0.0, token)] * 2000))
        async with tap_over([up], client_write_timeout_s=0.5) as (url, sink, proxy):
            host, port = url.removeprefix("http://").split(":")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            body = b'{"model":"m","stream":true,"messages":[]}'
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            started = time.monotonic()
            while not sink.requests and time.monotonic() - started < 20:
                await asyncio.sleep(0.05)
            # the tap dropped the connection it could not drain
            await wait_for(lambda: proxy.client_connections == 0, timeout_s=10)
            sock.close()
            assert up.closed_by_peer, "the tap closed the engine's stream"
            assert dropped(proxy, "client_write_timeout") == 0  # reported as an outcome instead
            sent = proxy.metrics.registry.get_sample_value(
                "llmslo_tap_bytes_total", {"direction": "upstream"}
            )
        [row] = sink.requests
        assert (row["outcome"], row["error_kind"]) == ("client_cancelled", "client_write_timeout")
        assert sent is not None and sent < total / 4  # backpressure: the tap stopped reading

    run(scenario())


def test_a_stalled_stream_after_first_token_is_reported_as_interrupted() -> None:
    events = chat_events(3, usage=False, done=False, finish=None)

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: Script([(0.0, e) for e in events], end="stall"))
        async with tap_over([up], read_timeout_s=0.3) as (url, sink, _):
            status, body, error = await post(url, CHAT)
        assert status == 200 and error == "ClientPayloadError" and body == b"".join(events)
        [row] = sink.requests
        assert (row["outcome"], row["error_kind"]) == (
            "interrupted_after_first_token",
            "upstream_read_timeout",
        )

    run(scenario())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(min_value=1, max_value=8),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=12),
)
def test_rechunked_engine_writes_give_identical_bytes_and_measurements(
    tokens: int, cuts: list[int]
) -> None:
    stream = b"".join(chat_events(tokens))
    points = sorted({c % len(stream) for c in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in itertools.pairwise(points) if b > a]
    usage_free = b"".join(e for e in chat_events(tokens) if b'"usage"' not in e)

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: Script([(0.001, p) for p in pieces], usage_aware=False))
        async with tap_over([up]) as (url, sink, _):
            status, body, error = await post(url, CHAT)
        assert (status, error, body) == (200, None, usage_free)
        [row] = sink.requests
        assert (row["token_chunks"], row["completion_tokens"], row["prompt_tokens"]) == (
            tokens,
            tokens,
            7,
        )
        assert (row["finish_reason"], row["outcome"], row["chunk_tokens"]) == (
            "stop",
            "ok",
            [1] * tokens,
        )

    run(scenario())


def test_many_concurrent_streams_all_get_records() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(10, gap_s=0.005))
        async with tap_over([up]) as (url, sink, proxy):
            results = await asyncio.gather(*[post(url, CHAT) for _ in range(64)])
            assert sum(proxy.inflight.in_flight.values()) == 0
        assert all(status == 200 and error is None for status, _, error in results)
        assert len(sink.requests) == 64 and {r["outcome"] for r in sink.requests} == {"ok"}

    run(scenario())


def test_an_oversized_request_body_is_refused_before_reaching_the_engine() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(1))
        async with tap_over([up], max_request_bytes=1024) as (url, _, _):
            status, _, _ = await post(
                url, {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
            )
            ok, _, _ = await post(url, CHAT)
        assert status == 413 and ok == 200
        assert len(up.requests) == 1

    run(scenario())
