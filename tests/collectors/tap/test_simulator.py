"""The tap in front of the simulated fleet, with its faults: each gives the documented outcome."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from tests.collectors.tap.fakes import post, tap_over, wait_for

MODEL = "llama-3-8b"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=2)],
        pods=[
            PodConfig(name=f"pod-{i}", dialect="vllm", model=MODEL, node="node-0", gpus=[i])
            for i in (0, 1)
        ],
        speed=5.0,
        seed=1,
    )
    with Fleet(config) as running:
        yield running


@pytest.fixture(autouse=True)
def clear_faults(fleet: Fleet) -> Iterator[None]:
    yield
    for pod in fleet.pods:
        for name in list(fleet.active_faults(pod.name)):
            fleet.clear_fault(pod.name, name)


def chat(max_tokens: int = 8) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


def normalise(body: bytes) -> bytes:
    """Per-request ids and timestamps differ between two requests; the rest must not."""
    return re.sub(rb'"(id|created)": ?("[^"]*"|\d+)', b"", body)


def test_healthy_stream_is_measured_and_byte_identical(fleet: Fleet) -> None:
    pod = fleet.pods[0]

    async def scenario() -> None:
        async with tap_over([pod.url]) as (url, sink, _):
            status, via_tap, error = await post(url, chat())
        _, direct, _ = await post(pod.url, chat())
        assert (status, error) == (200, None)
        assert normalise(via_tap) == normalise(direct) and b'"usage"' not in via_tap
        [row] = sink.requests
        assert (row["outcome"], row["instance"], row["completion_tokens"]) == (
            "ok",
            pod.instance,
            8,
        )
        assert row["token_chunks"] == 8 and row["finish_reason"] == "length"
        assert row["ttfb_s"] <= row["ttft_s"] < row["e2e_s"] and row["tpot_s"] > 0
        assert row["prompt_tokens"] > 0

    asyncio.run(scenario())


def test_prefill_failure_is_retried_on_the_healthy_pod(fleet: Fleet) -> None:
    fleet.set_fault("pod-0", "prefill_failure")

    async def scenario() -> None:
        async with tap_over([p.url for p in fleet.pods]) as (url, sink, _):
            status, body, _ = await post(url, chat())
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        first, second = sink.requests
        assert (first["outcome"], first["error_kind"], first["instance"]) == (
            "error_before_first_token",
            "http_500",
            fleet.pods[0].instance,
        )
        assert (second["outcome"], second["attempt"], second["instance"]) == (
            "ok",
            2,
            fleet.pods[1].instance,
        )

    asyncio.run(scenario())


def test_prefill_failure_on_the_only_pod_reaches_the_client(fleet: Fleet) -> None:
    fleet.set_fault("pod-0", "prefill_failure")

    async def scenario() -> None:
        async with tap_over([fleet.pods[0].url]) as (url, sink, _):
            status, _, _ = await post(url, chat())
        assert status == 500
        assert [r["outcome"] for r in sink.requests] == [
            "error_before_first_token",
            "error_before_first_token",
        ]
        assert sink.requests[-1]["http_status"] == 500

    asyncio.run(scenario())


def test_failure_after_first_token_is_interrupted_and_not_retried(fleet: Fleet) -> None:
    fleet.set_fault("pod-0", "failure_after_first_token", after_tokens=3)

    async def scenario() -> None:
        async with tap_over([p.url for p in fleet.pods]) as (url, sink, _):
            status, body, error = await post(url, chat(20))
        assert status == 200 and error == "ClientPayloadError" and b"[DONE]" not in body
        [row] = sink.requests
        assert (
            row["outcome"] == "interrupted_after_first_token"
            and row["instance"] == fleet.pods[0].instance
        )
        assert row["token_chunks"] >= 1 and row["ttft_s"] is not None

    asyncio.run(scenario())


def test_not_ready_worker_is_rejected_and_retried(fleet: Fleet) -> None:
    fleet.set_fault("pod-0", "not_ready")

    async def scenario() -> None:
        async with tap_over([p.url for p in fleet.pods]) as (url, sink, _):
            status, _, _ = await post(url, chat())
        assert status == 200
        assert [(r["outcome"], r["error_kind"]) for r in sink.requests] == [
            ("rejected", "http_503"),
            ("ok", None),
        ]

    asyncio.run(scenario())


def test_crashed_pod_is_an_error_before_first_token_and_retried(fleet: Fleet) -> None:
    fleet.set_fault("pod-0", "crash")

    async def scenario() -> None:
        async with tap_over([p.url for p in fleet.pods]) as (url, sink, _):
            status, _, _ = await post(url, chat())
        assert status == 200
        assert [(r["outcome"], r["error_kind"]) for r in sink.requests] == [
            ("error_before_first_token", "connect_failed"),
            ("ok", None),
        ]

    asyncio.run(scenario())


def test_slow_decode_shows_in_tpot_and_itl(fleet: Fleet) -> None:
    async def tpot() -> tuple[float, float]:
        async with tap_over([fleet.pods[0].url]) as (url, sink, _):
            await post(url, chat(12))
        row = sink.requests[0]
        return row["tpot_s"], row["itl_mean_s"]

    healthy = asyncio.run(tpot())
    fleet.set_fault("pod-0", "slow_decode", factor=6.0)
    slow = asyncio.run(tpot())
    assert slow[0] > 3 * healthy[0] and slow[1] > 3 * healthy[1]


def engine_series(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def read_tokens_then_leave(url: str, tokens: int) -> None:
    """Start a long stream, read ``tokens`` token chunks, then drop the connection."""
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url + "/v1/chat/completions", json=chat(2000))
        assert resp.status == 200, await resp.text()
        seen = 0
        while seen < tokens:
            line = await resp.content.readline()
            assert line, "the stream ended before the client left"
            seen += bool(re.search(rb'"content": ?"[^"]', line))
        resp.close()


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        return await resp.text()


@pytest.mark.parametrize(
    "ghost", [False, True], ids=["engine aborts on disconnect", "ghost engine keeps it"]
)
def test_disconnect_evidence_against_the_engines_own_counters(fleet: Fleet, ghost: bool) -> None:
    pod = fleet.pods[0]
    if ghost:
        fleet.set_fault("pod-0", "ghost")

    async def scenario() -> None:
        before = await scrape(pod.url)
        aborts_before = engine_series(before, "vllm:request_success_total", finished_reason="abort")
        async with tap_over([pod.url], drain_max_s=0.0) as (url, sink, proxy):
            await read_tokens_then_leave(url, 2)
            await wait_for(lambda: bool(sink.requests))
            assert proxy.inflight.in_flight[pod.instance] == 0
            await asyncio.sleep(0.5)
            after = await scrape(pod.url)
        running = engine_series(after, "vllm:num_requests_running")
        aborts = (
            engine_series(after, "vllm:request_success_total", finished_reason="abort")
            - aborts_before
        )
        [row] = sink.requests
        assert row["outcome"] == "client_cancelled" and row["upstream_closed_ts_ms"] is not None
        if ghost:  # evidence (a) running above the tap's in-flight, (b) no matching abort
            assert running >= 1 and aborts == 0
        else:
            assert running == 0 and aborts == 1

    asyncio.run(scenario())
    time.sleep(0.1)


def test_drain_mode_counts_tokens_a_ghost_engine_generates(fleet: Fleet) -> None:
    fleet.set_fault("pod-0", "ghost")

    async def scenario() -> None:
        async with tap_over([fleet.pods[0].url], drain_max_s=1.0) as (url, sink, _):
            await read_tokens_then_leave(url, 1)
            await wait_for(lambda: bool(sink.requests), timeout_s=10)
        [row] = sink.requests
        assert row["outcome"] == "client_cancelled" and row["tokens_after_disconnect"] > 0

    asyncio.run(scenario())
