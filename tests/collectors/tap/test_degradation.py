"""The degradation decision (pure): levels per scope, L1–L3 actions, staleness, the estimate."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from collectors.tap import ListSink, TapConfig, TapProxy
from collectors.tap.degradation import (
    DegradationConfig,
    Degrader,
    FlagFollower,
    FlagPoll,
    FlagSnapshot,
    estimate_prompt_tokens,
)
from tests.collectors.tap.fakes import ScriptedUpstream, post, stream_script

POOL, ME, OTHER = "llama", "10.0.0.1:8000", "10.0.0.2:8000"
LONG = 16_384 * 4 + 4  # body bytes just over the 16K-token default
SHORT = 2_000


def degrader(levels: dict[tuple[str, str], int], heard_s: float | None = 0.0, **cfg: object):
    snapshot = FlagSnapshot(levels, heard_s, beat_s=0.0)
    return Degrader(DegradationConfig.model_validate(cfg), lambda: snapshot, lambda: 1.0)


@pytest.mark.parametrize(
    ("levels", "body", "max_tokens", "expected"),
    [
        ({}, LONG, 9999, (0, None, False, False)),
        ({("instance", ME): 1}, LONG, 9999, (1, "degradation_header", False, False)),
        ({("pool", POOL): 2}, SHORT, 100, (2, "degradation_header", False, False)),
        ({("pool", POOL): 2}, LONG, 100, (2, "rejected_long_prompt", True, False)),
        ({("instance", ME): 2}, SHORT, 4097, (2, "rejected_max_tokens", True, False)),
        ({("instance", ME): 3}, LONG, None, (3, "rejected_long_prompt", True, False)),
        ({("instance", ME): 3}, SHORT, None, (3, "degradation_header", False, False)),
        ({("instance", OTHER): 3, ("pool", "other-pool"): 3}, LONG, None, (0, None, False, False)),
    ],
    ids=[
        "no flags: nothing",
        "L1 on my instance: header only, long prompts pass",
        "L2 on my pool: a short prompt passes with the header",
        "L2: a long prompt is rejected",
        "L2: max_tokens over the cap is rejected",
        "L3 without a fallback acts as L2: long prompt rejected",
        "L3 without a fallback acts as L2: short prompt passes",
        "levels of other instances and pools do not apply",
    ],
)
def test_actions_by_level(levels, body, max_tokens, expected) -> None:
    e = degrader(levels).enforce(POOL, [ME], body, max_tokens)
    assert (e.level, e.action, e.reject, e.fallback) == expected


def test_l3_with_a_fallback_routes_there() -> None:
    d = degrader({("pool", POOL): 3}, fallback_upstream="http://10.0.0.9:8000/")
    e = d.enforce(POOL, [ME], LONG, 99_999)
    assert (e.level, e.action, e.fallback, e.reject) == (3, "fallback_upstream", True, False)


@pytest.mark.parametrize("heard_s", [None, 1.0 - 60.5], ids=["never heard", "heard 60.5 s ago"])
def test_stale_flags_fail_open(heard_s: float | None) -> None:
    e = degrader({("pool", POOL): 2}, heard_s=heard_s).enforce(POOL, [ME], LONG, 99_999)
    assert (e.level, e.action, e.reject) == (None, "fail_open", False)


class Never:
    """A flags source that never brings anything."""

    def poll(self, timeout_s: float) -> FlagPoll:
        return FlagPoll()

    def close(self) -> None:
        pass


def test_follower_keeps_the_latest_transition_per_scope() -> None:
    follower = FlagFollower(Never())
    follower.apply(
        FlagPoll(
            [
                {"scope": "instance", "scope_id": ME, "ts_ms": 2, "to_level": 2},
                {"scope": "instance", "scope_id": ME, "ts_ms": 1, "to_level": 3},  # older, late
                {"scope": "pool", "scope_id": POOL, "ts_ms": 5, "to_level": 1},
            ],
            [{"ts_ms": 7_000, "interval_s": 15.0}],
        ),
        heard_s=7.0,
        wall_s=7.0,
    )
    snap = follower.current()
    assert snap.levels == {("instance", ME): 2, ("pool", POOL): 1} and snap.heard_s == 7.0
    assert snap.level(POOL, [ME], now_s=8.0, staleness_s=60) == 2


def test_prompt_estimate_from_body_bytes() -> None:
    assert estimate_prompt_tokens(65_536, 4.0) == 16_384
    assert estimate_prompt_tokens(65_537, 4.0) == 16_385


def test_fallback_must_be_a_url() -> None:
    with pytest.raises(ValueError, match="fallback_upstream"):
        DegradationConfig(fallback_upstream="10.0.0.9:8000")


# ---- through a real tap on loopback, with a fixed snapshot (the follower is tested e2e)
def flagged(levels: dict[tuple[str, str], int]):
    fresh_s = time.perf_counter() + 3600  # fresh for the whole test
    snapshot = FlagSnapshot(levels, fresh_s, beat_s=fresh_s)
    return lambda: snapshot


def test_l1_forwards_the_header_upstream_and_counts_it() -> None:
    async def scenario() -> None:
        upstream = ScriptedUpstream(lambda _: stream_script(3))
        url = await upstream.start()
        instance = url.removeprefix("http://")
        config = TapConfig(listen="127.0.0.1:0", upstreams=[url], kafka=False, pool=POOL)
        sink = ListSink()
        proxy = TapProxy(config, sink, flags=flagged({("instance", instance): 1}))
        port = await proxy.start()
        try:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            spoofed = {"x-llmslo-degradation": "L0"}
            status, _, _ = await post(f"http://127.0.0.1:{port}", body, headers=spoofed)
            long_body = {**body, "messages": [{"role": "user", "content": "y" * LONG}]}
            long_status, _, _ = await post(f"http://127.0.0.1:{port}", long_body)
        finally:
            await proxy.stop()
            await upstream.stop()
        assert (status, long_status) == (200, 200)  # L1 sheds nothing
        assert [h.getall("x-llmslo-degradation") for h in upstream.headers] == [["L1"], ["L1"]]
        assert [(r["degradation_level"], r["enforced_action"]) for r in sink.requests] == [
            (1, "degradation_header")
        ] * 2
        counted = proxy.metrics.degradation_actions.labels("L1", "degradation_header")
        assert counted._value.get() == 2

    asyncio.run(scenario())


def test_an_l2_rejection_never_reaches_the_engine() -> None:
    async def scenario() -> None:
        upstream = ScriptedUpstream(lambda _: stream_script(3))
        url = await upstream.start()
        config = TapConfig(listen="127.0.0.1:0", upstreams=[url], kafka=False, pool=POOL)
        sink = ListSink()
        proxy = TapProxy(config, sink, flags=flagged({("pool", POOL): 2}))
        port = await proxy.start()
        try:
            body = {
                "model": "m",
                "stream": True,
                "messages": [{"role": "user", "content": "y" * LONG}],
            }
            status, answer, _ = await post(f"http://127.0.0.1:{port}", body)
        finally:
            await proxy.stop()
            await upstream.stop()
        assert status == 429 and b"degraded" in answer
        assert upstream.requests == []
        [row] = sink.requests
        assert (row["outcome"], row["http_status"], row["upstream_status"]) == (
            "rejected",
            429,
            None,
        )
        assert row["error_kind"] == row["enforced_action"] == "rejected_long_prompt"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("beat_s", "interval_s", "expected"),
    [
        (None, None, None),
        (1.0 - 60.5, 15.0, None),
        (1.0 - 59.0, 15.0, 2),
        (1.0 - 150.0, 60.0, 2),
        (1.0 - 181.0, 60.0, None),
    ],
    ids=[
        "broker reachable but no jobs heartbeat ever: fail open",
        "jobs heartbeat 60.5 s old: fail open",
        "jobs heartbeat 59 s old: the level applies",
        "a 60 s jobs interval is allowed three intervals",
        "and not more",
    ],
)
def test_without_a_recent_jobs_heartbeat_the_tap_fails_open(
    beat_s: float | None, interval_s: float | None, expected: int | None
) -> None:
    snapshot = FlagSnapshot({("pool", POOL): 2}, heard_s=1.0, beat_s=beat_s, interval_s=interval_s)
    d = Degrader(DegradationConfig(), lambda: snapshot, lambda: 1.0)
    e = d.enforce(POOL, [ME], SHORT, None)
    assert e.level == expected
    assert e.action == ("fail_open" if expected is None else "degradation_header")


def test_replayed_old_heartbeats_do_not_make_the_flags_fresh() -> None:
    """A tap that starts reads the topic from its beginning: heartbeats of jobs that died an
    hour ago arrive now, but are as old as their wall-clock time says."""
    follower = FlagFollower(Never(), staleness_s=60.0)
    level_2: list[Mapping[str, Any]] = [
        {"scope": "pool", "scope_id": POOL, "ts_ms": 1, "to_level": 2}
    ]
    follower.apply(FlagPoll(level_2, [{"ts_ms": 1_000_000, "interval_s": 15.0}]), 500.0, 4_600.0)
    assert follower.current().level(POOL, [ME], 500.0, 60.0) is None
    assert follower.judge(500.0) == "heartbeat_old"
    follower.apply(FlagPoll([], [{"ts_ms": 4_600_000, "interval_s": 15.0}]), 501.0, 4_601.0)
    assert follower.current().level(POOL, [ME], 501.0, 60.0) == 2


def test_staleness_is_exported_and_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    follower = FlagFollower(Never(), staleness_s=3.0, registry=registry)
    level_2: list[Mapping[str, Any]] = [
        {"scope": "pool", "scope_id": POOL, "ts_ms": 1, "to_level": 2}
    ]

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    with caplog.at_level(logging.INFO, logger="collectors.tap.degradation"):
        follower.apply(FlagPoll(level_2, [{"ts_ms": 10_000, "interval_s": 0.5}]), 10.0, 10.0)
        assert follower.judge(10.5) is None
        assert value("llmslo_tap_flags_stale", reason="heartbeat_old") == 0
        for now_s in (13.6, 14.0, 20.0):  # the jobs went silent at 10 s, the broker did not
            follower.apply(FlagPoll(), now_s, now_s)
            assert follower.judge(now_s) == "heartbeat_old"
        assert value("llmslo_tap_flags_stale", reason="heartbeat_old") == 1
        assert value("llmslo_tap_flags_stale_transitions_total", reason="heartbeat_old") == 1
        assert value("llmslo_tap_flags_heartbeat_age_seconds") == 10.0
        follower.apply(FlagPoll([], [{"ts_ms": 21_000, "interval_s": 0.5}]), 21.0, 21.0)
        assert follower.judge(21.0) is None  # heartbeats resume: levels apply again
        assert follower.current().level(POOL, [ME], 21.0, 3.0) == 2
    assert value("llmslo_tap_flags_stale", reason="heartbeat_old") == 0
    stale_logs = [r for r in caplog.records if "flags stale" in r.getMessage()]
    fresh_logs = [r for r in caplog.records if "flags fresh again" in r.getMessage()]
    assert (len(stale_logs), len(fresh_logs)) == (1, 1)
