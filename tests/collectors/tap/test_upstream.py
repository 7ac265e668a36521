"""The tap's HTTP/1.1 engine client against real loopback servers that send exact bytes."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.tap.upstream import (
    ConnectFailed,
    ReadTimeout,
    UpstreamClient,
    UpstreamReset,
    UpstreamResponse,
)

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawEngine:
    """A loopback server that answers each connection with ``reply`` (exact bytes)."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.reply(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def run(coro):
    return asyncio.run(coro)


def client(**overrides: float) -> UpstreamClient:
    options = {"connect_timeout_s": 2.0, "read_timeout_s": 5.0, "max_connections": 16}
    return UpstreamClient(**{**options, **overrides})  # type: ignore[arg-type]


async def body_of(resp: UpstreamResponse) -> bytes:
    parts = []
    while chunk := await resp.readany():
        parts.append(chunk)
    return b"".join(parts)


def engine_answering(*answers: bytes, gap_s: float = 0.0, think_s: float = 0.0) -> RawEngine:
    """An engine that answers the requests on each connection with ``answers`` in turn,
    after ``think_s``, writing the ``|``-separated parts ``gap_s`` apart."""

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            await engine.read_request(reader)
            await asyncio.sleep(think_s)
            for part in answer.split(b"|"):
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(gap_s)

    engine = RawEngine(reply)
    return engine


def test_a_kept_alive_connection_is_reused_and_the_request_is_exact() -> None:
    async def scenario() -> None:
        hello = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
        engine = engine_answering(hello, hello, hello)
        async with engine as url:
            upstream = client()
            for _ in range(3):
                resp = await upstream.request(
                    url, "POST", "/v1/chat/completions?x=1", [("X-Tenant", "t1")], b"{}"
                )
                assert resp.status == 200 and await body_of(resp) == b"hello"
                resp.release()
            await upstream.close()
        assert engine.connections == 1
        host = url.removeprefix("http://")
        assert engine.requests[0] == (
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: %s\r\nX-Tenant: t1\r\n"
            b"Content-Length: 2\r\n\r\n{}" % host.encode()
        )

    run(scenario())


def test_a_kept_alive_connection_the_engine_dropped_is_replaced_without_an_error() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        if engine.connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-N: 1\r\n\r\nok")
            await writer.drain()
            # The next request on this connection races the engine's keep-alive timeout:
            # it is read and dropped unanswered, as an engine closing an idle socket does.
            await engine.read_request(reader)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-N: 2\r\n\r\nok")
        await writer.drain()

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            first = await upstream.request(url, "POST", "/", [], b"a")
            assert await body_of(first) == b"ok"
            first.release()
            second = await upstream.request(url, "POST", "/", [], b"b")
            assert ("X-N", "2") in second.headers and await body_of(second) == b"ok"
            await upstream.close()
        assert engine.connections == 2
        assert [r.endswith(b"b") for r in engine.requests] == [False, True, True]

    run(scenario())


def test_a_reset_after_the_answer_began_is_reported_not_replayed() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        writer.transport.abort()

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "POST", "/", [], b"")
            assert await resp.readany() == b"hello"  # what arrived before the cut is kept
            with pytest.raises(UpstreamReset):
                await resp.readany()
            await upstream.close()
        assert len(engine.requests) == 1

    run(scenario())


@pytest.mark.parametrize(
    ("framing", "answer"),
    [
        ("content-length", b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"),
        (
            "chunked",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        ),
        ("until close", b"HTTP/1.0 200 OK\r\n\r\nhello world"),
        (
            "interim 100 first",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
            b"Content-Length: 11\r\n\r\nhello world",
        ),
    ],
)
def test_every_body_framing_gives_the_body(framing: str, answer: bytes) -> None:
    engine = engine_answering(answer)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "POST", "/", [], b"")
            assert resp.status == 200, framing
            assert await body_of(resp) == b"hello world" and resp.at_eof()
            resp.release()
            await upstream.close()

    run(scenario())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_any_split_of_a_chunked_answer_gives_the_same_body_and_headers(
    sizes: list[int],
) -> None:
    payload = b"".join(b'data: {"n":%d}\n\n' % i for i in range(12))
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payload.split(b"\n\n") if p)
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Engine: a\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n"
    )

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        rest, cuts = answer, itertools.cycle(sizes)
        while rest:
            size = next(cuts)
            writer.write(rest[:size])
            rest = rest[size:]
            await writer.drain()
            await asyncio.sleep(0)

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "POST", "/", [], b"")
            body = await body_of(resp)
            await upstream.close()
        assert ("X-Engine", "a") in resp.headers
        assert body == payload.replace(b"\n\n", b"")

    run(scenario())


@pytest.mark.parametrize(
    "answer",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: banana\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",
    ],
    ids=["garbage", "bad length", "oversized head", "bad chunk size"],
)
def test_an_invalid_answer_is_a_reset_not_a_crash(answer: bytes) -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(5)

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            with pytest.raises(UpstreamReset, match="invalid HTTP response"):
                resp = await upstream.request(url, "POST", "/", [], b"")
                await body_of(resp)
            assert upstream.open_connections == 0  # the broken connection was dropped
            await upstream.close()

    run(scenario())


def test_silence_before_the_head_and_between_chunks_times_out() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        if len(engine.requests) == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client(read_timeout_s=0.3)
            started = time.monotonic()
            with pytest.raises(ReadTimeout):
                await upstream.request(url, "POST", "/", [], b"")
            assert 0.25 < time.monotonic() - started < 2
            resp = await upstream.request(url, "POST", "/", [], b"")
            assert await resp.readany() == b"abc"
            started = time.monotonic()
            with pytest.raises(ReadTimeout):
                await resp.readany()
            assert 0.25 < time.monotonic() - started < 2
            await upstream.close()

    run(scenario())


def test_a_refused_connection_is_connect_failed() -> None:
    async def scenario() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        upstream = client()
        with pytest.raises(ConnectFailed, match="cannot connect"):
            await upstream.request(f"http://127.0.0.1:{port}", "POST", "/", [], b"")
        assert upstream.open_connections == 0

    run(scenario())


def test_a_line_break_in_a_header_is_refused_before_anything_is_sent() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            with pytest.raises(ValueError, match="line break"):
                await upstream.request(url, "POST", "/", [("X-A", "1\r\nX-Evil: 1")], b"")
            await upstream.close()
        assert engine.requests == []

    run(scenario())


def test_the_connection_cap_queues_requests_instead_of_opening_more() -> None:
    engine = engine_answering(*[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"] * 6, think_s=0.1)

    async def scenario() -> None:
        async with engine as url:
            upstream = client(max_connections=2)
            peak = 0

            async def one() -> bytes:
                nonlocal peak
                resp = await upstream.request(url, "POST", "/", [], b"")
                peak = max(peak, upstream.open_connections)
                body = await body_of(resp)
                resp.release()
                return body

            bodies = await asyncio.gather(*(one() for _ in range(6)))
            await upstream.close()
        assert bodies == [b"ok"] * 6 and peak <= 2 and engine.connections <= 2

    run(scenario())


def test_a_reader_that_does_not_read_stops_the_socket_being_read() -> None:
    total = 8 * 1024 * 1024
    written = 0

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await engine.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        block = b"x" * 65536
        while written < total:
            writer.write(block)
            written += len(block)
            await writer.drain()

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "POST", "/", [], b"")
            await asyncio.sleep(1.0)  # nobody reads
            held = resp._conn.buffered
            stuck_at = written
            assert held < 1024 * 1024, held  # bounded in the tap...
            assert stuck_at < total / 2  # ...and the engine is blocked by TCP
            body = await body_of(resp)  # reading again resumes the socket
            assert len(body) == total
            await upstream.close()

    run(scenario())


def test_pipe_hands_chunks_over_in_the_callback_and_pauses_when_told() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(6):
            writer.write(b"1\r\n%d\r\n" % i)
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "POST", "/", [], b"")
            got: list[bytes] = []

            def take(chunk: bytes) -> bool:
                got.append(chunk)
                return len(got) == 2  # "behind" once, after the second chunk

            assert await resp.pipe(take) is True
            assert b"".join(got) == b"01"
            assert await resp.pipe(take) is False  # to the end of the body
            assert b"".join(got) == b"012345" and resp.at_eof()

            def fail(chunk: bytes) -> bool:
                raise RuntimeError("consumer broke")

            resp.release()
            again = await upstream.request(url, "POST", "/", [], b"")
            with pytest.raises(RuntimeError, match="consumer broke"):
                await again.pipe(fail)
            again.close()
            await upstream.close()

    run(scenario())


# ---------------------------------------------------------------- review regressions


def test_an_endless_header_from_the_engine_is_cut_at_the_head_limit() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sent = 0
        await engine.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        while sent < 8 * 1024 * 1024:  # never ends the header
            writer.write(b"a" * 65536)
            sent += 65536
            await writer.drain()

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            with pytest.raises(UpstreamReset, match="head over"):  # not a wait for more
                await upstream.request(url, "POST", "/", [], b"")
            assert upstream.open_connections == 0
            await upstream.close()

    run(scenario())


def test_a_connection_whose_consumer_fell_behind_on_the_last_chunk_is_reused_fine() -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n|9\r\ndata: x\n\n\r\n0\r\n\r\n"
    engine = engine_answering(answer, answer, gap_s=0.05)

    async def scenario() -> None:
        async with engine as url:
            upstream = client(read_timeout_s=3.0)
            resp = await upstream.request(url, "POST", "/", [], b"{}")
            got: list[bytes] = []
            behind = iter([True])  # behind on the last chunk, then caught up

            def take(chunk: bytes) -> bool:
                got.append(chunk)
                return next(behind, False)

            while await resp.pipe(take):
                pass
            assert b"".join(got) == b"data: x\n\n"
            resp.release()
            started = time.monotonic()
            again = await upstream.request(url, "POST", "/", [], b"{}")
            assert await body_of(again) == b"data: x\n\n"
            assert time.monotonic() - started < 2  # not the 3 s read timeout
            await upstream.close()

    run(scenario())


def test_reading_after_pipe_fell_behind_resumes_the_socket() -> None:
    pieces = b"|".join(b"6\r\ntoken%d\r\n" % i for i in range(8))
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n|" + pieces + b"|0\r\n\r\n"
    engine = engine_answering(answer, gap_s=0.05)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "POST", "/", [], b"{}")
            assert await resp.pipe(lambda chunk: True) is True  # behind: reading pauses
            rest = await asyncio.wait_for(body_of(resp), 5)  # as drain mode then reads
            assert rest.count(b"token") == 7
            await upstream.close()

    run(scenario())


def test_bytes_after_a_complete_answer_retire_the_connection_without_a_replay() -> None:
    engine = engine_answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokX",  # one stray byte
        b"HTTP/1.1 204 No Content\r\n\r\nbody a 204 must not have",
    )

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            for n in range(3):
                resp = await upstream.request(url, "POST", "/", [], b"%d" % n)
                await body_of(resp)
                resp.release()
                await asyncio.sleep(0.05)
            await upstream.close()
        assert [r[-1:] for r in engine.requests] == [b"0", b"1", b"2"]  # each sent once

    run(scenario())


def test_a_connection_dropped_after_the_engine_read_the_request_is_not_replayed() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await engine.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await engine.read_request(reader)
        await asyncio.sleep(0.3)  # works on it, then the worker dies

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            first = await upstream.request(url, "POST", "/", [], b"a")
            await body_of(first)
            first.release()
            with pytest.raises(UpstreamReset):
                await upstream.request(url, "POST", "/", [], b"b")
            await upstream.close()
        assert len(engine.requests) == 2  # the second request was read once, not twice

    run(scenario())


def test_a_waiter_cancelled_after_being_woken_passes_the_free_slot_on() -> None:
    engine = engine_answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", think_s=0.5
    )

    async def scenario() -> None:
        async with engine as url:
            upstream = client(max_connections=1)

            async def one() -> bytes:
                resp = await upstream.request(url, "POST", "/", [], b"{}")
                body = await body_of(resp)
                resp.release()
                return body

            busy = asyncio.create_task(one())
            await asyncio.sleep(0.05)
            first, second = asyncio.create_task(one()), asyncio.create_task(one())
            await asyncio.sleep(0.05)  # both wait for the only slot
            next(iter(upstream._open)).abort()  # the slot frees and wakes the first waiter...
            first.cancel()  # ...whose client leaves in the same turn
            await asyncio.gather(busy, return_exceptions=True)
            assert await asyncio.wait_for(second, 3) == b"ok"
            await upstream.close()

    run(scenario())


def test_a_get_without_a_body_carries_no_content_length() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        engine.requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    engine = RawEngine(reply)

    async def scenario() -> None:
        async with engine as url:
            upstream = client()
            resp = await upstream.request(url, "GET", "/v1/models", [], b"")
            assert resp.status == 200
            await upstream.close()
        assert b"content-length" not in engine.requests[0].lower()

    run(scenario())
