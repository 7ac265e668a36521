"""A record's grouping keys (pool, tenant, route) come from configuration or the engine:
through a real tap in front of a simulated vLLM pod, whatever model or tenant a client
sends, its records land in the announced or configured pool, or in ``other``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from tests.collectors.tap.fakes import (
    CHAT,
    ScriptedUpstream,
    post,
    stream_script,
    tap_over,
    wait_for,
)

MODEL = "llama-3-8b"
HOSTILE = "<img src=x onerror=alert(1)>[phish](http://evil.example)"


@pytest.fixture(scope="module")
def pod_url() -> Iterator[str]:
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=1)],
        pods=[PodConfig(name="pod-0", dialect="vllm", model=MODEL, node="node-0", gpus=[0])],
        speed=5.0,
        seed=3,
    )
    with Fleet(config) as fleet:
        yield fleet.pods[0].url


def _chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 4}  # fmt: skip


async def _post_all(url: str, models: list[str], headers: dict[str, str] | None = None) -> None:
    gate = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as session:

        async def one(model: str) -> None:
            async with (
                gate,
                session.post(url + "/v1/chat/completions", json=_chat(model), headers=headers) as r,
            ):
                await r.read()

        await asyncio.gather(*(one(m) for m in models))


def test_an_invented_model_lands_in_other_and_keeps_its_raw_name(pod_url: str) -> None:
    async def scenario() -> list[dict]:
        async with tap_over([pod_url]) as (url, sink, proxy):
            await wait_for(lambda: MODEL in proxy.model_labels.announced)
            await post(url, _chat(MODEL))
            await post(url, _chat(HOSTILE))
        return list(sink.requests)

    announced, hostile = asyncio.run(scenario())
    assert announced["pool"] == MODEL and announced["outcome"] == "ok"
    assert hostile["pool"] == "other", "a client-chosen model became a pool"
    assert hostile["model"] == HOSTILE  # the raw request stays visible, in its own column


def test_200_invented_models_create_no_new_pool(pod_url: str) -> None:
    invented = [f"{HOSTILE}-{i}" for i in range(200)]

    async def scenario() -> list[dict]:
        async with tap_over([pod_url], models=["configured-7b"]) as (url, sink, proxy):
            await wait_for(lambda: MODEL in proxy.model_labels.announced)
            await _post_all(url, [*invented, MODEL, "configured-7b"])
        return list(sink.requests)

    rows = asyncio.run(scenario())
    assert len(rows) == 202
    assert {r["pool"] for r in rows} == {MODEL, "configured-7b", "other"}
    assert {r["model"] for r in rows} >= set(invented)


def test_the_tap_pool_wins_over_any_model(pod_url: str) -> None:
    async def scenario() -> list[dict]:
        async with tap_over([pod_url], pool="pool-a") as (url, sink, _):
            await _post_all(url, [MODEL, HOSTILE])
        return list(sink.requests)

    assert {r["pool"] for r in asyncio.run(scenario())} == {"pool-a"}


def test_tenants_outside_the_allow_list_are_one_bucket() -> None:
    async def scenario() -> list[dict]:
        up = ScriptedUpstream(lambda req: stream_script(2), models=["m"])
        async with tap_over([up], tenants=["acme"]) as (url, sink, _):
            for tenant in ("acme", "<b>evil</b>", "tenant-2"):
                await post(url, CHAT, headers={"x-tenant-id": tenant})
            await post(url, CHAT)
            await post(url, CHAT, route="/v1/anything-else")  # not measured: no record
        return list(sink.requests)

    rows = asyncio.run(scenario())
    assert [r["tenant"] for r in rows] == ["acme", "other", "other", None]
    assert {r["route"] for r in rows} == {"/v1/chat/completions"}
