"""The router's KV locality index: hints hit when healthy; stale_kv_index makes the engine
reject them and the cache hit ratio drop, at the router's own metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from simulator import Fleet, FleetConfig, PodConfig
from simulator.gateway import Gateway
from simulator.locality import LocalityIndex, prefix_key
from tests.simulator.conftest import MODEL, post
from tests.simulator.test_gateway import metric

PODS = ["a", "b", "c"]


def _rounds(index: LocalityIndex, keys: list[str], rounds: int) -> tuple[int, int, int]:
    before = (index.lookups, index.hits, index.hints_rejected)
    for _ in range(rounds):
        for key in keys:
            index.route(key, PODS)
    return (index.lookups - before[0], index.hits - before[1], index.hints_rejected - before[2])


def test_a_healthy_index_hits_every_returning_prefix_and_rejects_nothing() -> None:
    index = LocalityIndex(PODS)
    keys = [prefix_key(f"prompt {i}") for i in range(12)]
    assert _rounds(index, keys, 1) == (12, 0, 0)  # first sight: nothing cached anywhere
    assert _rounds(index, keys, 3) == (36, 36, 0)


def test_a_stale_index_rejects_hints_and_scatters_new_prefixes() -> None:
    index = LocalityIndex(PODS)
    old = [prefix_key(f"old {i}") for i in range(12)]
    _rounds(index, old, 2)
    index.set_stale()
    _, hits, rejected = _rounds(index, old, 1)
    assert (hits, rejected) == (0, 12)  # every hint points one pod over
    # 13 prefixes over 3 pods: like interleaved traffic, each return lands on another pod.
    new = [prefix_key(f"new {i}") for i in range(13)]
    lookups, hits, rejected = _rounds(index, new, 4)
    assert rejected == 0 and hits < 0.5 * lookups  # never indexed: round robin, mostly misses
    index.clear_stale()
    assert _rounds(index, new, 1) == (13, 13, 0)  # rebuilt from what the pods hold


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    with Fleet(FleetConfig(pods=[PodConfig(name=f"p{i}") for i in range(3)])) as fleet:
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


def test_stale_kv_index_shows_at_the_router_metrics_and_nothing_when_off(gateway: Gateway) -> None:
    fleet: Fleet = gateway.fleet  # type: ignore[attr-defined]
    prompts = [f"system prompt {i}" for i in range(6)]
    _send(gateway, prompts * 3)
    assert metric(gateway.url, "llmslo_sim_router_prefix_hits_total") == 12
    assert metric(gateway.url, "llmslo_sim_router_prefix_hints_rejected_total") == 0
    fleet.call(gateway.set_fault("stale_kv_index"))
    _send(gateway, prompts)
    assert metric(gateway.url, "llmslo_sim_router_prefix_hints_rejected_total") == 6
    assert metric(gateway.url, "llmslo_sim_router_prefix_hits_total") == 12
    fleet.call(gateway.clear_fault("stale_kv_index"))
    _send(gateway, prompts)
    assert metric(gateway.url, "llmslo_sim_router_prefix_hits_total") == 18
    assert metric(gateway.url, "llmslo_sim_router_prefix_hints_rejected_total") == 6
