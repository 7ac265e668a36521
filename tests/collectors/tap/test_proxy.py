"""The tap as a proxy, against a scripted engine on loopback: bytes, records, pass-through."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

from collectors.tap.sinks import rows_to_table
from pipeline.schema import REQUEST_RECORDS
from tests.collectors.tap.fakes import CHAT, Script, ScriptedUpstream, post, stream_script, tap_over


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    "stream_options",
    [None, {"include_usage": False}, {"include_usage": False, "continuous_usage_stats": False}],
    ids=[
        "client sent no stream_options",
        "client said include_usage false",
        "client sent other options",
    ],
)
def test_client_that_did_not_ask_for_usage_gets_the_engines_exact_bytes(
    stream_options: dict | None,
) -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(6, gap_s=0.002))
        body = {
            **CHAT,
            **({"stream_options": stream_options} if stream_options is not None else {}),
        }
        async with tap_over([up]) as (url, sink, _):
            status, via_tap, error = await post(url, body)
            _, direct, _ = await post(up.url, body)
        assert (status, error) == (200, None)
        assert via_tap == direct and b'"usage"' not in via_tap
        sent_upstream = up.requests[0]["stream_options"]
        assert sent_upstream["include_usage"] is True
        assert {k: v for k, v in sent_upstream.items() if k != "include_usage"} == {
            k: v for k, v in (stream_options or {}).items() if k != "include_usage"
        }
        [row] = sink.requests
        assert (row["completion_tokens"], row["prompt_tokens"], row["token_chunks"]) == (6, 7, 6)
        assert row["tpot_s"] is not None and row["outcome"] == "ok" and row["http_status"] == 200

    run(scenario())


def test_client_that_asked_for_usage_keeps_its_usage_chunk() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(3))
        body = {**CHAT, "stream_options": {"include_usage": True}}
        async with tap_over([up]) as (url, sink, _):
            _, via_tap, _ = await post(url, body)
            _, direct, _ = await post(up.url, body)
        assert via_tap == direct and b'"usage"' in via_tap
        assert sink.requests[0]["completion_tokens"] == 3

    run(scenario())


def test_record_fills_every_column_of_the_schema() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(4, gap_s=0.01, first_s=0.05))
        headers = {"x-tenant-id": "acme", "x-request-id": "req-42", "x-request-timeout-ms": "60000"}
        async with tap_over([up], tenants=["acme"], models=["m"]) as (url, sink, _):
            await post(url, CHAT, headers=headers)
        [row] = sink.requests
        assert set(row) == set(REQUEST_RECORDS.arrow.names)
        rows_to_table(REQUEST_RECORDS, [row])  # the row has the schema's types
        assert row["request_id"] == row["original_request_id"] == "req-42" and row["attempt"] == 1
        assert up.headers[0]["x-request-id"] == "req-42"
        assert row["tenant"] == "acme" and row["model"] == "m" and row["pool"] == "m"
        assert row["instance"] == up.url.removeprefix("http://")
        assert row["route"] == "/v1/chat/completions" and row["streamed"] is True
        assert row["deadline_ts_ms"] - row["received_ts_ms"] == pytest.approx(60_000, abs=5)
        assert 0 < row["ttfb_s"] <= row["ttft_s"] < row["e2e_s"]
        assert row["ttft_s"] >= 0.05
        assert len(row["itl_gaps_s"]) == 3 and all(g >= 0.009 for g in row["itl_gaps_s"])
        assert row["itl_max_s"] >= row["itl_p99_s"] >= min(row["itl_gaps_s"])
        assert row["chunk_tokens"] == [1, 1, 1, 1] and row["finish_reason"] == "stop"
        assert row["client_disconnected"] is False and row["disconnect_ts_ms"] is None
        assert row["upstream_closed_ts_ms"] >= row["received_ts_ms"]
        assert 0 < int(up.headers[0]["x-request-timeout-ms"]) <= 60_000

    run(scenario())


def test_non_streamed_request_is_forwarded_exactly_and_measured() -> None:
    payload = {
        "id": "c",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": "hello"},
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 11, "total_tokens": 16},
    }
    raw = json.dumps(payload).encode()

    async def scenario() -> None:
        up = ScriptedUpstream(
            lambda req: Script(
                [(0.0, raw[:10]), (0.01, raw[10:])], headers={"Content-Type": "application/json"}
            )
        )
        async with tap_over([up]) as (url, sink, _):
            status, body, _ = await post(url, {**CHAT, "stream": False})
        assert status == 200 and body == raw
        assert "stream_options" not in up.requests[0]
        [row] = sink.requests
        assert row["streamed"] is False and row["ttft_s"] is None and row["tpot_s"] is None
        assert (row["completion_tokens"], row["finish_reason"], row["outcome"]) == (
            11,
            "length",
            "ok",
        )
        assert row["e2e_s"] >= row["ttfb_s"] > 0

    run(scenario())


def test_completions_route_is_measured_too() -> None:
    def script(req: dict) -> Script:
        head = '{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,'
        events = [
            f'data: {head}"text":"w{i}","finish_reason":null}}]}}\n\n'.encode() for i in range(3)
        ]
        return Script([(0.0, e) for e in events] + [(0.0, b"data: [DONE]\n\n")])

    async def scenario() -> None:
        up = ScriptedUpstream(script)
        async with tap_over([up]) as (url, sink, _):
            status, _, _ = await post(
                url, {"model": "m", "prompt": "p", "stream": True}, route="/v1/completions"
            )
        [row] = sink.requests
        assert status == 200 and row["route"] == "/v1/completions"
        assert row["token_chunks"] == 3 and row["outcome"] == "ok"

    run(scenario())


def test_other_paths_pass_through_untouched_and_unrecorded() -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: Script())
        async with (
            tap_over([up]) as (url, sink, _),
            aiohttp.ClientSession() as session,
            session.get(url + "/v1/models?limit=2") as resp,
        ):
            body = await resp.json()
            assert resp.status == 200 and resp.headers["X-Up"] == "1"
        assert body == {"path": "/v1/models", "query": "limit=2"}
        assert sink.requests == []

    run(scenario())


def test_prompt_completion_and_authorization_never_reach_records_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([up]) as (url, sink, _):
            await post(url, CHAT, headers={"Authorization": "Bearer sk-very-secret"})
            await post(url, b"not json at all", headers={"Authorization": "Bearer sk-very-secret"})
        assert up.headers[0]["Authorization"] == "Bearer sk-very-secret"  # forwarded, not logged
        text = json.dumps(sink.requests)
        assert "secret prompt" not in text and "t1 " not in text and "sk-very" not in text

    with caplog.at_level(logging.DEBUG):
        run(scenario())
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "secret prompt" not in logged and "sk-very-secret" not in logged and "t1 " not in logged


def test_the_first_token_leaves_in_the_callback_that_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No task hand-off before the first token's write: a handler task would only run after
    every other stream's chunks read in the same loop iteration (added TTFT under load)."""
    from collectors.tap.downstream import Downstream
    from collectors.tap.upstream import _Connection

    log: list[tuple[str, bytes]] = []
    read, send = _Connection.data_received, Downstream._send

    def logged_read(conn: _Connection, data: bytes) -> None:
        log.append(("read", data))
        read(conn, data)
        log.append(("read done", b""))

    def logged_send(down: Downstream, *parts: bytes) -> None:
        log.append(("write", b"".join(parts)))
        send(down, *parts)

    monkeypatch.setattr(_Connection, "data_received", logged_read)
    monkeypatch.setattr(Downstream, "_send", logged_send)

    async def scenario() -> None:
        # the head and the role chunk first, the first token 50 ms later (its own read)
        up = ScriptedUpstream(lambda req: stream_script(3, gap_s=0.05))
        async with tap_over([up]) as (url, sink, _):
            status, body, error = await post(url, CHAT)
        assert (status, error) == (200, None) and b'"content":"t0 "' in body
        assert sink.requests[0]["outcome"] == "ok"

    run(scenario())
    first_write = next(
        i for i, (kind, data) in enumerate(log) if kind == "write" and b'"t0 "' in data
    )
    kind, data = log[first_write - 1]
    assert kind == "read" and b'"t0 "' in data  # written before that read's callback returned
