"""Every scrape's outcome and the readiness probe become target_health rows."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pyarrow as pa

import simulator
from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from pipeline.schema import TARGET_HEALTH, RecordSchema


def _rounds(urls: list[str], rounds: int, **config: Any) -> list[dict[str, Any]]:
    tables: list[pa.Table] = []

    def sink(schema: RecordSchema, table: pa.Table) -> None:
        if schema is TARGET_HEALTH:
            assert table.schema.equals(TARGET_HEALTH.arrow)
            tables.append(table)

    collect = CollectConfig(
        targets=[TargetConfig(url=u) for u in urls], interval_s=0.1, jitter_s=0, **config
    )
    collector = Collector(collect, sink)

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(rounds):
                await collector.scrape_round(session)

    asyncio.run(run())
    return [row for t in tables for row in t.to_pylist()]


def _fleet(n: int) -> simulator.Fleet:
    node = simulator.NodeConfig(name="node-0", gpus=n)
    pods = [
        simulator.PodConfig(name=f"pod-{i}", dialect="vllm", node="node-0", gpus=[i])
        for i in range(n)
    ]
    return simulator.Fleet(simulator.FleetConfig(nodes=[node], pods=pods, speed=20.0, seed=1))


def test_each_scrape_is_a_row_and_readiness_tells_the_faults_apart() -> None:
    with _fleet(4) as fleet:
        fleet.set_fault("pod-1", "not_ready")
        fleet.set_fault("pod-2", "model_load_failure")
        fleet.set_fault("pod-3", "crash")
        urls = [p.url for p in fleet.pods] + [fleet.dcgm[0].url]
        rows = _rounds(urls, 2, readiness_interval_s=60)
        instances = [p.instance for p in fleet.pods]
    assert len(rows) == 2 * len(urls)  # one row per target and round
    first = {r["instance"]: r for r in rows[: len(urls)]}
    healthy, not_ready, no_model, crashed = (first[i] for i in instances)
    assert (healthy["up"], healthy["ready"], healthy["models"]) == (True, True, 1)
    assert healthy["http_status"] == 200 and healthy["process_start_s"] > 1.7e9
    assert (not_ready["up"], not_ready["ready"], not_ready["ready_status"]) == (True, False, 503)
    assert not_ready["models"] == 1
    assert (no_model["up"], no_model["ready"], no_model["models"]) == (True, False, 0)
    assert crashed["up"] is False and crashed["error_kind"] == "connect"
    assert crashed["ready"] is None and crashed["error"]
    dcgm = [r for r in rows if r["dialect"] == "dcgm"]
    assert dcgm and all(r["ready"] is None for r in dcgm)  # exporters are not probed
    # the probe runs at its own, slower interval: not again in the second round
    second = {r["instance"]: r for r in rows[len(urls) :]}
    assert second[instances[0]]["ready"] is None and second[instances[0]]["up"] is True


def test_a_restart_shows_as_a_new_process_start_and_counter_resets() -> None:
    with _fleet(1) as fleet:
        pod = fleet.pods[0]
        before = _rounds([pod.url], 1, readiness_interval_s=0)
        fleet.set_fault("pod-0", "crash")
        fleet.clear_fault("pod-0", "crash")
        tables: list[pa.Table] = []
        collect = CollectConfig(targets=[TargetConfig(url=pod.url)], jitter_s=0)
        collector = Collector(
            collect, lambda s, t: tables.append(t) if s is TARGET_HEALTH else None
        )

        async def two_rounds() -> None:
            async with aiohttp.ClientSession() as session:
                await collector.scrape_round(session)
                fleet.set_fault("pod-0", "crash")
                fleet.clear_fault("pod-0", "crash")
                await collector.scrape_round(session)

        asyncio.run(two_rounds())
    rows = [r for t in tables for r in t.to_pylist()]
    assert before[0]["ready"] is None  # readiness_interval_s = 0: never probed
    assert rows[1]["process_start_s"] > rows[0]["process_start_s"]
    assert rows[1]["counter_resets"] > 0


def test_a_gateway_router_is_scraped_but_not_probed_for_a_model() -> None:
    """A router (dialect epp) serves no model: a readiness probe would find no /v1/models
    and make a healthy gateway look like a model-load failure."""
    config = simulator.FleetConfig(
        pods=[simulator.PodConfig(name="p0")], gateway=simulator.GatewayConfig(), seed=1
    )
    with simulator.Fleet(config) as fleet:
        assert fleet.gateway is not None
        rows = _rounds(
            [f"{fleet.gateway.url}/metrics", fleet.pods[0].url], 1, readiness_interval_s=60
        )
    gateway, pod = rows
    assert (gateway["dialect"], gateway["up"], gateway["ready"], gateway["models"]) == (
        "epp",
        True,
        None,
        None,
    )
    assert (pod["ready"], pod["models"]) == (True, 1)
