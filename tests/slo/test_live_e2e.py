"""End to end on live data: simulator pods and DCGM → real collectors → DuckDB → SLO jobs.

Two vLLM pods under streaming load; pod-0 stalls (NCCL-hang style), pod-1 leaks KV
blocks. The jobs must report the stall on pod-0 only and walk pod-1 through L1 → L2 → L3.
Thresholds are shortened (``stall_for_s`` = 4 s, 0.5 s scrapes) so the test stays short.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

import collectors.collector as collectors
import collectors.config as collect_config
import simulator
import simulator.load as load
import simulator.traces as traces
from pipeline.schema import RecordSchema
from pipeline.store import Store
from slo.flags import FlagPolicy
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


def _collect(store: Store, urls: list[str], seconds: float, lock: threading.Lock) -> None:
    def sink(schema: RecordSchema, table: pa.Table) -> None:
        with lock:
            rows = [table]
            store.commit_batch({schema.table: rows}, group_id="live", offsets={}, now_ts_ms=0)

    config = collect_config.CollectConfig(
        targets=[collect_config.TargetConfig(url=u) for u in urls], interval_s=0.5, jitter_s=0
    )
    collector = collectors.Collector(config, sink)
    asyncio.run(collector.run(rounds=int(seconds * 2)))


@pytest.mark.slow
def test_stall_and_kv_leak_on_a_live_fleet(tmp_path: Any) -> None:
    node = simulator.NodeConfig(name="node-0", gpus=2)
    pods = [
        simulator.PodConfig(
            name=f"pod-{i}",
            dialect="vllm",
            model="llama-3-8b",
            node="node-0",
            gpus=[i],
            engine={"num_gpu_blocks": 2000},
        )
        for i in range(2)
    ]
    config = simulator.FleetConfig(nodes=[node], pods=pods, speed=1.0, seed=3)
    lock = threading.Lock()
    with simulator.Fleet(config) as fleet, Store(tmp_path / "live.duckdb") as store:
        urls = [p.url for p in fleet.pods] + [d.url for d in fleet.dcgm]
        arrivals = list(traces.poisson_arrivals(6.0, 40.0, seed=1, mean_output_tokens=400))
        client = load.LoadConfig(targets=[p.url for p in fleet.pods], max_output_tokens=2000)
        loader = threading.Thread(target=load.run_load_sync, args=(client, arrivals), daemon=True)
        loader.start()
        collector = threading.Thread(target=_collect, args=(store, urls, 30, lock))
        collector.start()
        time.sleep(6)
        fleet.set_fault("pod-0", "stall")
        time.sleep(2)
        fleet.set_fault("pod-1", "kv_leak", blocks_per_s=80)  # 4 % of the pool per second
        collector.join(timeout=120)
        pod0, pod1 = fleet.pods[0].instance, fleet.pods[1].instance
        gpu_pods = {"pod-0": pod0, "pod-1": pod1}
    jobs_config = JobsConfig(
        detectors=DetectorConfig(stall_for_s=4, lookback_s=60, gpu_pods=gpu_pods),
        flags=FlagPolicy(dwell_s=30),
        kv_stale_s=5,
    )
    sink = ListTransitionSink()
    with Store(tmp_path / "live.duckdb") as store:
        jobs = SloJobs(store.con, MODEL, jobs_config, sink=sink)
        stamps = [
            row[0]
            for row in store.con.execute(
                "SELECT DISTINCT ts_ms FROM engine_samples ORDER BY 1"
            ).fetchall()
        ]
        stalls: dict[str, dict[str, Any]] = {}
        for ts in stamps:
            result = jobs.run_once(ts)
            assert result is not None and result.errors == []
            stalls.update(
                {
                    f.scope_id: f.evidence
                    for f in result.findings
                    if f.signal == "stall" and f.scope == "instance"
                }
            )
    assert set(stalls) == {pod0}
    assert stalls[pod0]["running_min"] > 0
    mine = [t for t in sink.transitions if t.scope == "instance" and t.scope_id == pod1]
    assert [(t.from_level, t.to_level) for t in mine] == [(0, 1), (1, 2), (2, 3)]
    assert not [t for t in sink.transitions if t.scope_id == pod0]
