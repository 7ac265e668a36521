"""Timeouts a trickle cannot reset: the whole request head and body
are read within a total deadline, and an engine that only sends SSE comments meets a
first-token timeout."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.collectors.tap.fakes import CHAT, Script, ScriptedUpstream, post, stream_script, tap_over

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: tap\r\nContent-Type: application/json\r\n"


def run(coro):
    return asyncio.run(coro)


async def trickle(port: int, prefix: bytes, dribble: bytes, every_s: float) -> tuple[bytes, float]:
    """Send ``prefix``, then ``dribble`` one byte every ``every_s``; return what the tap
    answered and how long the connection stayed open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(prefix)

    async def feed() -> None:
        for byte in dribble:
            await asyncio.sleep(every_s)
            if writer.is_closing():
                return
            writer.write(bytes([byte]))

    feeder = asyncio.create_task(feed())
    try:
        answer = await asyncio.wait_for(reader.read(), timeout=30)
    except ConnectionError:
        answer = b""
    elapsed = time.monotonic() - started
    feeder.cancel()
    writer.close()
    return answer, elapsed


@pytest.mark.parametrize(
    ("prefix", "dribble"),
    [
        (b"", HEAD + b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"),
        (HEAD + b"Content-Length: 300\r\n\r\n", b"{" + b" " * 299),
    ],
    ids=["a head sent one byte at a time", "a body sent one byte at a time"],
)
def test_a_request_trickled_byte_by_byte_is_cut_at_its_total_deadline(
    prefix: bytes, dribble: bytes
) -> None:
    async def scenario() -> tuple[bytes, float, int]:
        up = ScriptedUpstream(lambda req: stream_script(2))
        async with tap_over(
            [up], client_idle_timeout_s=0.5, client_head_timeout_s=1.0, client_body_timeout_s=1.0
        ) as (url, _, _proxy):
            port = int(url.rpartition(":")[2])
            answer, elapsed = await trickle(port, prefix, dribble, every_s=0.1)
            return answer, elapsed, len(up.requests)

    answer, elapsed, forwarded = run(scenario())
    # every byte came well within the idle timeout; the total deadline still ends it
    assert elapsed < 2.5, f"connection stayed open {elapsed:.1f} s"
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert forwarded == 0


def test_a_slow_but_steady_request_within_its_deadline_is_served() -> None:
    async def scenario() -> tuple[bytes, int]:
        up = ScriptedUpstream(lambda req: stream_script(2))
        body = json.dumps({**CHAT, "stream": False}).encode()
        head = HEAD + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        async with tap_over([up], client_idle_timeout_s=0.5, client_body_timeout_s=5.0) as (
            url,
            _,
            _proxy,
        ):
            port = int(url.rpartition(":")[2])
            answer, _ = await trickle(port, head + body[:-5], body[-5:], every_s=0.2)
            return answer, len(up.requests)

    answer, forwarded = run(scenario())
    assert answer.startswith(b"HTTP/1.1 200 ") and forwarded == 1


def pinging(seconds: float, every_s: float, *, role_first: bool = False) -> ScriptedUpstream:
    """An engine that answers 200 and then only sends SSE comments (keep-alives)."""
    pieces: list[tuple[float, bytes]] = []
    if role_first:
        role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
        pieces.append((0.0, role))
    pieces += [(every_s, b": ping\n\n")] * int(seconds / every_s)
    return ScriptedUpstream(lambda req: Script(pieces, end="stall"))


@pytest.mark.parametrize("role_first", [False, True], ids=["only pings", "role chunk, then pings"])
def test_keepalive_comments_do_not_reset_the_first_token_timeout(role_first: bool) -> None:
    async def scenario() -> None:
        up = pinging(20, 0.1, role_first=role_first)
        async with tap_over(
            [up], max_attempts=1, read_timeout_s=0.5, first_token_timeout_s=1.0
        ) as (url, sink, _):
            started = time.monotonic()
            status, body, problem = await post(url, CHAT, timeout_s=15)
            elapsed = time.monotonic() - started
        assert elapsed < 3, f"the client waited {elapsed:.1f} s"
        assert (status, problem) == (504, None)
        assert json.loads(body)["error"]["type"] == "upstream_timeout"
        [row] = sink.requests
        assert (row["outcome"], row["error_kind"], row["http_status"]) == (
            "upstream_timeout",
            "first_token_timeout",
            504,
        )
        assert row["ttft_s"] is None and up.closed_by_peer

    run(scenario())


def test_a_first_token_timeout_is_retried_on_another_upstream() -> None:
    async def scenario() -> None:
        good = ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([pinging(20, 0.1), good], first_token_timeout_s=0.8) as (
            url,
            sink,
            _,
        ):
            status, body, problem = await post(url, CHAT, timeout_s=15)
        assert (status, problem) == (200, None) and body.endswith(b"data: [DONE]\n\n")
        assert [r["outcome"] for r in sink.requests] == ["upstream_timeout", "ok"]

    run(scenario())


def test_tokens_that_keep_coming_are_not_cut_by_the_first_token_timeout() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(12, gap_s=0.1, first_s=0.2))
        async with tap_over([up], first_token_timeout_s=0.5) as (url, sink, _):
            status, body, problem = await post(url, CHAT, timeout_s=15)
        assert (status, problem) == (200, None) and body.endswith(b"data: [DONE]\n\n")
        assert sink.requests[0]["outcome"] == "ok"

    run(scenario())
