"""Client disconnects: the tap closes upstream at once, counts it; drain mode measures ghosts."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from tests.collectors.tap.fakes import (
    CHAT,
    ScriptedUpstream,
    stream_script,
    tap_over,
    tap_sample_signals,
    wait_for,
)


async def read_then_leave(url: str, tokens_to_read: int) -> float:
    """Read ``tokens_to_read`` token chunks, then drop the connection; returns when (wall s)."""
    session = aiohttp.ClientSession()
    resp = await session.post(url + "/v1/chat/completions", json=CHAT)
    seen = 0
    while seen < tokens_to_read:
        line = await resp.content.readline()
        if b'"content":"t' in line:
            seen += 1
    left = time.time()
    resp.close()
    await session.close()
    return left


def test_disconnect_closes_upstream_promptly_and_is_recorded() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(200, gap_s=0.02))
        async with tap_over([up], gauge_interval_s=0.1) as (url, sink, proxy):
            left = await read_then_leave(url, 3)
            await wait_for(lambda: bool(sink.requests) and bool(up.closed_by_peer))
            await asyncio.sleep(0.25)  # a gauge sample after the disconnect
            assert proxy.inflight.in_flight[up.url.removeprefix("http://")] == 0
        [row] = sink.requests
        assert row["outcome"] == "client_cancelled" and row["client_disconnected"] is True
        assert row["error_kind"] == "client_disconnected" and row["http_status"] == 200
        assert row["disconnect_ts_ms"] >= int(left * 1000) - 5
        assert row["upstream_closed_ts_ms"] - row["disconnect_ts_ms"] <= 1000
        assert up.closed_by_peer[0] - left < 2.0  # the engine saw its client go
        assert row["token_chunks"] >= 3 and row["tokens_after_disconnect"] is None
        instance = row["instance"]
        gauges = [s for s in sink.samples if s["instance"] == instance]
        assert {s["signal"] for s in gauges} == tap_sample_signals()
        assert all(s["dialect"] == "tap" for s in gauges)
        last = {s["signal"]: s["value"] for s in gauges}
        assert last["tap_in_flight"] == 0.0 and last["tap_disconnects"] == 1.0

    asyncio.run(scenario())


def test_in_flight_gauge_counts_open_streams() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(20, gap_s=0.05))
        async with tap_over([up], gauge_interval_s=0.05) as (url, sink, proxy):

            async def one() -> None:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(url + "/v1/chat/completions", json=CHAT) as r,
                ):
                    await r.read()

            tasks = [asyncio.create_task(one()) for _ in range(3)]
            instance = up.url.removeprefix("http://")
            await wait_for(lambda: proxy.inflight.in_flight[instance] == 3)
            await asyncio.sleep(0.15)
            await asyncio.gather(*tasks)
        values = [s["value"] for s in sink.samples if s["signal"] == "tap_in_flight"]
        assert 3.0 in values and values[-1] == 0.0

    asyncio.run(scenario())


def test_drain_mode_counts_tokens_generated_after_the_disconnect() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(30, gap_s=0.01))
        async with tap_over([up], drain_max_s=5.0) as (url, sink, _):
            await read_then_leave(url, 2)
            await wait_for(lambda: bool(sink.requests))
        [row] = sink.requests
        assert row["outcome"] == "client_cancelled"
        seen = row["token_chunks"]
        assert row["tokens_after_disconnect"] == 30 - seen
        assert row["upstream_closed_ts_ms"] - row["disconnect_ts_ms"] >= 100  # it kept reading

    asyncio.run(scenario())


def test_drain_is_bounded_in_time() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(1000, gap_s=0.05))
        async with tap_over([up], drain_max_s=0.3) as (url, sink, _):
            await read_then_leave(url, 1)
            await wait_for(lambda: bool(sink.requests), timeout_s=5)
        [row] = sink.requests
        assert 0 < row["tokens_after_disconnect"] < 50
        assert row["upstream_closed_ts_ms"] - row["disconnect_ts_ms"] < 2000
        json.dumps(row)

    asyncio.run(scenario())
