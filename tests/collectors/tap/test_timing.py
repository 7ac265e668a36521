"""Chunk times that belong to the bytes: a late tap must not pass its lateness off as jitter.

The engine stand-in runs on its own thread (:class:`PacedEngine`), so blocking the tap's
event loop with a synchronous sleep delays the tap's reads but not the engine's schedule.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from collectors.tap.health import CgroupThrottling
from collectors.tap.stamped import kernel_stamps_available
from collectors.tap.timing import TimingGuard
from pipeline.store import Store
from slo.budget import WindowCounts
from slo.evaluate import evaluate
from slo.rollups.counts import Rollup
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.collectors.tap.fakes import CHAT, PacedEngine, post, tap_over
from tests.slo.factories import insert

BOUND_S = 0.005  # tap.timing_bound_s's default: the error bound the README states

needs_stamps = pytest.mark.skipif(
    not kernel_stamps_available(), reason="SO_TIMESTAMPNS is Linux-only"
)


def token_send_times(engine: PacedEngine, request: int, tokens: int) -> list[tuple[float, float]]:
    """(before, after) sendall of each token event (event 0 is the role chunk)."""
    return engine.sent[request][1 : tokens + 1]


async def block_loop_repeatedly(block_s: float, every_s: float) -> None:
    """The tap's loop, blocked by a synchronous sleep again and again (a CPU hog's slice)."""
    while True:
        await asyncio.sleep(every_s)
        time.sleep(block_s)


@needs_stamps
def test_recorded_gaps_follow_the_engines_schedule_while_the_loop_is_blocked() -> None:
    """25 ms blocks of the tap's loop, between chunks 60 ms apart: each read comes up to
    25 ms late, yet every recorded gap is the engine's within the stated bound."""
    tokens = 12
    engine = PacedEngine(tokens, [0.05] + [0.06] * (tokens + 2))

    async def scenario() -> dict[str, Any]:
        async with tap_over([engine.url]) as (url, sink, _proxy):
            blocker = asyncio.create_task(block_loop_repeatedly(0.025, every_s=0.017))
            try:
                status, _, error = await post(url, CHAT)
            finally:
                blocker.cancel()
            assert status == 200 and error is None
            [row] = sink.requests
            return row

    try:
        row = asyncio.run(scenario())
    finally:
        engine.close()
    sent = token_send_times(engine, 0, tokens)
    assert row["token_chunks"] == tokens and len(row["itl_gaps_s"]) == tokens - 1
    assert row["read_lag_max_s"] >= 0.01, "the blocks did make the tap read late"
    for k, recorded in enumerate(row["itl_gaps_s"]):
        (b0, a0), (b1, a1) = sent[k], sent[k + 1]
        slack = (a0 - b0) + (a1 - b1)  # the kernel's stamp lies within each sendall
        assert abs(recorded - (b1 - b0)) <= BOUND_S + slack, (k, recorded, b1 - b0)
    assert row["timing_uncertain"] is False


def jitter_model() -> Any:
    spec = {
        "version": "llmslo/v1",
        "service": "svc",
        "slos": [
            {
                "name": "jit",
                "objective": 0.99,
                "sli": {
                    "kind": "latency",
                    "metric": "itl",
                    "statistic": "jitter",
                    "threshold_s": 0.03,
                },
            }
        ],
    }
    return build_model(parse_spec(spec))


def test_a_request_read_through_a_long_stall_is_flagged_and_no_jitter_event(
    store: Store,
) -> None:
    """A 150 ms stall of the tap's loop while 10 ms chunks arrive: they are read as one
    burst, so the record's gaps are the tap's (a 150 ms gap then zeros), not the engine's.
    The record says so and the jitter SLI leaves it out; a request read on time counts."""
    tokens = 30
    stalled = PacedEngine(tokens, [0.02] + [0.01] * (tokens + 2))
    steady = PacedEngine(12, [0.02] + [0.06] * 14)

    async def scenario() -> list[dict[str, Any]]:
        async with tap_over([stalled.url]) as (url, sink, _proxy):
            request = asyncio.create_task(post(url, CHAT))
            await asyncio.sleep(0.12)  # a few tokens in
            time.sleep(0.15)  # the stall: the tap descheduled, a long GC pause
            assert (await request)[0] == 200
            rows = list(sink.requests)
        async with tap_over([steady.url]) as (url, sink, _proxy):
            assert (await post(url, CHAT))[0] == 200
            rows += sink.requests
        return rows

    try:
        late, on_time = asyncio.run(scenario())
    finally:
        stalled.close()
        steady.close()
    assert late["outcome"] == "ok" and late["itl_max_s"] >= 0.1  # the gaps show the stall
    assert late["timing_uncertain"] is True
    assert on_time["timing_uncertain"] is False
    insert(store, requests=[late, on_time])
    model = jitter_model()
    now_ms = max(late["received_ts_ms"], on_time["received_ts_ms"]) + 1
    Rollup(store.con, model, horizon_ms=86_400_000).update(now_ms)
    [status] = evaluate(store.con, model, now_ms)
    assert status.period == WindowCounts(1, 0), "only the request read on time is an event"


# ---------------------------------------------------------------- TimingGuard, pure logic
def no_stalls(start_s: float, end_s: float) -> float:
    return 0.0


def test_single_chunk_reads_stay_certain_however_late_the_read() -> None:
    guard = TimingGuard(BOUND_S, stamped=True)
    for k in range(10):
        guard.on_read(arrival_s=k * 0.05, lag_s=0.04, token_chunks=k + 1, before=k)
    assert not guard.uncertain(no_stalls) and guard.max_lag_s == pytest.approx(0.04)


def test_a_burst_read_late_is_uncertain() -> None:
    guard = TimingGuard(BOUND_S, stamped=True)
    guard.on_read(arrival_s=0.0, lag_s=0.0, token_chunks=1, before=0)
    guard.on_read(arrival_s=0.1, lag_s=0.03, token_chunks=4, before=1)
    assert guard.uncertain(no_stalls) and guard.reason == "burst"


def test_a_burst_read_on_time_is_the_engines_unless_a_stall_hid_its_first_chunks() -> None:
    def build() -> TimingGuard:
        guard = TimingGuard(BOUND_S, stamped=True)
        guard.on_read(arrival_s=0.0, lag_s=0.0, token_chunks=1, before=0)
        # one read measured in two calls (two HTTP chunks), 0.1 ms after its newest byte
        guard.on_read(arrival_s=0.1, lag_s=0.0001, token_chunks=2, before=1)
        guard.on_read(arrival_s=0.1, lag_s=0.0001, token_chunks=3, before=2)
        return guard

    assert not build().uncertain(no_stalls)
    assert build().uncertain(lambda start, end: 0.05 if start <= 0.06 <= end else 0.0)


def test_without_kernel_stamps_a_stall_during_the_tokens_is_uncertain() -> None:
    guard = TimingGuard(BOUND_S, stamped=False)
    for k in range(5):
        guard.on_read(arrival_s=1.0 + k * 0.02, lag_s=0.0, token_chunks=k + 1, before=k)
    assert not guard.uncertain(lambda start, end: 0.05 if end < 1.0 else 0.0)  # before: TTFT's
    assert guard.uncertain(lambda start, end: 0.02 if start <= 1.05 <= end else 0.0)
    assert guard.reason == "stall"


# ---------------------------------------------------------------- the tap's own health
def test_the_taps_loop_lag_and_gc_pauses_are_on_its_metrics() -> None:
    engine = PacedEngine(3, [0.0] * 6)

    async def scenario() -> tuple[str, list[dict[str, Any]]]:
        async with tap_over([engine.url], loop_lag_interval_s=0.005) as (_url, sink, proxy):
            await asyncio.sleep(0.05)
            time.sleep(0.03)  # the loop late by 30 ms: the monitor's next tick says so
            await asyncio.sleep(0.02)
            gc.collect()
            proxy.publish_gauges()
            text = generate_latest(proxy.metrics.registry).decode()
            stall = proxy.health.stall_within(0.0, time.perf_counter())
            assert stall >= 0.025
            return text, list(sink.samples)

    try:
        text, samples = asyncio.run(scenario())
    finally:
        engine.close()
    lag_count = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('llmslo_tap_loop_lag_seconds_bucket{le="+Inf"}')
    )
    assert lag_count >= 5
    assert 'llmslo_tap_loop_lag_seconds_bucket{le="0.02"}' in text
    assert 'llmslo_tap_gc_pause_seconds_count{generation="2"} 1.0' in text
    lag = {s["signal"]: s["value"] for s in samples if s["signal"] == "tap_loop_lag_max"}
    assert lag["tap_loop_lag_max"] >= 0.025  # stored beside the tap's gauges


def test_cgroup_cpu_throttling_is_read_from_cpu_stat(tmp_path: Path) -> None:
    v2 = tmp_path / "cpu.stat"
    v2.write_text("usage_usec 100\nnr_periods 50\nnr_throttled 7\nthrottled_usec 250000\n")
    assert CgroupThrottling((tmp_path / "absent", v2)).read() == (7, 0.25)
    v1 = tmp_path / "v1.stat"
    v1.write_text("nr_periods 50\nnr_throttled 3\nthrottled_time 2000000000\n")
    assert CgroupThrottling((v1,)).read() == (3, 2.0)
    assert CgroupThrottling((tmp_path / "absent",)).read() is None
    names = {m.name for m in CgroupThrottling((v2,)).collect()}
    assert names == {"llmslo_tap_cpu_throttled_periods", "llmslo_tap_cpu_throttled_seconds"}
