"""Health, readiness and engine signals on live data: simulator pods → real collector (scrapes and readiness probes) →
DuckDB → SLO jobs. Each mode is found on the faulty pod only, and a healthy
run of the same length finds nothing.

Intervals are compressed honestly: 0.5 s scrapes, a 1 s readiness probe, and thresholds
scaled to them (target down after 3 failed scrapes and 1 s, not ready after 2 s, restarts
held 30 s).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import simulator
import simulator.load as load
import simulator.traces as traces
from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from pipeline.schema import RecordSchema
from pipeline.store import Store
from slo.flags import FlagTransition
from slo.jobs import JobsConfig, SloJobs
from slo.signals.detectors import DetectorConfig
from slo.sinks import ListTransitionSink
from slo.spec import parse_spec
from slo.spec.model import build_model

MODEL = build_model(
    parse_spec(
        {
            "version": "llmslo/v1",
            "slos": [{"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}}],
        }
    )
)
SECONDS = 16
#: pod name → (dialect, engine settings)
PODS = {
    "healthy": ("vllm", {}),
    "crash": ("vllm", {}),
    "not-ready": ("vllm", {}),
    "no-model": ("vllm", {}),
    "ecc": ("vllm", {}),
    "nvlink": ("vllm", {}),
    "dp-hot": ("sglang", {"dp_size": 4}),
    "dp-even": ("sglang", {"dp_size": 4}),
}
Script = Callable[[simulator.Fleet], None]


def _fleet() -> simulator.Fleet:
    node = simulator.NodeConfig(name="node-0", gpus=len(PODS))
    pods = [
        simulator.PodConfig(
            name=name,
            dialect=dialect,
            node="node-0",
            gpus=[i],
            engine={"num_gpu_blocks": 4000, **engine},
        )
        for i, (name, (dialect, engine)) in enumerate(PODS.items())
    ]
    return simulator.Fleet(simulator.FleetConfig(nodes=[node], pods=pods, speed=1.0, seed=5))


def _collect(store: Store, urls: list[str], lock: threading.Lock) -> None:
    def sink(schema: RecordSchema, table: pa.Table) -> None:
        with lock:
            store.commit_batch({schema.table: [table]}, group_id="live", offsets={}, now_ts_ms=0)

    config = CollectConfig(
        targets=[TargetConfig(url=u) for u in urls],
        interval_s=0.5,
        jitter_s=0,
        timeout_s=2.0,  # a CPU-starved round must not look like a down target
        readiness_interval_s=1.0,
    )
    asyncio.run(Collector(config, sink).run(rounds=SECONDS * 2))


def _run(
    tmp_path: Any, script: Script
) -> tuple[dict[str, set[str]], list[FlagTransition], dict[str, str]]:
    """Run the fleet under load for SECONDS with ``script``; findings by signal → instances."""
    lock = threading.Lock()
    with _fleet() as fleet, Store(tmp_path / "live.duckdb") as store:
        names = {p.instance: p.name for p in fleet.pods}
        urls = [p.url for p in fleet.pods] + [d.url for d in fleet.dcgm]
        arrivals = list(traces.poisson_arrivals(8.0, SECONDS, seed=2, mean_output_tokens=300))
        client = load.LoadConfig(targets=[p.url for p in fleet.pods], max_output_tokens=600)
        threading.Thread(target=load.run_load_sync, args=(client, arrivals), daemon=True).start()
        collector = threading.Thread(target=_collect, args=(store, urls, lock))
        collector.start()
        script(fleet)
        collector.join(timeout=120)
        gpu_pods = {p.name: p.instance for p in fleet.pods}
    config = JobsConfig(
        detectors=DetectorConfig(
            lookback_s=30,
            down_for_s=1,
            down_min_scrapes=3,
            not_ready_for_s=2,
            restart_hold_s=30,
            gpu_pods=gpu_pods,
            hot_rank_min_tokens_per_s=5,
        ),
        kv_stale_s=3,
    )
    sink = ListTransitionSink()
    found: dict[str, set[str]] = defaultdict(set)
    with Store(tmp_path / "live.duckdb") as store:
        jobs = SloJobs(store.con, MODEL, config, sink=sink)
        stamps = [
            r[0]
            for r in store.con.execute(
                "SELECT DISTINCT ts_ms FROM target_health ORDER BY 1"
            ).fetchall()
        ]
        for ts in stamps:
            result = jobs.run_once(ts)
            assert result is not None and result.errors == []
            for f in result.findings:
                if f.scope == "instance":
                    found[f.signal].add(names.get(f.scope_id, f.scope_id))
    return found, sink.transitions, names


def _faults(fleet: simulator.Fleet) -> None:
    fleet.set_fault("no-model", "model_load_failure")
    fleet.set_fault("ecc", "xid", code=48)
    fleet.set_fault("nvlink", "xid", code=74)
    fleet.set_fault("dp-hot", "hot_rank", ranks=[0, 1], factor=4.0)
    time.sleep(3)
    fleet.set_fault("not-ready", "not_ready")
    fleet.set_fault("crash", "crash")
    time.sleep(3)
    fleet.clear_fault("crash", "crash")


@pytest.mark.slow
def test_each_mode_is_found_on_its_pod_only_and_a_healthy_run_finds_nothing(
    tmp_path: Any,
) -> None:
    found, transitions, names = _run(tmp_path / "faulty", _faults)
    expected = {
        "target_down": {"crash"},
        "crash": {"crash"},
        "worker_not_ready": {"not-ready"},
        "model_load_failure": {"no-model"},
        "xid_memory_error": {"ecc"},
        "xid_interconnect": {"nvlink"},
        "hot_rank": {"dp-hot"},
    }
    assert {s: found.get(s, set()) for s in expected} == expected
    assert not found.get("oom_risk"), "an XID is no memory pressure"
    everything = set().union(*found.values())
    assert "healthy" not in everything and "dp-even" not in everything
    crashed = [t for t in transitions if names.get(t.scope_id) == "crash"]
    assert (-1, "target_down") in [(t.to_level, t.reason) for t in crashed]
    healthy_found, healthy_transitions, _ = _run(tmp_path / "healthy", lambda _: None)
    assert dict(healthy_found) == {}
    assert healthy_transitions == []
