"""Differential, end to end: a real Prometheus evaluating the generated rules over the tap's
``/metrics`` and llmslo's own jobs over the same tap's records in DuckDB agree on the page
alerts of the same SLOs during a faulted run.

Setup (all real, on loopback): a simulated vLLM pod; ``llmslo tap`` in front of it
(``--max-attempts 1``, so the rule's attempt counter and the jobs' per-request count are
the same events), publishing records to the embedded broker and serving ``/metrics``;
the ``llmslo run`` pipeline (ingest + jobs, 1 s cycles) on a DuckDB file; Prometheus
(1 s scrapes and evaluations) with the rules ``llmslo rules generate`` writes for the spec;
steady load through the tap.

What is compared, precisely: the 30-day catalog is kept (no compressed period). Its
``page`` pair ``1h-5m`` (factor 14.4) is decided at two instants by both sides: after a
healthy minute (both silent: error ratio ~0 in both windows) and after about a minute of
``prefill_failure`` (every request fails before its first token: both fire, the 5m and 1h
windows hold only this run, so their error ratios are ~½ ≫ 0.144). Besides the alert
states, the 5m error ratios of the two sides are compared within 0.15 (Prometheus
extrapolates ``rate`` and the jobs count whole minutes, so they differ at the edges).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alerts import load_rule_model, render_bundle, write_all
from llmslo.run import Pipeline
from llmslo.sections import parse_config
from pipeline.bus import Bus
from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from slo.queries import slo_status
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.alerts.conftest import eventually, free_port
from tests.conftest import require_tool

POOL = "llama-3-8b"
SPEC = {
    "version": "llmslo/v1",
    "service": "diff",
    "slos": [
        {
            "name": "ttft",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0, "source": "tap"},
            "group_by": ["pool"],
        },
        {"name": "availability", "objective": 0.99, "sli": {"kind": "availability"},
         "group_by": ["pool"]},
    ],
}  # fmt: skip
SLO_IDS = ("diff-ttft", "diff-availability")
PAIR = "page-1h-5m"


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def prometheus_binary() -> str:
    return require_tool("prometheus")


@pytest.fixture
def rig(bus: Bus, tmp_path: Path, prometheus_binary: str) -> Iterator[dict[str, Any]]:
    """Fleet, tap, pipeline and Prometheus, started; yields their handles and URLs."""
    spec = tmp_path / "slo.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    model = load_rule_model(spec)
    assert model.skipped == ()  # both SLOs are exact rules now
    rules = tmp_path / "rules.yml"
    write_all(render_bundle(model, rules))
    raw = {
        "bus": {"bootstrap_servers": bus.bootstrap_servers, "topic_prefix": bus.prefix,
                "partitions": bus.config.partitions},
        "store": {"path": str(tmp_path / "run.duckdb")},
        "ingest": {"group_id": f"diff-{bus.prefix}", "batch_max_ms": 200},
        "slo": {"spec": str(spec), "interval_s": 1},
        "tap": {"flush_interval_s": 0.2},
    }  # fmt: skip
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(raw))
    fleet_config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=1)],
        pods=[PodConfig(name="pod-0", model=POOL, node="node-0", gpus=[0])],
        seed=7,
    )
    with Fleet(fleet_config) as fleet:
        tap_port, tap_metrics = free_port(), free_port()
        tap = subprocess.Popen(
            [sys.executable, "-m", "llmslo", "tap", "-c", str(tmp_path / "llmslo.yaml"),
             "--listen", f"127.0.0.1:{tap_port}", "--upstream", fleet.pod("pod-0").url,
             "--metrics-port", str(tap_metrics), "--max-attempts", "1"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "tap.log").open("wb"),
        )  # fmt: skip
        pipeline = Pipeline(parse_config(raw), build_model(parse_spec(SPEC))).start()
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": [
                        {
                            "job_name": "taps",
                            "honor_labels": True,
                            "static_configs": [
                                {"targets": [f"127.0.0.1:{tap_metrics}"], "labels": {"pool": POOL}}
                            ],
                        }
                    ],
                }
            )
        )
        prometheus = subprocess.Popen(
            [prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"),
        )  # fmt: skip
        prom = f"http://127.0.0.1:{prom_port}"
        try:
            assert eventually(lambda: _http_ok(f"{prom}/-/ready"), 30)
            assert eventually(lambda: _http_ok(f"http://127.0.0.1:{tap_port}/health"), 30), (
                tmp_path / "tap.log"
            ).read_text()[-2000:]
            yield {"fleet": fleet, "pipeline": pipeline, "prometheus": prom,
                   "tap": f"http://127.0.0.1:{tap_port}"}  # fmt: skip
        finally:
            for process in (prometheus, tap):
                process.terminate()
                process.wait(timeout=30)
            pipeline.stop()


def _prometheus_side(url: str) -> dict[str, tuple[bool, float | None]]:
    """SLO id → (page 1h-5m firing, recorded 5m error ratio) in Prometheus."""
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    firing = {a["labels"]["slo_id"] for a in alerts
              if a["state"] == "firing" and a["labels"].get("window") == "1h-5m"}  # fmt: skip
    result = httpx.get(
        f"{url}/api/v1/query", params={"query": "slo:sli_error:ratio_rate5m"}, timeout=5
    ).json()["data"]["result"]
    ratios = {r["metric"]["slo_id"]: float(r["value"][1]) for r in result}
    return {slo: (slo in firing, ratios.get(slo)) for slo in SLO_IDS}


def _llmslo_side(pipeline: Pipeline) -> dict[str, tuple[bool, float | None]]:
    """SLO id → (page 1h-5m alerting, 5m error ratio) in the jobs' last evaluation."""
    table = slo_status(pipeline.store.con.cursor())
    out: dict[str, tuple[bool, float | None]] = {}
    for row in table.to_pylist():
        status = json.loads(row["status_json"])
        pair = next(p for p in status["pairs"] if p["id"] == PAIR)
        out[row["slo_id"]] = (pair["alerting"], pair["short_burn"] * (1 - row["objective"]))
    return out


def _agree(rig: dict[str, Any], firing: bool, timeout_s: float) -> dict[str, Any]:
    """Wait until both sides show ``firing`` for every SLO; returns both views."""

    def both() -> dict[str, Any] | None:
        prom, ours = _prometheus_side(rig["prometheus"]), _llmslo_side(rig["pipeline"])
        views = {"prometheus": prom, "llmslo": ours}
        if all(slo in ours and prom[slo][0] == ours[slo][0] == firing for slo in SLO_IDS):
            return views
        return None

    views = eventually(both, timeout_s)
    assert views, {
        "prometheus": _prometheus_side(rig["prometheus"]),
        "llmslo": _llmslo_side(rig["pipeline"]),
    }
    for slo in SLO_IDS:
        prom_ratio, our_ratio = views["prometheus"][slo][1], views["llmslo"][slo][1]
        assert prom_ratio is not None and our_ratio is not None, views
        assert abs(prom_ratio - our_ratio) <= 0.15, views
    return views


def _load(tap: str, stop: threading.Event, rate_per_s: float = 4.0) -> None:
    """Streamed chat completions at ``rate_per_s``, each body read to its end (as the OpenAI
    SDK does; the simulator's load client hangs up after ``[DONE]``, which the tap records
    as a client cancel, so it is not used here)."""

    def one(client: httpx.Client) -> None:
        body = {"model": POOL, "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": "hello " * 64}]}  # fmt: skip
        # A failure is what the tap records and both sides count: nothing to do here.
        with contextlib.suppress(httpx.HTTPError):
            client.post(f"{tap}/v1/chat/completions", json=body, timeout=30).read()

    with httpx.Client() as client, ThreadPoolExecutor(16) as pool:
        while not stop.wait(1 / rate_per_s):
            pool.submit(one, client)


@pytest.mark.slow
def test_prometheus_rules_and_the_jobs_agree_on_page_alerts(rig: dict[str, Any]) -> None:
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(rig["tap"], stop))
    loader.start()
    try:
        time.sleep(45)  # a healthy stretch: TTFT well under 2 s, every request ok
        healthy = _agree(rig, firing=False, timeout_s=30)
        rig["fleet"].set_fault("pod-0", "prefill_failure", fraction=1.0)
        time.sleep(30)
        faulted = _agree(rig, firing=True, timeout_s=60)
    finally:
        stop.set()
        loader.join(timeout=60)
    assert all(ratio < 0.05 for _, ratio in healthy["llmslo"].values()), healthy
    assert all(ratio > 0.144 for _, ratio in faulted["llmslo"].values()), faulted
