"""A stream the client received whole is ``ok``, even when the client hangs up at once.

Real clients (the OpenAI SDK, the simulator's load generator) stop reading at
``data: [DONE]`` and close the connection without waiting for HTTP's terminating chunk.
The tap forwarded every event the client asked for, so the request succeeded; counting it
as ``client_cancelled`` would burn the availability budget falsely. A client that leaves
before the end is still ``client_cancelled`` (tests/collectors/tap/test_disconnect.py).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from tests.collectors.tap.fakes import Script, ScriptedUpstream, chat_events, tap_over, wait_for

REQUEST_BODY = (
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,'
    b'"stream_options":{"include_usage":true}}'
)


async def read_until_then_hang_up(url: str, marker: bytes) -> bytes:
    """A raw HTTP/1.1 client: POST, read until ``marker`` has arrived, then drop the
    connection at once (no terminating chunk read, nothing else sent)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: tap\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(REQUEST_BODY), REQUEST_BODY)
    )
    seen = b""
    while marker not in seen:
        piece = await asyncio.wait_for(reader.read(65536), 10)
        assert piece, "the tap closed before the marker arrived"
        seen += piece
    writer.transport.abort()
    return seen


def separately(events: list[bytes], *, gap_s: float, end_after_s: float) -> Script:
    """Each event in its own write, ``gap_s`` apart; the upstream's end of the body (its
    terminating chunk) comes ``end_after_s`` after the last event."""
    pieces = [(gap_s, event) for event in events]
    return Script([*pieces, (end_after_s, b"")])


@pytest.mark.parametrize(
    ("marker", "end_after_s"),
    [
        (b"data: [DONE]", 0.3),
        (b"data: [DONE]", 0.0),
        (b'"usage"', 0.3),
    ],
    ids=[
        "client leaves after [DONE] while the engine has not ended the body yet",
        "client leaves after [DONE] as the engine ends the body",
        "client leaves after the last content chunk and usage, before [DONE]",
    ],
)
def test_a_stream_received_whole_is_ok_when_the_client_hangs_up_at_once(
    marker: bytes, end_after_s: float
) -> None:
    async def scenario() -> None:
        events = chat_events(12)
        up = ScriptedUpstream(lambda req: separately(events, gap_s=0.01, end_after_s=end_after_s))
        async with tap_over([up]) as (url, sink, _):
            seen = await read_until_then_hang_up(url, marker)
            await wait_for(lambda: bool(sink.requests))
        assert seen.count(b'"content":"t') == 12  # the client did get every token
        [row] = sink.requests
        assert row["outcome"] == "ok", row
        assert row["client_disconnected"] is False and row["disconnect_ts_ms"] is None
        assert row["token_chunks"] == 12 and row["finish_reason"] == "stop"

    asyncio.run(scenario())


def test_a_client_that_leaves_before_the_last_token_is_still_cancelled() -> None:
    async def scenario() -> None:
        events = chat_events(12)
        up = ScriptedUpstream(lambda req: separately(events, gap_s=0.02, end_after_s=0.0))
        async with tap_over([up]) as (url, sink, _):
            await read_until_then_hang_up(url, b'"content":"t5 "')
            await wait_for(lambda: bool(sink.requests))
        [row] = sink.requests
        assert row["outcome"] == "client_cancelled" and row["client_disconnected"] is True

    asyncio.run(scenario())
