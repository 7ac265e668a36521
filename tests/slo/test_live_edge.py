"""The failures in front of the taps, live: simulated gateway + router → real collector and a
real prober through the gateway → DuckDB → SLO jobs. Each fault is found on the gateway's
instance with the evidence an on-call engineer needs; a healthy run finds nothing.

Intervals are compressed honestly: 0.5 s scrapes, a probe every 0.25 s, entry and gateway
windows of 3 s (defaults 60 s with a probe every 10 s).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import simulator
import simulator.load as load
import simulator.traces as traces
from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.probe import ProbeConfig, Prober
from pipeline.schema import RecordSchema
from pipeline.store import Store
from slo.jobs import JobsConfig, SloJobs
from slo.signals.detectors import DetectorConfig, Finding
from slo.sinks import ListTransitionSink
from slo.spec import parse_spec
from slo.spec.model import build_model

pytestmark = pytest.mark.slow

MODEL = build_model(
    parse_spec(
        {
            "version": "llmslo/v1",
            "slos": [
                {
                    "name": "probe",
                    "objective": 0.99,
                    "sli": {"kind": "availability", "source": "probe"},
                }
            ],
        }
    )
)
SECONDS = 9
FAULT_AT_S = 3
Script = Callable[[simulator.Fleet], None]


def _record(store: Store, lock: threading.Lock) -> Callable[[RecordSchema, pa.Table], None]:
    def sink(schema: RecordSchema, table: pa.Table) -> None:
        with lock:
            store.commit_batch({schema.table: [table]}, group_id="live", offsets={}, now_ts_ms=0)

    return sink


def _run(tmp_path: Any, script: Script, **gateway: Any) -> tuple[str, list[Finding]]:
    """Run a 2-pod fleet behind a gateway for SECONDS, ``script`` at FAULT_AT_S; returns the
    gateway's instance and the findings of a job cycle at every scrape."""
    lock = threading.Lock()
    config = simulator.FleetConfig(
        pods=[simulator.PodConfig(name="p0"), simulator.PodConfig(name="p1")],
        gateway=simulator.GatewayConfig(health_interval_s=0.25, **gateway),
        seed=3,
    )
    with simulator.Fleet(config) as fleet, Store(tmp_path / "live.duckdb") as store:
        assert fleet.gateway is not None
        sink = _record(store, lock)
        collect = CollectConfig(
            targets=[TargetConfig(url=f"{fleet.gateway.url}/metrics")],
            interval_s=0.5,
            jitter_s=0,
            timeout_s=2.0,
        )
        probe = ProbeConfig(url=fleet.gateway.url, interval_s=0.25, timeout_s=1.0, max_tokens=4)
        threads = [
            threading.Thread(
                target=lambda: asyncio.run(Collector(collect, sink).run(rounds=SECONDS * 2))
            ),
            threading.Thread(
                target=lambda: asyncio.run(Prober(probe, sink).run(rounds=SECONDS * 4))
            ),
        ]
        for thread in threads:
            thread.start()
        time.sleep(FAULT_AT_S)
        script(fleet)
        for thread in threads:
            thread.join(timeout=120)
        instance = fleet.gateway_instance
    jobs_config = JobsConfig(
        detectors=DetectorConfig(lookback_s=30, entry_window_s=3, gateway_window_s=3)
    )
    findings: list[Finding] = []
    with Store(tmp_path / "live.duckdb") as store:
        jobs = SloJobs(store.con, MODEL, jobs_config, sink=ListTransitionSink())
        stamps = store.con.execute("SELECT DISTINCT ts_ms FROM target_health ORDER BY 1").fetchall()
        for (ts,) in stamps:
            result = jobs.run_once(ts)
            assert result is not None and result.errors == []
            findings += result.findings
    return instance, findings


def _last(findings: list[Finding], signal: str) -> Finding:
    mine = [f for f in findings if f.signal == signal]
    assert mine, f"no {signal} finding; got {sorted({f.signal for f in findings})}"
    return mine[-1]


def test_a_healthy_gateway_and_entry_point_raise_nothing(tmp_path: Any) -> None:
    _, findings = _run(tmp_path, lambda _: None)
    assert findings == []


def test_gateway_down_is_entry_unavailable_with_refused_connections(tmp_path: Any) -> None:
    instance, findings = _run(tmp_path, lambda f: f.set_front_end_fault("gateway_down"))
    entry = _last(findings, "entry_unavailable")
    assert entry.scope_id == instance
    assert set(entry.evidence["error_kinds"]) == {"connect_refused"}
    assert entry.evidence["last_success_ts_ms"] is not None
    assert "router_unavailable" not in {f.signal for f in findings}


def test_router_down_fail_close_says_so_and_fails_the_probes(tmp_path: Any) -> None:
    instance, findings = _run(
        tmp_path, lambda f: f.set_front_end_fault("router_down"), router_down_policy="fail_close"
    )
    router = _last(findings, "router_unavailable")
    assert (router.scope_id, router.basis) == (instance, "router_up_gauge")
    assert router.evidence["policy"] == "fail_close"
    assert router.evidence["refused_by_code"].get("503", 0) > 0
    assert set(_last(findings, "entry_unavailable").evidence["error_kinds"]) == {"http_503"}


def test_no_ready_pod_is_no_eligible_endpoint(tmp_path: Any) -> None:
    def not_ready(fleet: simulator.Fleet) -> None:
        for pod in fleet.pods:
            fleet.set_fault(pod.name, "not_ready")

    instance, findings = _run(tmp_path, not_ready)
    found = _last(findings, "no_eligible_endpoint")
    assert (found.scope_id, found.basis) == (instance, "epp_error_code")
    assert found.evidence["pool_ready_pods"] == 0
    assert "router_unavailable" not in {f.signal for f in findings}


def test_a_full_queue_is_gateway_queue_full(tmp_path: Any) -> None:
    def unstall(fleet: simulator.Fleet) -> None:
        for pod in fleet.pods:
            fleet.clear_fault(pod.name, "stall")

    def stall_under_load(fleet: simulator.Fleet) -> None:
        assert fleet.gateway is not None
        for pod in fleet.pods:
            fleet.set_fault(pod.name, "stall")
        client = load.LoadConfig(targets=[fleet.gateway.url], deadline_s=3)
        arrivals = list(traces.poisson_arrivals(10.0, SECONDS - FAULT_AT_S, seed=1))
        # Streams stuck on stalled pods would hold the gateway open at shutdown: unstall at the end.
        threading.Timer(SECONDS - FAULT_AT_S - 1, lambda: unstall(fleet)).start()
        threading.Thread(
            target=load.run_load_sync,
            args=(client, arrivals),
            kwargs={"keep_results": False},
            daemon=True,
        ).start()

    instance, findings = _run(tmp_path, stall_under_load, max_in_flight=2, max_queue=2)
    full = _last(findings, "gateway_queue_full")
    assert (full.scope_id, full.basis) == (instance, "epp_error_code")
    assert full.evidence["gateway_queue_max"] == 2
