"""End to end with names people use: a simulated fleet discovered through file_sd (pods
labelled ``pod-N``), a tap named ``pod-0`` in front of pod-0, real collectors → DuckDB → SLO
jobs. Findings name ``pod-N`` and the detectors still pair what they join by instance:

* ghosts: the tap's records of pod-0 (tokens after disconnect, drain mode) with pod-0's
  engine samples from the scrape;
* GPU evidence of a stall: DCGM's ``pod`` label with the engine's instance, with no
  ``gpu_pods`` mapping configured.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import simulator
import simulator.load as load
import simulator.traces as traces
from collectors.collector import Collector
from collectors.config import CollectConfig
from collectors.tap.config import TapConfig
from collectors.tap.proxy import TapProxy
from collectors.tap.sinks import ListSink, rows_to_table
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS, RecordSchema
from pipeline.store import Store
from slo.flags import FlagPolicy
from slo.jobs import JobsConfig, SloJobs
from slo.signals.detectors import DetectorConfig
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
SECONDS = 14.0


async def _tap_and_collect(
    store: Store, lock: threading.Lock, file_sd: Path, pod0_url: str, tapped: ListSink
) -> str:
    def sink(schema: RecordSchema, table: pa.Table) -> None:
        with lock:
            store.commit_batch({schema.table: [table]}, group_id="n", offsets={}, now_ts_ms=0)

    tap = TapProxy(
        TapConfig(
            listen="127.0.0.1:0",
            upstreams=[pod0_url],
            instance="pod-0",
            kafka=False,
            drain_max_s=2.0,
            gauge_interval_s=0.5,
        ),
        tapped,
    )
    port = await tap.start()
    collector = Collector(CollectConfig(file_sd=[str(file_sd)], interval_s=0.5, jitter_s=0), sink)
    load_config = load.LoadConfig(
        targets=[f"http://127.0.0.1:{port}"], cancel_after_s=0.3, max_output_tokens=2000
    )
    arrivals = list(traces.poisson_arrivals(4.0, SECONDS - 4, seed=2, mean_output_tokens=400))
    try:
        await asyncio.gather(
            collector.run(rounds=int(SECONDS * 2)),
            load.run_load(load_config, arrivals, keep_results=False),
        )
    finally:
        await tap.stop()
    return f"127.0.0.1:{port}"


@pytest.mark.slow
def test_findings_name_pods_and_detectors_pair_engine_tap_and_gpu(tmp_path: Path) -> None:
    node = simulator.NodeConfig(name="node-0", gpus=2)
    pods = [
        simulator.PodConfig(
            name=f"pod-{i}", dialect="vllm", model="llama-3-8b", node="node-0", gpus=[i]
        )
        for i in range(2)
    ]
    config = simulator.FleetConfig(nodes=[node], pods=pods, speed=1.0, seed=5)
    lock, tapped = threading.Lock(), ListSink()
    file_sd = tmp_path / "targets.json"
    with simulator.Fleet(config) as fleet, Store(tmp_path / "named.duckdb") as store:
        file_sd.write_text(json.dumps(fleet.file_sd()), encoding="utf-8")
        fleet.set_fault("pod-0", "ghost")
        stall_later = threading.Timer(3.0, fleet.set_fault, args=("pod-1", "stall"))
        steady = list(traces.poisson_arrivals(3.0, SECONDS - 2, seed=4, mean_output_tokens=400))
        direct = load.LoadConfig(targets=[fleet.pods[1].url], max_output_tokens=2000)
        loader = threading.Thread(target=load.run_load_sync, args=(direct, steady), daemon=True)
        loader.start()
        stall_later.start()
        asyncio.run(_tap_and_collect(store, lock, file_sd, fleet.pods[0].url, tapped))
        addresses = {p.name: p.instance for p in fleet.pods}
        with lock:
            store.commit_batch(
                {
                    "requests": [rows_to_table(REQUEST_RECORDS, tapped.requests)],
                    "engine_samples": [rows_to_table(ENGINE_SAMPLES, tapped.samples)],
                },
                group_id="n",
                offsets={},
                now_ts_ms=0,
            )
    jobs_config = JobsConfig(
        detectors=DetectorConfig(stall_for_s=4, lookback_s=60),  # no gpu_pods mapping
        flags=FlagPolicy(dwell_s=30),
        kv_stale_s=5,
    )
    findings: dict[tuple[str, str], dict[str, Any]] = {}
    with Store(tmp_path / "named.duckdb") as store:
        served = store.con.execute(
            "SELECT DISTINCT instance, address FROM requests ORDER BY 1"
        ).fetchall()
        jobs = SloJobs(store.con, MODEL, jobs_config)
        stamps = [
            row[0]
            for row in store.con.execute(
                "SELECT DISTINCT ts_ms FROM engine_samples WHERE dialect <> 'tap' ORDER BY 1"
            ).fetchall()
        ]
        for ts in stamps:
            result = jobs.run_once(ts)
            assert result is not None and result.errors == []
            findings.update({(f.signal, f.scope_id): f.evidence for f in result.findings})
    assert served == [("pod-0", addresses["pod-0"])]
    scopes = {scope for _, scope in findings}
    assert scopes and not [s for s in scopes if "127.0.0.1" in s], findings
    assert findings[("ghost_requests", "pod-0")]["tokens_after_disconnect"] > 0
    stall = findings[("stall", "pod-1")]
    assert "gpu_engine_active_mean" in stall, stall  # DCGM pod="pod-1" joined by name
