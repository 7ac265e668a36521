"""The gateway and router in front of the pods, seen by the synthetic prober (the entry point)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
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
from pipeline.store import Store
from pipeline.units import MINUTE_MS
from simulator import Fleet, FleetConfig, GatewayConfig, PodConfig
from simulator.gateway import Gateway
from simulator.load import LoadConfig, run_load_sync
from simulator.traces import TraceRequest
from slo.own_targets import ViolationComparison, compare_violations
from tests.simulator.conftest import completion, get
from tests.slo.factories import T0_MS, insert


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


def _send(url: str, targets: dict[str, str], *, stream: bool = True) -> None:
    """One completion through the gateway with ``targets`` as headers, read to its end."""
    body = json.dumps(completion(4, stream=stream)).encode()
    headers = {"Content-Type": "application/json", **targets}
    request = urllib.request.Request(f"{url}/v1/completions", body, headers)
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        resp.read()


#: One round of requests and the router's verdict on them: 1 ms misses any TTFT (a prefill
#: pass) and any TPOT (a decode step); 60 s misses none; a header that is no number is no
#: target; a non-streamed answer's TTFT is its whole latency.
_ROUND = [
    ({"x-llm-d-slo-ttft-ms": "1", "x-llm-d-slo-tpot-ms": "60000"}, True),
    ({"x-llm-d-slo-ttft-ms": "60000", "x-llm-d-slo-tpot-ms": "1"}, True),
    ({"x-llm-d-slo-ttft-ms": "60000", "x-llm-d-slo-tpot-ms": "60000"}, True),
    ({"x-llm-d-slo-ttft-ms": "fast"}, True),
    ({}, True),
    ({"x-llm-d-slo-ttft-ms": "1"}, False),
]
_MISSED = {"ttft": 2.0, "tpot": 1.0}


@pytest.mark.parametrize(
    ("router_names", "emitted", "read"),
    [
        (
            "llm-d-router",
            (
                "llm_d_epp_request_slo_violation_total",
                "inference_objective_request_slo_violation_total",
            ),
            "llm_d_epp_request_slo_violation_total",
        ),
        (
            "inference-extension",
            ("inference_objective_request_slo_violation_total",),
            "inference_objective_request_slo_violation_total",
        ),
    ],
    ids=["llm-d-router: both generations, read once", "inference extension: the old name"],
)
def test_the_router_counts_requests_that_missed_their_own_targets(
    fleet: Fleet,
    gateway_factory: Any,
    store: Store,
    router_names: str,
    emitted: tuple[str, ...],
    read: str,
) -> None:
    gw = gateway_factory(router_names=router_names)
    canonicalizer = TargetCanonicalizer(f"127.0.0.1:{gw.port}")
    scrapes = []
    for rounds, ts_ms in enumerate((T0_MS, T0_MS + MINUTE_MS), 1):  # a round, then a scrape
        for targets, stream in _ROUND:
            _send(gw.url, targets, stream=stream)
        for name in emitted:
            by_type = {k: metric(gw.url, name, type=k) for k in _MISSED}
            assert by_type == {k: v * rounds for k, v in _MISSED.items()}, name
        _, body = get(f"{gw.url}/metrics")
        scrapes.extend(
            canonicalizer.canonicalize(
                ExpositionParser().parse(body.decode()), ts_ms
            ).table.to_pylist()
        )
    assert canonicalizer.detection is not None and canonicalizer.detection.dialect == "epp"
    rows = [r for r in scrapes if r["signal"] == "gateway_slo_violations"]
    assert {r["metric"] for r in rows} == {read}  # the deprecated twin yields to its new name
    insert(store, engine=rows)
    # the window holds the second scrape: the second round's misses, per pool and type
    assert compare_violations(store.con, T0_MS + 1, T0_MS + 2 * MINUTE_MS) == [
        ViolationComparison("llama-3-8b", kind, 0, 0, missed)
        for kind, missed in sorted(_MISSED.items())
    ]


def test_a_dynamo_frontend_counts_no_missed_targets(fleet: Fleet, gateway_factory: Any) -> None:
    gw = gateway_factory(router_names="dynamo")
    _send(gw.url, {"x-llm-d-slo-ttft-ms": "1"})
    _, body = get(f"{gw.url}/metrics")
    assert b"slo_violation" not in body


def test_the_load_generator_sends_its_targets_to_the_router(
    fleet: Fleet, gateway_factory: Any
) -> None:
    gw = gateway_factory(router_names="llm-d-router")
    config = LoadConfig(targets=[gw.url], slo_ttft_ms=1, slo_tpot_ms=600_000)
    report = run_load_sync(config, [TraceRequest(0.01 * i, 16, 3) for i in range(3)])
    assert report.summary()["outcomes"] == {"ok": 3}
    name = "llm_d_epp_request_slo_violation_total"
    assert (metric(gw.url, name, type="ttft"), metric(gw.url, name, type="tpot")) == (3.0, 0.0)
