"""Pods with a bounded prefix cache: the engines' own prefix-cache counters follow where the
locality router sends each prompt, so a stale KV index shows at the engines as well."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from simulator import EngineConfig, Fleet, FleetConfig, PodConfig
from simulator.gateway import Gateway
from tests.simulator.conftest import MODEL, post
from tests.simulator.test_gateway import metric

LABELS = {"model_name": MODEL, "engine": "0"}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    engine = EngineConfig(prefix_cache_prefixes=64)
    pods = [PodConfig(name=f"p{i}", engine=engine) for i in range(3)]
    with Fleet(FleetConfig(pods=pods)) as fleet:
        gw = Gateway([p.url for p in fleet.pods], policy="prefix_locality", health_interval_s=0.2)
        fleet.call(gw.start())
        gw.fleet = fleet  # type: ignore[attr-defined]
        yield gw
        fleet.call(gw.stop())


def _send(gw: Gateway, prompts: list[str]) -> None:
    for prompt in prompts:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 2,
        }
        status, _ = post(f"{gw.url}/v1/chat/completions", body)
        assert status == 200


def _engine_hits(gw: Gateway) -> tuple[float, float]:
    """(prefix-cache hit tokens, queried tokens) summed over the pods' /metrics."""
    fleet: Fleet = gw.fleet  # type: ignore[attr-defined]
    hits = sum(metric(p.url, "vllm:prefix_cache_hits_total", **LABELS) for p in fleet.pods)
    queries = sum(metric(p.url, "vllm:prefix_cache_queries_total", **LABELS) for p in fleet.pods)
    return hits, queries


def test_engine_prefix_hits_follow_the_router_and_drop_under_a_stale_index(
    gateway: Gateway,
) -> None:
    fleet: Fleet = gateway.fleet  # type: ignore[attr-defined]
    prompts = [f"tenant {i} {'system prompt ' * 40}" for i in range(6)]
    _send(gateway, prompts)  # first sight: nothing cached on any pod
    assert _engine_hits(gateway)[0] == 0
    _send(gateway, prompts * 2)
    hits, queries = _engine_hits(gateway)
    assert hits > 0.5 * queries * 2 / 3  # the returning two thirds hit most of their tokens
    healthy = hits
    fleet.call(gateway.set_fault("stale_kv_index"))
    try:
        _send(gateway, prompts)
        assert _engine_hits(gateway)[0] == healthy  # every hint one pod over: all miss
    finally:
        fleet.call(gateway.clear_fault("stale_kv_index"))
    _send(gateway, prompts)
    assert _engine_hits(gateway)[0] > healthy


def test_without_a_bound_every_prompt_hits_the_shared_system_prompt() -> None:
    with Fleet(FleetConfig(pods=[PodConfig(name="p0")])) as fleet:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x" * 4000}],
            "max_tokens": 2,
        }
        assert post(f"{fleet.pods[0].url}/v1/chat/completions", body)[0] == 200
        assert metric(fleet.pods[0].url, "vllm:prefix_cache_hits_total", **LABELS) == 512
