"""A tap whose event loop is blocked between chunks does not report its stall as the
engine's: every recorded gap stays within the record's stated error bound of the gap the
engine sent, and a request measured across a long stall is marked ``itl_uncertain``.

The engine is a plain socket server on its own thread that notes the monotonic time of
every send (taken just before ``sendall``); the tap and the client share the test's loop,
into which a synchronous sleep is injected once the engine has sent a chosen chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from collectors.tap.loopwatch import LoopWatch, read_throttled_s
from tests.collectors.tap.fakes import CHAT, chat_events, post, tap_over

TOKENS = 30
GAP_S = 0.02
#: The engine's clock is read just before sendall; bytes reach the tap's socket within
#: this on loopback (the tap's timestamps are what the bound is about).
SEND_SLACK_S = 0.002


class PacedEngine:
    """Answers each POST with ``TOKENS`` chat chunks, one every ``GAP_S``, on a thread;
    ``sent_s[request]`` holds the monotonic time just before each token chunk's send and
    ``spread_s[request]`` how long that send took (the bytes reached the tap's socket in
    between: on loopback the send delivers them)."""

    def __init__(self, on_sent: Callable[[int], None] | None = None) -> None:
        self.on_sent = on_sent
        self.sent_s: list[list[float]] = []
        self.spread_s: list[list[float]] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            first = head.split(b"\r\n", 1)[0]
            if not first.startswith(b"POST"):
                conn.sendall(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            length = int(
                next(
                    line.split(b":", 1)[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
            )
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            self._stream(conn)

    def _stream(self, conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        sent: list[float] = []
        spread: list[float] = []
        self.sent_s.append(sent)
        self.spread_s.append(spread)
        events = chat_events(TOKENS)
        start = time.monotonic()
        for i, event in enumerate(events):
            token = 1 <= i <= TOKENS  # the role chunk first, then the token chunks
            if token:
                due = start + i * GAP_S
                time.sleep(max(0.0, due - time.monotonic()))
                sent.append(time.monotonic())
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            if token:
                spread.append(time.monotonic() - sent[-1])
            if token and self.on_sent is not None:
                self.on_sent(i)
        conn.sendall(b"0\r\n\r\n")


def _run(factory: str, scenario: Coroutine[Any, Any, Any]) -> Any:
    if factory == "uvloop":
        return uvloop.run(scenario)
    return asyncio.run(scenario)


def _measured(block_after: int | None, block_s: float, factory: str) -> tuple[dict, list[float]]:
    """One request through a tap; with ``block_after``, the tap's loop sleeps ``block_s``
    synchronously once the engine has sent that token chunk."""

    async def scenario() -> tuple[dict, list[float]]:
        loop = asyncio.get_running_loop()

        def on_sent(i: int) -> None:
            if i == block_after:
                loop.call_soon_threadsafe(time.sleep, block_s)

        engine = PacedEngine(on_sent)
        try:
            async with tap_over([engine.url], gap_error_max_s=0.05) as (url, sink, _proxy):
                status, _, error = await post(url, CHAT)
                assert (status, error) == (200, None)
        finally:
            engine.close()
        (row,) = sink.requests
        (sent,) = engine.sent_s
        _LAST_SPREAD[:] = engine.spread_s[0]
        return row, sent

    return _run(factory, scenario())


def _errors(row: dict, sent: list[float]) -> list[float]:
    engine_gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert len(row["itl_gaps_s"]) == len(engine_gaps) == TOKENS - 1  # every gap, as read
    return [abs(g - e) for g, e in zip(row["itl_gaps_s"], engine_gaps, strict=True)]


#: the send spreads of the last request :func:`_measured` ran
_LAST_SPREAD: list[float] = []

LOOPS = pytest.mark.parametrize("factory", ["asyncio", "uvloop"], ids=lambda f: f"on {f}")


@LOOPS
def test_a_blocked_loop_spoils_the_gaps_it_delayed_not_the_request(factory: str) -> None:
    row, sent = _measured(block_after=10, block_s=0.2, factory=factory)
    errors = _errors(row, sent)
    # the stall is in the gaps as read (the chunks queued behind it were read together) ...
    assert max(errors) > 0.1
    # ... and out of the summary: it holds the gaps the tap can vouch for, each within the
    # stated bound of the engine's 20-ms schedule, enough of them for a jitter
    assert row["itl_count"] < TOKENS - 1
    assert row["itl_error_s"] <= 0.05 and row["itl_uncertain"] is False
    # (the engine's own gaps, not its 20-ms intent: on a busy host its thread is late too)
    slack = row["itl_error_s"] + SEND_SLACK_S + 2 * max(_LAST_SPREAD)
    assert sorted(errors)[row["itl_count"] - 1] <= slack
    assert row["itl_jitter_s"] is not None


@LOOPS
def test_a_loop_blocked_for_most_of_the_stream_marks_the_request_uncertain(factory: str) -> None:
    row, sent = _measured(block_after=3, block_s=0.6, factory=factory)
    errors = _errors(row, sent)
    assert max(errors) > 0.3  # the chunks sent during the block were read at once
    # too few gaps left that the tap can vouch for: the request says so, with the bound
    # of every gap as read
    assert row["itl_uncertain"] is True
    assert row["itl_error_s"] >= 0.3 and max(errors) <= row["itl_error_s"] + SEND_SLACK_S


@LOOPS
def test_a_free_loop_records_the_engines_schedule_within_the_bound(factory: str) -> None:
    row, sent = _measured(block_after=None, block_s=0.0, factory=factory)
    errors = _errors(row, sent)
    # the engine's note of a send can itself be late by that send's spread (a thread of
    # this process waiting for the GIL): the tap's bound is about the socket, not that
    assert max(errors) <= row["itl_error_s"] + SEND_SLACK_S + max(_LAST_SPREAD)
    # a loop nobody blocks: a bound well under the limit, the gaps count
    assert row["itl_error_s"] < 0.05 and row["itl_uncertain"] is False


def test_the_watch_bounds_bytes_read_after_a_stall_by_the_stall() -> None:
    async def scenario() -> tuple[float, float, float, float]:
        watch = LoopWatch(time.monotonic, 0.001)
        watch.start()
        await asyncio.sleep(0.02)
        quiet = watch.late_s(time.monotonic())
        time.sleep(0.1)  # the loop is held: nothing runs, no tick
        stalled = watch.late_s(time.monotonic())
        await asyncio.sleep(0.02)
        after = watch.late_s(time.monotonic())
        lag = watch.take_max_lag_s()
        watch.stop()
        return quiet, stalled, after, lag

    quiet, stalled, after, lag = asyncio.run(scenario())
    assert stalled >= 0.1 > quiet
    assert lag >= 0.09  # the tick due during the stall ran that late
    assert after < 0.05  # and the bound falls back once the loop runs again


def test_gc_pauses_are_timed_and_the_callback_removed() -> None:
    pauses: list[float] = []
    watch = LoopWatch(time.monotonic, on_gc=pauses.append)

    async def scenario() -> None:
        watch.start()
        gc.collect()
        watch.stop()
        gc.collect()

    asyncio.run(scenario())
    assert len(pauses) == 1 and pauses[0] > 0 and watch.gc_pause_s == pauses[0]


def test_cgroup_throttling_is_read_from_cpu_stat(tmp_path: Any) -> None:
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 10\nnr_throttled 3\nthrottled_usec 2500000\n")
    assert read_throttled_s(stat) == 2.5
    stat.write_text("usage_usec 10\n")
    assert read_throttled_s(stat) is None
    assert read_throttled_s(tmp_path / "missing") is None


def test_the_tap_publishes_its_health_as_samples() -> None:
    async def scenario() -> tuple[list[dict], list[dict]]:
        engine = PacedEngine()
        try:
            async with tap_over([engine.url]) as (url, sink, proxy):
                await post(url, CHAT)
                time.sleep(0.05)  # a stall the next sample reports
                await asyncio.sleep(0.01)
                proxy.publish_gauges()
                return [r for r in sink.samples if r["signal"].startswith("tap_")], sink.requests
        finally:
            engine.close()

    rows, records = asyncio.run(scenario())
    by_signal = {r["signal"]: r for r in rows}
    assert {"tap_loop_lag", "tap_gc_pause", "tap_uncertain_requests"} <= set(by_signal)
    assert by_signal["tap_loop_lag"]["value"] >= 0.04
    # the counter is the records marked uncertain (a busy node may make the one request so)
    uncertain = sum(1 for record in records if record["itl_uncertain"])
    assert by_signal["tap_uncertain_requests"]["value"] == uncertain
    with contextlib.suppress(KeyError):  # present where cgroup v2 reports throttling
        assert by_signal["tap_cpu_throttled"]["value"] >= 0


def test_a_chunk_read_late_spoils_the_two_gaps_beside_it_and_only_them() -> None:
    """Pure logic: the gap before a late chunk looks longer, the one after it shorter;
    both leave the summary, the rest stay, and the bound is theirs."""
    from collectors.tap.measure import StreamMeter

    chunk = b'{"choices":[{"index":0,"delta":{"content":"x"}}]}'
    meter = StreamMeter(0.0)
    late = {5: 0.08}  # the sixth token chunk was read 80 ms late
    for i in range(12):
        meter.on_data(chunk, 0.1 + 0.02 * i + late.get(i, 0.0), late.get(i, 0.001))
    m = meter.m
    assert len(m.itl_gaps_s) == 11 and len(m.itl_gap_errors_s) == 11
    summary, bound, uncertain = m.vouched_itl(0.005)
    assert summary.count == 9  # gaps 4→5 and 5→6 left out
    assert summary.max_s is not None and abs(summary.max_s - 0.02) < 1e-9
    assert (bound, uncertain) == (0.001, False)
    as_read = m.itl_summary().max_s
    assert as_read is not None and as_read > 0.09  # every gap as read
