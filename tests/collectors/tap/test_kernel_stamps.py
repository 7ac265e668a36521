"""With kernel receive stamps a chunk the loop read late is still timed when it reached the
socket: a loop blocked across every few chunks' arrival leaves the recorded gaps on the
engine's schedule within the record's bound, where the loop-lag fallback can only leave
those gaps out. Bytes the kernel coalesced into one read share its stamp and are not
vouched for.

The engine is ``PacedEngine`` (a thread of this process, sending a chunk every 20 ms); the
blocks are synchronous sleeps injected into the tap's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from collectors.tap.rxstamp import kernel_stamps_available
from tests.collectors.tap.fakes import CHAT, post, tap_over
from tests.collectors.tap.test_loop_lag import LOOPS, TOKENS, PacedEngine, _run

pytestmark = pytest.mark.skipif(
    not kernel_stamps_available(), reason="no SO_TIMESTAMPNS on this platform"
)

#: every third token chunk, the loop is blocked from 12 ms after a send for 18 ms: the next
#: chunk (due at 20 ms) is read ~10 ms late, and still has a read of its own
BLOCK_EVERY, BLOCK_AFTER_S, BLOCK_S = 3, 0.012, 0.018


def _blocked_run(factory: str, *, kernel: bool) -> tuple[dict, list[float], list[float], float]:
    """The record, the engine's send notes and spreads, and the tap loop's largest lag."""

    async def scenario() -> tuple[dict, list[float], list[float], float]:
        loop = asyncio.get_running_loop()

        def on_sent(i: int) -> None:  # on the engine's thread, which then sleeps anyway
            if i % BLOCK_EVERY == 0 and i < TOKENS:
                time.sleep(BLOCK_AFTER_S)
                loop.call_soon_threadsafe(time.sleep, BLOCK_S)

        engine = PacedEngine(on_sent)
        try:
            async with tap_over([engine.url], kernel_timestamps=kernel, gap_error_max_s=0.005) as (
                url,
                sink,
                proxy,
            ):
                proxy.loop_watch.take_max_lag_s()
                status, _, error = await post(url, CHAT)
                assert (status, error) == (200, None)
                lag_s = proxy.loop_watch.take_max_lag_s()
        finally:
            engine.close()
        (row,) = sink.requests
        return row, engine.sent_s[0], engine.spread_s[0], lag_s

    return _run(factory, scenario())


def _gap_errors(row: dict[str, Any], sent: list[float]) -> list[float]:
    engine_gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert len(row["itl_gaps_s"]) == len(engine_gaps) == TOKENS - 1
    return [abs(g - e) for g, e in zip(row["itl_gaps_s"], engine_gaps, strict=True)]


@LOOPS
def test_chunks_read_late_keep_the_time_they_reached_the_socket(factory: str) -> None:
    row, sent, spread, lag_s = _blocked_run(factory, kernel=True)
    errors = _gap_errors(row, sent)
    if lag_s < BLOCK_S + 0.01:
        # each block held a chunk for ~10 ms, yet (nearly) every gap is vouched for:
        # the bound is the stamps' (the last token chunk shares a read with the finish,
        # usage and [DONE] events, so its bound is the loop's ~1-2 ms), not the block. (A
        # host that stalls this process for longer than the blocks coalesces more reads.)
        assert row["itl_count"] >= TOKENS - 1 - 4
    assert row["itl_uncertain"] is False
    assert row["itl_error_s"] <= 0.005
    # the recorded gaps follow the engine's schedule within the bound (plus the engine's
    # own note of each send, which is late by that send's spread when its thread waited)
    slack = row["itl_error_s"] + 2 * max(spread) + 0.0005
    assert sorted(errors)[row["itl_count"] - 1] <= slack


@LOOPS
def test_the_loop_lag_fallback_can_only_leave_those_gaps_out(factory: str) -> None:
    row, sent, _spread, _lag_s = _blocked_run(factory, kernel=False)
    errors = _gap_errors(row, sent)
    assert max(errors) > 0.005  # chunks read ~10 ms late, gaps as read off by that
    # the two gaps beside each late chunk are out of the summary (~2/3 of them), or too
    # few are left and the request is uncertain
    assert row["itl_uncertain"] is True or row["itl_count"] <= (TOKENS - 1) // 2


@LOOPS
def test_chunks_coalesced_into_one_read_are_not_vouched_for(factory: str) -> None:
    """A 200 ms block: the ~10 chunks sent meanwhile arrive before the loop reads again and
    the kernel hands them over in one read with one stamp. Their gaps as recorded are ~0;
    the record leaves them out rather than pretend."""

    async def scenario() -> tuple[dict, list[float], list[float]]:
        loop = asyncio.get_running_loop()

        def on_sent(i: int) -> None:
            if i == 5:
                loop.call_soon_threadsafe(time.sleep, 0.2)

        engine = PacedEngine(on_sent)
        try:
            async with tap_over([engine.url], gap_error_max_s=0.005) as (url, sink, _proxy):
                await post(url, CHAT)
        finally:
            engine.close()
        return sink.requests[0], engine.sent_s[0], engine.spread_s[0]

    row, sent, spread = _run(factory, scenario())
    errors = _gap_errors(row, sent)
    assert max(errors) > 0.1  # the gaps as read: one long, then several ~0
    assert row["itl_count"] <= TOKENS - 1 - 8  # those left out
    assert row["itl_uncertain"] is False and row["itl_error_s"] <= 0.005
    # the gaps kept are as close to the engine's as the bound says (the engine's own
    # note of a send is late by that send's spread when its thread waited)
    assert sorted(errors)[row["itl_count"] - 1] <= row["itl_error_s"] + 2 * max(spread)
