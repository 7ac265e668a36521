"""Retried attempts are recorded with what the upstream answered (``upstream_status``;
``http_status`` stays what the client got), and a non-SSE answer to a
streamed request reaches the client as a complete response."""

from __future__ import annotations

import asyncio
import json

from tests.collectors.tap.fakes import CHAT, Script, ScriptedUpstream, post, stream_script, tap_over

HTML = b"<html><body>Please sign in</body></html>"


def run(coro):
    return asyncio.run(coro)


def answering(status: int, body: bytes, content_type: str) -> ScriptedUpstream:
    return ScriptedUpstream(
        lambda req: Script([(0.0, body)], status=status, headers={"Content-Type": content_type})
    )


def test_a_retried_500_is_recorded_with_its_status() -> None:
    async def scenario() -> None:
        error = json.dumps({"error": {"message": "boom", "code": 500}}).encode()
        bad = answering(500, error, "application/json")
        good = ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([bad, good]) as (url, sink, _):
            status, _, problem = await post(url, CHAT, headers={"x-request-id": "r1"})
        assert (status, problem) == (200, None)
        first, second = sink.requests
        assert (first["attempt"], first["upstream_status"], first["error_kind"]) == (
            1,
            500,
            "http_500",
        )
        assert first["http_status"] is None  # the client never saw this answer
        assert (second["attempt"], second["upstream_status"], second["http_status"]) == (
            2,
            200,
            200,
        )

    run(scenario())


def test_an_html_200_to_a_stream_is_retried_and_recorded_with_its_status() -> None:
    async def scenario() -> None:
        html = answering(200, HTML, "text/html; charset=utf-8")
        good = ScriptedUpstream(lambda req: stream_script(3))
        async with tap_over([html, good]) as (url, sink, _):
            status, body, problem = await post(url, CHAT, headers={"x-request-id": "r2"})
        assert (status, problem) == (200, None) and b"[DONE]" in body
        first, second = sink.requests
        assert (first["attempt"], first["upstream_status"], first["http_status"]) == (1, 200, None)
        assert (first["outcome"], first["error_kind"]) == (
            "error_before_first_token",
            "not_event_stream",
        )
        assert second["outcome"] == "ok"

    run(scenario())


def test_an_html_200_on_the_last_attempt_reaches_the_client_whole_and_terminated() -> None:
    async def scenario() -> None:
        html = answering(200, HTML, "text/html")
        async with tap_over([html], max_attempts=1) as (url, sink, _):
            status, body, problem = await post(url, CHAT, timeout_s=10)
            # the connection stays usable: the response was framed to its end
            again = await post(url, CHAT, timeout_s=10)
        assert (status, body, problem) == (200, HTML, None)
        assert again == (200, HTML, None)
        for row in sink.requests:
            assert (
                row["http_status"],
                row["upstream_status"],
                row["outcome"],
                row["error_kind"],
            ) == (
                200,
                200,
                "error_before_first_token",
                "not_event_stream",
            )

    run(scenario())
