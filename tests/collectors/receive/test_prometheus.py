"""A real Prometheus scrapes simulated pods and remote-writes to the receiver, while the
collector scrapes the same pods: both paths give the same series and values; a Prometheus
restart mid-run loses and doubles nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.receive.config import ReceiveConfig
from pipeline.broker import EmbeddedBroker, free_port
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, RecordSchema
from pipeline.store import Store
from tests.collectors.receive.running import running_receiver
from tests.collectors.test_collect import ingest_until
from tests.conftest import require_tool

TOKEN = "prometheus-token"
# derived per scrape by each path's own canonicalizer (not values the pods served)
DERIVED = ("counter_reset", "gauges_unchanged_s")


@pytest.fixture
def fleet() -> Iterator[Any]:
    import simulator

    config = simulator.FleetConfig(
        nodes=[simulator.NodeConfig(name="node-0", gpus=2)],
        pods=[
            simulator.PodConfig(name=f"pod-{i}", dialect=d, node="node-0", gpus=[i])
            for i, d in enumerate(["vllm", "sglang"])
        ],
        speed=20.0,
        seed=0,
    )
    with simulator.Fleet(config) as running:
        yield running


class Prometheus:
    """``/usr/bin/prometheus`` on loopback with a temporary config and TSDB."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        targets: list[str],
        write_port: int,
        token: str | None = TOKEN,
        max_samples_per_send: int = 2000,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [{"job_name": "sim", "static_configs": [{"targets": targets}]}],
            "remote_write": [
                {
                    "url": f"http://127.0.0.1:{write_port}/api/v1/write",
                    "queue_config": {
                        "batch_send_deadline": "500ms",
                        "max_samples_per_send": max_samples_per_send,
                        "min_backoff": "100ms",
                        "max_backoff": "1s",
                    },
                    "write_relabel_configs": [
                        {
                            "source_labels": ["__name__"],
                            "regex": "up|scrape_duration_seconds|vllm:.*|sglang:.*|DCGM_.*"
                            "|process_start_time_seconds",
                            "action": "keep",
                        }
                    ],
                }
            ],
        }
        if token is not None:
            config["remote_write"][0]["authorization"] = {"credentials": token}
        (workdir / "prometheus.yml").write_text(json.dumps(config))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "prometheus.log").open("ab"),
        )

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()  # graceful: flushes the remote-write queue
        self.process.wait(60)

    def query_stopped(self, expr: str) -> list[dict[str, Any]]:
        """``expr`` over the TSDB of this (stopped) Prometheus, restarted with nothing to
        scrape and nowhere to write: what it held when it stopped, the scrapes it flushed to
        the receiver on stopping included (a query before stopping misses a scrape taken
        between the query and the stop)."""
        config = self.workdir / "prometheus.yml"
        running = config.read_text()
        config.write_text(json.dumps({"global": {"scrape_interval": "1s"}}))
        self.start()
        try:
            return self.query(expr)
        finally:
            self.stop()
            config.write_text(running)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
                return list(body["data"]["result"])
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


def _complete(url: str) -> None:
    body = json.dumps({"model": "llama-3-8b", "prompt": "hello", "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=30).read()


def _identities(rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    return {row[:6] for row in rows}


def test_prometheus_remote_write_matches_the_collector_and_survives_a_restart(
    fleet: Any, bus: Bus, store: Store, tmp_path: Path
) -> None:
    binary = require_tool("prometheus")
    urls = [p.url for p in fleet.pods] + [fleet.dcgm[0].url]
    addresses = [urllib.parse.urlsplit(u).netloc for u in urls]
    scraped: list[tuple[RecordSchema, pa.Table]] = []
    collector = Collector(
        CollectConfig(
            targets=[TargetConfig(url=u + "/metrics") for u in urls],
            interval_s=1.0,
            readiness_interval_s=0,
        ),
        lambda schema, table: scraped.append((schema, table)),
    )
    config = ReceiveConfig(port=0, bearer_token=TOKEN)
    with running_receiver(bus, config) as service:
        assert service.port is not None
        prometheus = Prometheus(binary, tmp_path, addresses, service.port)
        prometheus.start()
        scraping = threading.Thread(target=lambda: asyncio.run(collector.run(rounds=18)))
        scraping.start()
        for _ in range(4):  # load, so counters and histograms move
            for pod in fleet.pods:
                _complete(pod.url)
            time.sleep(1.0)
        prometheus.stop()  # restarted mid-run: its WAL is replayed on start
        time.sleep(1.0)
        prometheus.start()
        for _ in range(3):
            for pod in fleet.pods:
                _complete(pod.url)
            time.sleep(1.0)
        scraping.join(60)  # then idle: the last scrapes of both paths see the same values
        time.sleep(3.0)
        prometheus.stop()
        time.sleep(1.0)
        scrapes = {
            r["metric"]["instance"]: int(float(r["value"][1]))
            for r in prometheus.query_stopped("count_over_time(up[10m])")
        }
    # nothing lost, nothing doubled: one target_health row per scrape in Prometheus' own TSDB
    # (across the restart), and every row the receiver published reaches DuckDB
    ingest_until(bus, store, {"target_health": sum(scrapes.values())})
    columns = "instance, metric, signal, kind, le, labels_json, ts_ms, value"
    received = {
        "engine": store.con.execute(
            f"SELECT {columns} FROM engine_samples WHERE signal NOT IN {DERIVED}"
        ).fetchall(),
        "gpu": store.con.execute(
            "SELECT instance, metric, signal, 'gauge', NULL, labels_json, ts_ms, value"
            " FROM gpu_samples"
        ).fetchall(),
    }
    # stored once: no series has two rows at one timestamp
    for rows in received.values():
        keys = [(r[0], r[1], r[4], r[5], r[6]) for r in rows]
        assert len(keys) == len(set(keys)) and rows
    ours = _scraped_rows(scraped)
    for topic in ("engine", "gpu"):
        assert _identities(received[topic]) == _identities(ours[topic]), topic
        last_received, last_scraped = _last_values(received[topic]), _last_values(ours[topic])
        assert last_received == last_scraped, topic
    instances = {r[0] for r in received["engine"]} | {r[0] for r in received["gpu"]}
    assert instances == set(addresses)
    assert set(scrapes) == set(addresses)


def _scraped_rows(scraped: list[tuple[RecordSchema, pa.Table]]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {"engine": [], "gpu": []}
    for schema, table in scraped:
        rows = table.to_pylist()
        if schema is ENGINE_SAMPLES:
            out["engine"] += [
                (
                    r["instance"],
                    r["metric"],
                    r["signal"],
                    r["kind"],
                    r["le"],
                    r["labels_json"],
                    r["ts_ms"],
                    r["value"],
                )
                for r in rows
                if r["signal"] is not None and r["signal"] not in DERIVED
            ]
        elif schema is GPU_SAMPLES:
            out["gpu"] += [
                (
                    r["instance"],
                    r["metric"],
                    r["signal"],
                    "gauge",
                    None,
                    r["labels_json"],
                    r["ts_ms"],
                    r["value"],
                )
                for r in rows
                if r["signal"] is not None
            ]
    return out


def _last_values(rows: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], float]:
    last: dict[tuple[Any, ...], tuple[int, float]] = {}
    for row in rows:
        key, ts, value = row[:6], row[6], row[7]
        if key not in last or ts > last[key][0]:
            last[key] = (ts, value)
    return {key: round(value, 9) for key, (_, value) in last.items()}


def test_a_full_bus_answers_503_and_prometheus_retries_until_everything_is_stored_once(
    fleet: Any, tmp_path: Path
) -> None:
    binary = require_tool("prometheus")
    port = free_port()
    broker = EmbeddedBroker(port=port).start()
    bus_config = BusConfig(bootstrap_servers=broker.bootstrap_servers, topic_prefix="r.")
    config = ReceiveConfig(port=0, buffer_max_rows=1500, publish_timeout_s=2.0)
    addresses = [urllib.parse.urlsplit(fleet.pods[0].url).netloc]
    try:
        with Bus(bus_config) as bus, running_receiver(bus, config) as service:
            bus.ensure_topics()
            assert service.port is not None
            prometheus = Prometheus(
                binary, tmp_path, addresses, service.port, token=None, max_samples_per_send=500
            )
            prometheus.start()
            time.sleep(3.0)
            # Kafka unresponsive (its process frozen, its log kept): the buffer fills and
            # writes are answered 503
            assert broker.pid is not None
            os.kill(broker.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 30
            while _requests(service, "503") < 3 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert _requests(service, "503") >= 3
            os.kill(broker.pid, signal.SIGCONT)
            # Prometheus backs off and resends; the buffer drains
            deadline = time.monotonic() + 40
            while (
                service.buffer.rows or _requests(service, "204") < 10
            ) and time.monotonic() < deadline:
                time.sleep(1.0)
            assert service.buffer.rows < config.buffer_max_rows
            prometheus.stop()
            time.sleep(1.0)
            scrapes = sum(
                int(float(r["value"][1]))
                for r in prometheus.query_stopped("count_over_time(up[10m])")
            )
        with Bus(bus_config) as bus, Store(tmp_path / "llmslo.duckdb") as store:
            ingest_until(bus, store, {"target_health": scrapes})
            dup = store.con.execute(
                "SELECT count(*) - count(DISTINCT (metric, labels_json, le, ts_ms))"
                " FROM engine_samples"
            ).fetchone()
            assert dup == (0,)
    finally:
        if broker.pid is not None:
            os.kill(broker.pid, signal.SIGCONT)
        broker.stop()


def _requests(service: Any, code: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "llmslo_receive_requests_total", {"door": "remote_write", "code": code}
    )
    return value or 0.0
