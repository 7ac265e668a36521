"""The tap's HTTP/1.1 server against raw sockets: framing, limits, hostile requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.tap.downstream import Downstream
from collectors.tap.server import IncomingRequest, TapServer
from tests.collectors.tap.fakes import CHAT, ScriptedUpstream, stream_script, tap_over


def run(coro):
    return asyncio.run(coro)


async def echo(request: IncomingRequest, down: Downstream) -> None:
    """Answers with what it parsed, in two chunks."""
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    summary = {
        "method": request.method,
        "path": request.path,
        "path_qs": request.path_qs,
        "x_test": request.headers.get("X-Test"),
        "body": request.body.decode(),
    }
    down.commit(200, {"Content-Type": "application/json"})
    text = json.dumps(summary).encode()
    await down.write(text[:5])
    await down.write(text[5:])
    await down.end()


@asynccontextmanager
async def serving(**limits: float) -> AsyncIterator[int]:
    options = {"max_body_bytes": 1024, "write_timeout_s": 2.0, "idle_timeout_s": 5.0}
    server = TapServer(echo, **{**options, **limits})  # type: ignore[arg-type]
    port = await server.start("127.0.0.1", 0)
    try:
        yield port
    finally:
        await server.close(grace_s=1.0)


async def exchange(port: int, raw: bytes, *, pieces: list[int] | None = None) -> bytes:
    """Send ``raw`` (split at ``pieces`` sizes), return everything until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    rest = raw
    for size in pieces or [len(raw)]:
        writer.write(rest[:size])
        rest = rest[size:]
        await writer.drain()
        await asyncio.sleep(0)
    writer.write(rest)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(-1), 10)
    finally:
        writer.close()


def dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + body[:size], body[size + 2 :]


def request(path: str = "/x?a=1", body: bytes = b"hi", extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: t\r\nX-Test: yes\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)
    )


def test_a_request_is_parsed_and_answered_in_chunks() -> None:
    async def scenario() -> None:
        async with serving() as port:
            answer = await exchange(port, request())
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding: chunked" in head
        assert json.loads(dechunk(body)) == {
            "method": "POST",
            "path": "/x",
            "path_qs": "/x?a=1",
            "x_test": "yes",
            "body": "hi",
        }

    run(scenario())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=30), max_size=12))
def test_any_split_of_the_request_bytes_parses_the_same(pieces: list[int]) -> None:
    async def scenario() -> bytes:
        async with serving() as port:
            return await exchange(port, request(body=b"0123456789" * 5), pieces=pieces)

    body = run(scenario()).partition(b"\r\n\r\n")[2]
    assert json.loads(dechunk(body))["body"] == "0123456789" * 5


def test_pipelined_requests_are_answered_in_order() -> None:
    async def scenario() -> None:
        keep = b"POST /%d HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\n%d"
        raw = b"".join(keep % (i, i) for i in range(3)) + request("/last")
        async with serving() as port:
            answer = await exchange(port, raw)
        paths = [
            json.loads(dechunk(part.partition(b"\r\n\r\n")[2]))["path"]
            for part in answer.split(b"HTTP/1.1 200 OK")[1:]
        ]
        assert paths == ["/0", "/1", "/2", "/last"]

    run(scenario())


def test_an_http_1_0_client_gets_a_body_ended_by_the_close() -> None:
    async def scenario() -> None:
        raw = b"POST /old HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi"
        async with serving() as port:
            answer = await exchange(port, raw)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"chunked" not in head and b"Connection: close" in head
        assert json.loads(body)["path"] == "/old"

    run(scenario())


def test_expect_100_continue_is_answered_before_the_body() -> None:
    async def scenario() -> None:
        async with serving() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
                b"Connection: close\r\n\r\n"
            )
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(b"ok")
            rest = await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert json.loads(dechunk(rest.partition(b"\r\n\r\n")[2]))["body"] == "ok"

    run(scenario())


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
        (b"POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"400\r\n"
            + b"x" * 1024
            + b"\r\n"
            + b"400\r\n"
            + b"x" * 1024
            + b"\r\n0\r\n\r\n",
            413,
        ),
        (b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 501),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\nPOST /smuggled HTTP/1.1\r\n\r\n",
            400,
        ),
    ],
    ids=[
        "garbage",
        "negative length",
        "oversized head",
        "declared too big",
        "chunked too big",
        "upgrade",
        "length and chunked",
    ],
)
def test_a_bad_request_gets_a_clear_error_and_the_connection_closes(
    raw: bytes, status: int
) -> None:
    async def scenario() -> bytes:
        async with serving() as port:
            return await exchange(port, raw)

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:80]
    error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == status and error["message"]


def test_a_failing_handler_is_a_500_and_the_server_keeps_serving() -> None:
    async def scenario() -> None:
        async with serving() as port:
            failed = await exchange(port, request("/boom"))
            fine = await exchange(port, request("/after"))
        assert failed.startswith(b"HTTP/1.1 500 ")
        assert json.loads(failed.partition(b"\r\n\r\n")[2])["error"]["type"] == "tap_error"
        assert fine.startswith(b"HTTP/1.1 200 ")

    run(scenario())


def test_an_idle_client_connection_is_closed() -> None:
    async def scenario() -> None:
        async with serving(idle_timeout_s=0.3) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nHost: t\r\n")  # and never the rest
            assert await asyncio.wait_for(reader.read(-1), 5) == b""
            writer.close()

    run(scenario())


def test_head_passthrough_gets_headers_and_no_body() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(1))
        async with tap_over([up]) as (url, _, _):
            port = int(url.rpartition(":")[2])
            answer = await exchange(
                port, b"HEAD /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"X-Up: 1" in head and body == b""

    run(scenario())


def test_a_streamed_completion_to_an_http_1_0_client_is_whole() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([up]) as (url, sink, _):
            port = int(url.rpartition(":")[2])
            body = json.dumps(CHAT).encode()
            answer = await exchange(
                port,
                b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            )
        events = answer.partition(b"\r\n\r\n")[2]
        assert events.endswith(b"data: [DONE]\n\n") and events.count(b"data: ") == 5
        assert [r["outcome"] for r in sink.requests] == ["ok"]

    run(scenario())


# ---------------------------------------------------------------- review regressions


def test_a_header_that_never_ends_is_refused_at_the_head_limit() -> None:
    async def scenario() -> bytes:
        async with serving() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nX-Endless: ")
            try:
                for _ in range(128):  # 8 MiB of one header value, never ended
                    writer.write(b"a" * 65536)
                    await writer.drain()
            except ConnectionError:
                pass  # the tap closed the connection: what it said is still readable
            answer = await asyncio.wait_for(reader.read(-1), 10)
            writer.close()
            return answer

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 431 ") and b"Date: " in answer


def test_a_queued_request_is_dropped_when_the_response_before_it_cut_the_connection() -> None:
    handled: list[str] = []

    async def cutting(request: IncomingRequest, down: Downstream) -> None:
        handled.append(request.path)
        down.commit(200, {})
        down.write_nowait(b"x" * 4_000_000)  # more than the socket buffers hold
        down.abort()  # a stream cut mid-way (the engine failed after the first token)

    async def scenario() -> None:
        server = TapServer(cutting, max_body_bytes=1024, write_timeout_s=2, idle_timeout_s=5)
        port = await server.start("127.0.0.1", 0)
        pipelined = b"".join(
            b"POST /%s HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n" % name
            for name in (b"first", b"second")
        )
        await exchange(port, pipelined)
        await server.close(grace_s=1.0)

    run(scenario())
    assert handled == ["/first"]  # /second never reached an engine


def test_pipelined_requests_are_not_read_ahead_of_the_running_one() -> None:
    queued: list[int] = []

    async def slow(request: IncomingRequest, down: Downstream) -> None:
        await asyncio.sleep(0.3)
        queued.extend(len(c._pending) for c in server.connections)
        down.commit(200, {}, content_length=0)
        await down.end()

    server = TapServer(slow, max_body_bytes=64 * 1024, write_timeout_s=2, idle_timeout_s=5)

    async def scenario() -> bytes:
        port = await server.start("127.0.0.1", 0)
        body = b"b" * 60_000
        one = b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        answer = await exchange(port, one * 6 + request("/last"))
        await server.close(grace_s=1.0)
        return answer

    answer = run(scenario())
    assert answer.count(b"HTTP/1.1 200 ") == 7  # all answered, in turn
    assert max(queued) <= 2  # at most the next request (and one read's worth) waited parsed


def test_expect_100_on_a_pipelined_request_does_not_land_inside_another_response() -> None:
    async def streaming(request: IncomingRequest, down: Downstream) -> None:
        down.commit(200, {})
        await down.write(b"part one;")
        await asyncio.sleep(0.3)  # the next request arrives meanwhile
        await down.write(b"part two")
        await down.end()

    async def scenario() -> bytes:
        server = TapServer(streaming, max_body_bytes=1024, write_timeout_s=2, idle_timeout_s=5)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        await asyncio.sleep(0.1)
        writer.write(
            b"POST /b HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 1\r\n"
            b"Connection: close\r\n\r\nb"
        )
        answer = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        await server.close(grace_s=1.0)
        return answer

    answer = run(scenario())
    first_body = answer.split(b"HTTP/1.1 200 OK")[1].partition(b"\r\n\r\n")[2]
    assert dechunk(first_body) == b"part one;part two"  # framing intact, nothing inside
    assert answer.count(b"HTTP/1.1 200 OK") == 2


def test_a_percent_encoded_route_is_measured() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(2))
        async with tap_over([up]) as (url, sink, _):
            port = int(url.rpartition(":")[2])
            body = json.dumps(CHAT).encode()
            await exchange(
                port,
                b"POST /v1/chat/%%63ompletions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            )
        assert [r["outcome"] for r in sink.requests] == ["ok"]

    run(scenario())
