"""The gateway and router in front of the pods, seen by the synthetic prober (the entry point)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.canonical import TargetCanonicalizer
from collectors.exposition import ExpositionParser
from collectors.probe import ProbeConfig, Prober
from llmslo.cli import main
from pipeline.errors import ConfigError
from pipeline.schema import RecordSchema
from simulator import Fleet, FleetConfig, GatewayConfig, PodConfig
from simulator.gateway import Gateway
from tests.simulator.conftest import get


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(FleetConfig(pods=[PodConfig(name="p0"), PodConfig(name="p1")])) as running:
        yield running


@pytest.fixture
def gateway_factory(fleet: Fleet) -> Iterator[Any]:
    started: list[Gateway] = []

    def make(**options: Any) -> Gateway:
        gw = Gateway([p.url for p in fleet.pods], health_interval_s=0.2, **options)
        fleet.call(gw.start())
        started.append(gw)
        return gw

    yield make
    for gw in started:
        fleet.call(gw.stop())


def probe(url: str, rounds: int = 1, **overrides: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def sink(schema: RecordSchema, table: pa.Table) -> None:
        rows.extend(table.to_pylist())

    config = ProbeConfig(url=url, interval_s=0.05, max_tokens=4, **overrides)
    asyncio.run(Prober(config, sink).run(rounds=rounds))
    return rows


def metric(base_url: str, sample_name: str, **labels: str) -> float:
    """The value of ``sample_name`` with ``labels`` at ``base_url``/metrics (0 when absent)."""
    _, body = get(f"{base_url}/metrics")
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == sample_name and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
    return 0.0


def test_a_healthy_gateway_serves_streams_and_spreads_them_over_the_pods(
    fleet: Fleet, gateway_factory: Any
) -> None:
    gw = gateway_factory()
    rows = probe(gw.url, rounds=4)
    assert [r["outcome"] for r in rows] == ["ok"] * 4
    assert metric(gw.url, "llmslo_sim_gateway_routing_decisions_total", mode="round_robin") == 4
    assert metric(gw.url, "llmslo_sim_gateway_router_up") == 1
    assert metric(gw.url, "llmslo_sim_gateway_requests_total", code="503") == 0
    # the router's own counters under the Inference Extension EPP's names
    assert metric(gw.url, "inference_objective_request_total", model_name="llama-3-8b") == 4
    assert metric(gw.url, "inference_objective_request_error_total") == 0
    assert metric(gw.url, "inference_pool_ready_pods", name="default") == 2
    assert metric(gw.url, "inference_objective_running_requests", model_name="llama-3-8b") == 0


def test_gateway_down_refuses_connections_and_comes_back(
    fleet: Fleet, gateway_factory: Any
) -> None:
    gw = gateway_factory()
    fleet.call(gw.set_fault("gateway_down"))
    (down,) = probe(gw.url)
    assert (down["outcome"], down["error_kind"]) == ("error_before_first_token", "connect_refused")
    fleet.call(gw.clear_fault("gateway_down"))
    assert probe(gw.url)[0]["outcome"] == "ok"


@pytest.mark.parametrize(
    ("policy", "outcome", "kind"),
    [
        ("fail_open", "ok", None),
        ("fail_close", "rejected", "http_503"),
        ("reject", "rejected", "http_429"),
    ],
    ids=["fail-open keeps serving", "fail-close answers 503", "reject answers 429"],
)
def test_router_down_follows_the_gateway_policy(
    fleet: Fleet, gateway_factory: Any, policy: str, outcome: str, kind: str | None
) -> None:
    gw = gateway_factory(router_down_policy=policy)
    fleet.call(gw.set_fault("router_down"))
    (row,) = probe(gw.url)
    assert (row["outcome"], row["error_kind"]) == (outcome, kind)
    assert metric(gw.url, "llmslo_sim_gateway_router_up") == 0
    fleet.call(gw.clear_fault("router_down"))
    assert (
        probe(gw.url)[0]["outcome"] == "ok" and metric(gw.url, "llmslo_sim_gateway_router_up") == 1
    )


def test_no_ready_pod_is_no_eligible_endpoint(fleet: Fleet, gateway_factory: Any) -> None:
    gw = gateway_factory()
    for pod in fleet.pods:
        fleet.set_fault(pod.name, "not_ready")
    try:
        time.sleep(0.6)  # the router's readiness checks run every 0.2 s
        (row,) = probe(gw.url)
        assert (row["outcome"], row["error_kind"]) == ("rejected", "http_503")
        assert (
            metric(
                gw.url,
                "llmslo_sim_gateway_requests_total",
                code="503",
                reason="no_eligible_endpoint",
            )
            == 1
        )
        assert metric(gw.url, "inference_pool_ready_pods", name="default") == 0
        assert (
            metric(
                gw.url, "inference_objective_request_error_total", error_code="ServiceUnavailable"
            )
            == 1
        )
    finally:
        for pod in fleet.pods:
            fleet.clear_fault(pod.name, "not_ready")
    time.sleep(0.6)
    assert probe(gw.url)[0]["outcome"] == "ok"


def test_a_full_queue_rejects_with_429(fleet: Fleet, gateway_factory: Any) -> None:
    gw = gateway_factory(max_in_flight=1, max_queue=1)
    for pod in fleet.pods:
        fleet.set_fault(pod.name, "stall")  # the one forwarded request never finishes
    try:

        async def three() -> list[list[dict[str, Any]]]:
            return list(
                await asyncio.gather(
                    *(asyncio.to_thread(probe, gw.url, 1, timeout_s=2.0) for _ in range(3))
                )
            )

        rows = [r for batch in asyncio.run(three()) for r in batch]
    finally:
        for pod in fleet.pods:
            fleet.clear_fault(pod.name, "stall")
    assert sorted(r["error_kind"] or "" for r in rows).count("http_429") == 1
    assert metric(gw.url, "llmslo_sim_gateway_requests_total", code="429", reason="queue_full") == 1
    exhausted = {"error_code": "InferencePoolResourceExhausted", "model_name": "llama-3-8b"}
    assert metric(gw.url, "inference_objective_request_error_total", **exhausted) == 1


def test_an_unknown_gateway_fault_is_refused(fleet: Fleet, gateway_factory: Any) -> None:
    gw = gateway_factory()
    with pytest.raises(ConfigError, match="unknown 'stall'"):
        fleet.call(gw.set_fault("stall"))


def test_the_collector_reads_the_gateway_as_an_epp_component(
    fleet: Fleet, gateway_factory: Any
) -> None:
    gw = gateway_factory(router_down_policy="fail_close")
    probe(gw.url, rounds=2)
    fleet.call(gw.set_fault("router_down"))
    probe(gw.url)
    _, body = get(f"{gw.url}/metrics")
    canonicalizer = TargetCanonicalizer(f"127.0.0.1:{gw.port}")
    rows = canonicalizer.canonicalize(ExpositionParser().parse(body.decode()), 1000).table
    assert canonicalizer.detection is not None and canonicalizer.detection.dialect == "epp"
    by_signal = {
        (r["signal"], json.dumps(json.loads(r["labels_json"]), separators=(",", ":"))): r["value"]
        for r in rows.to_pylist()
        if r["signal"]
    }
    assert by_signal[("router_up", "{}")] == 0
    refused = '{"code":"503","reason":"router_unavailable"}'
    assert by_signal[("gateway_answers", refused)] == 1
    assert by_signal[("gateway_requests", '{"target_model_name":"llama-3-8b"}')] == 2


def test_a_fleet_config_with_a_gateway_starts_it_in_front_of_its_pods() -> None:
    config = FleetConfig(
        pods=[PodConfig(name="a"), PodConfig(name="b")],
        gateway=GatewayConfig(router_down_policy="reject", health_interval_s=0.2),
    )
    with Fleet(config) as fleet:
        assert fleet.gateway is not None
        described = fleet.describe()["gateway"]
        assert described["url"] == fleet.gateway.url and described["router_down_policy"] == "reject"
        assert {
            "targets": [fleet.gateway_instance],
            "labels": {"instance": "gateway", "pool": "llama-3-8b", "dialect": "epp"},
        } in fleet.file_sd()
        assert [r["outcome"] for r in probe(fleet.gateway.url, rounds=2)] == ["ok", "ok"]
        fleet.set_front_end_fault("router_down")
        (row,) = probe(fleet.gateway.url)
        assert (row["error_kind"], row["instance"]) == ("http_429", fleet.gateway_instance)
        fleet.clear_front_end_fault("router_down")
        assert probe(fleet.gateway.url)[0]["outcome"] == "ok"
        with pytest.raises(ConfigError, match="unknown 'stall'"):
            fleet.set_front_end_fault("stall")


def test_llmslo_sim_gateway_prints_the_gateway_url(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "sim",
        "--pods",
        "1",
        "--gateway",
        "--router-down-policy",
        "fail_open",
        "--seconds",
        "0.5",
    ]
    assert main(argv) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["gateway"]["url"].startswith("http://127.0.0.1:")
    assert described["gateway"]["router_down_policy"] == "fail_open"


def test_gateway_down_also_cuts_kept_alive_connections(fleet: Fleet, gateway_factory: Any) -> None:
    """A gateway that goes down is gone for clients already connected too (keep-alive):
    the prober's and the collector's sessions reuse their connections."""
    gw = gateway_factory()
    config = ProbeConfig(url=gw.url, max_tokens=4, timeout_s=5)

    async def before_and_during() -> tuple[dict[str, Any], dict[str, Any]]:
        prober = Prober(config, lambda schema, table: None)
        async with aiohttp.ClientSession() as session:
            before = await prober.probe_once(session)
            await asyncio.to_thread(fleet.call, gw.set_fault("gateway_down"))
            during = await prober.probe_once(session)
        return before, during

    before, during = asyncio.run(before_and_during())
    fleet.call(gw.clear_fault("gateway_down"))
    assert before["outcome"] == "ok"
    assert during["outcome"] == "error_before_first_token"
    assert during["error_kind"] in ("connect_refused", "stream_cut", "connect_error")
