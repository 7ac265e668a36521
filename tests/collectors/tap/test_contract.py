"""The request contract (seeds S4): retries only before the first token, deadlines, budgets."""

from __future__ import annotations

import asyncio
import json

import pytest

from collectors.tap.contract import RetryBudget, UpstreamPool, parse_deadline_s
from pipeline.broker import free_port
from tests.collectors.tap.fakes import (
    CHAT,
    Script,
    ScriptedUpstream,
    chat_events,
    post,
    stream_script,
    tap_over,
)


def run(coro):
    return asyncio.run(coro)


def rejecting(status: int) -> ScriptedUpstream:
    body = json.dumps({"error": {"message": "busy", "code": status}}).encode()
    return ScriptedUpstream(
        lambda req: Script(
            [(0.0, body)], status=status, headers={"Content-Type": "application/json"}
        )
    )


def test_rejection_before_any_work_is_retried_on_the_other_upstream() -> None:
    async def scenario() -> None:
        bad, good = rejecting(503), ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([bad, good]) as (url, sink, _):
            status, body, _ = await post(url, CHAT, headers={"x-request-id": "r1"})
        assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b"busy" not in body
        first, second = sink.requests
        assert (first["outcome"], first["attempt"], first["http_status"]) == ("rejected", 1, None)
        assert first["error_kind"] == "http_503" and first["e2e_s"] is None
        assert (second["outcome"], second["attempt"], second["http_status"]) == ("ok", 2, 200)
        assert second["original_request_id"] == first["request_id"] == "r1"
        assert second["request_id"] == "r1.2" and good.headers[0]["x-request-id"] == "r1.2"
        assert first["instance"] != second["instance"]

    run(scenario())


def test_when_every_attempt_is_rejected_the_client_gets_the_engines_answer() -> None:
    async def scenario() -> None:
        async with tap_over([rejecting(429), rejecting(429)], max_attempts=2) as (url, sink, _):
            status, body, _ = await post(url, CHAT)
        assert status == 429 and b"busy" in body
        assert [r["outcome"] for r in sink.requests] == ["rejected", "rejected"]
        assert [r["http_status"] for r in sink.requests] == [None, 429]

    run(scenario())


def test_error_before_first_token_is_retried_invisibly_even_after_the_role_chunk() -> None:
    role_then_cut = Script(
        [(0.0, chat_events(0, usage=False, done=False, finish=None)[0])], end="reset"
    )

    async def scenario() -> None:
        bad, good = (
            ScriptedUpstream(lambda req: role_then_cut),
            ScriptedUpstream(lambda req: stream_script(2)),
        )
        async with tap_over([bad, good]) as (url, sink, _):
            status, body, error = await post(url, CHAT)
            _, direct, _ = await post(good.url, CHAT)
        assert (status, error) == (200, None) and body == direct  # one role chunk, not two
        assert [r["outcome"] for r in sink.requests] == ["error_before_first_token", "ok"]
        assert sink.requests[0]["ttfb_s"] is not None and sink.requests[0]["ttft_s"] is None

    run(scenario())


def test_failure_after_first_token_is_never_replayed_and_cuts_the_stream() -> None:
    events = chat_events(5, usage=False, done=False, finish=None)[:3]  # role + 2 tokens

    async def scenario() -> None:
        cut = ScriptedUpstream(lambda req: Script([(0.0, e) for e in events], end="reset"))
        other = ScriptedUpstream(lambda req: stream_script(2))
        async with tap_over([cut, other]) as (url, sink, _):
            status, body, error = await post(url, CHAT)
        assert status == 200 and error == "ClientPayloadError" and body == b"".join(events)
        [row] = sink.requests
        assert row["outcome"] == "interrupted_after_first_token" and row["token_chunks"] == 2
        assert other.requests == []

    run(scenario())


def test_connection_refused_is_an_error_before_first_token_and_retried() -> None:
    async def scenario() -> None:
        good = ScriptedUpstream(lambda req: stream_script(1))
        dead = f"http://127.0.0.1:{free_port()}"
        async with tap_over([dead, good]) as (url, sink, _):
            status, _, _ = await post(url, CHAT)
        assert status == 200
        assert [(r["outcome"], r["error_kind"]) for r in sink.requests] == [
            ("error_before_first_token", "connect_failed"),
            ("ok", None),
        ]

    run(scenario())


def test_single_dead_upstream_gives_a_502_json_error() -> None:
    async def scenario() -> None:
        async with tap_over([f"http://127.0.0.1:{free_port()}"], max_attempts=1) as (url, sink, _):
            status, body, _ = await post(url, CHAT)
        assert status == 502 and json.loads(body)["error"]["type"] == "error_before_first_token"
        assert sink.requests[0]["http_status"] == 502

    run(scenario())


def test_exhausted_retry_budget_stops_retries() -> None:
    async def scenario() -> None:
        async with tap_over(
            [rejecting(503), rejecting(503)],
            max_attempts=3,
            retry_budget_ratio=0.0,
            retry_budget_min_per_s=0.0,
        ) as (url, sink, proxy):
            proxy.budget._tokens = 0.0
            await post(url, CHAT)
            await post(url, CHAT)
        assert [r["attempt"] for r in sink.requests] == [1, 1]

    run(scenario())


def test_deadline_before_first_token_answers_504_and_cancels_upstream() -> None:
    async def scenario() -> None:
        stalled = ScriptedUpstream(lambda req: Script([], end="stall"))
        async with tap_over([stalled]) as (url, sink, _):
            status, body, _ = await post(url, CHAT, headers={"x-request-timeout-ms": "300"})
            await asyncio.sleep(0.2)
        assert status == 504 and b"deadline" in body
        [row] = sink.requests
        assert row["outcome"] == "deadline_exceeded" and row["http_status"] == 504
        assert row["upstream_closed_ts_ms"] - row["received_ts_ms"] >= 250
        assert stalled.closed_by_peer, "the engine saw the cancellation"

    run(scenario())


def test_deadline_after_first_token_cuts_the_stream() -> None:
    async def scenario() -> None:
        slow = ScriptedUpstream(lambda req: stream_script(50, gap_s=0.05))
        async with tap_over([slow], default_timeout_s=0.4) as (url, sink, _):
            status, body, error = await post(url, CHAT)
        assert status == 200 and error == "ClientPayloadError" and b"[DONE]" not in body
        [row] = sink.requests
        assert row["outcome"] == "deadline_exceeded" and row["ttft_s"] is not None
        assert 0 < row["token_chunks"] < 50

    run(scenario())


def test_already_expired_deadline_is_refused_without_contacting_the_engine() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(1))
        async with tap_over([up]) as (url, sink, _):
            status, _, _ = await post(url, CHAT, headers={"x-request-deadline": "1000"})
        assert status == 504 and up.requests == []
        assert sink.requests[0]["outcome"] == "deadline_exceeded"

    run(scenario())


def test_stalled_upstream_is_an_upstream_timeout() -> None:
    async def scenario() -> None:
        stalled = ScriptedUpstream(lambda req: Script([], end="stall"))
        async with tap_over([stalled], read_timeout_s=0.3, max_attempts=1) as (url, sink, _):
            status, _, _ = await post(url, CHAT)
        assert status == 504
        assert sink.requests[0]["outcome"] == "upstream_timeout"

    run(scenario())


NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"x-request-timeout-ms": "2500"}, NOW + 2.5),
        ({"x-request-deadline": str(NOW + 5)}, NOW + 5),
        ({"x-request-deadline": str(int((NOW + 4.5) * 1000))}, NOW + 4.5),
        ({"x-request-deadline": str(NOW + 10), "x-request-timeout-ms": "3000"}, NOW + 3),
        ({"x-request-timeout-ms": "soon"}, None),
        ({"x-request-timeout-ms": "nan"}, None),
        ({"x-request-timeout-ms": "1e400"}, None),
    ],
    ids=[
        "none",
        "relative ms",
        "absolute s",
        "absolute ms",
        "earliest wins",
        "garbage ignored",
        "nan ignored",
        "overflow ignored",
    ],
)
def test_deadline_headers(headers: dict[str, str], expected: float | None) -> None:
    deadline, problem = parse_deadline_s(
        headers,
        now_wall_s=NOW,
        deadline_header="x-request-deadline",
        timeout_header="x-request-timeout-ms",
        default_timeout_s=None,
    )
    assert deadline == (pytest.approx(expected, abs=1e-3) if expected is not None else None)
    assert (problem is not None) == (expected is None and bool(headers))


def test_default_timeout_applies_when_client_sends_none() -> None:
    deadline, _ = parse_deadline_s(
        {}, now_wall_s=50.0, deadline_header="a", timeout_header="b", default_timeout_s=7.0
    )
    assert deadline == 57.0


def test_retry_budget_is_a_fraction_of_traffic_plus_a_trickle() -> None:
    budget = RetryBudget(ratio=0.1, min_per_s=0.0, capacity=5.0)
    budget._tokens = 0.0
    for _ in range(30):
        budget.deposit(0.0)
    assert sum(budget.try_withdraw(0.0) for _ in range(10)) == 3
    trickle = RetryBudget(ratio=0.0, min_per_s=2.0, capacity=5.0)
    trickle._tokens = 0.0
    trickle.try_withdraw(0.0)
    assert trickle.try_withdraw(10.0)  # refilled, capped at capacity
    assert sum(trickle.try_withdraw(10.0) for _ in range(10)) == 4


def test_pool_prefers_an_untried_upstream() -> None:
    pool = UpstreamPool(["http://a:1", "http://b:2", "http://c"])
    assert [u.instance for u in pool.upstreams] == ["a:1", "b:2", "c:80"]
    for _ in range(5):
        assert pool.pick({"a:1", "b:2"}).instance == "c:80"
    assert pool.pick({"a:1", "b:2", "c:80"}).instance in {"a:1", "b:2", "c:80"}
