"""The scrape loop end to end: simulator → collector → Kafka → DuckDB; hangs; file_sd; outages."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from collectors.canonical import TargetCanonicalizer
from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.discovery import TargetDiscovery
from collectors.exposition import ExpositionParser
from collectors.metrics import CollectorMetrics
from pipeline.broker import EmbeddedBroker, free_port
from pipeline.bus import Bus
from pipeline.config import BusConfig, IngestConfig
from pipeline.ingest import Ingester
from pipeline.publisher import KafkaPublisher, PublishBuffer, PublishMetrics
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, RecordSchema
from pipeline.store import Store
from tests.collectors.examples import vllm_exposition
from tests.collectors.piecewise import MODES, Page, PiecewiseServer


def ingest_until(bus: Bus, store: Store, rows: dict[str, int], timeout_s: float = 60.0) -> None:
    """Run one ingester until each table holds its expected rows (or fail after ``timeout_s``)."""
    ingester = Ingester(bus, store, IngestConfig(group_id="collectors-test", batch_max_ms=100))
    worker = threading.Thread(target=ingester.run, daemon=True)
    worker.start()
    deadline = time.monotonic() + timeout_s

    def behind() -> bool:
        return any(ingester.stats.rows_by_table.get(t, 0) < n for t, n in rows.items())

    try:
        while behind() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        ingester.stop()
        worker.join(30)
    for table, expected in rows.items():
        assert store.count(table) == expected, (
            f"{table}: {store.count(table)} rows, expected {expected}"
        )


def served_samples(url: str) -> list[tuple[str, float | None, float]]:
    """(sample name, le, value) of every sample, read with prometheus-client from the endpoint."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return [
        (s.name, float(s.labels["le"]) if "le" in s.labels else None, float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


# -- end to end against the simulator ---------------------------------------------------------
@pytest.fixture
def fleet() -> Iterator[Any]:
    import simulator

    config = simulator.FleetConfig(
        nodes=[simulator.NodeConfig(name="node-0", gpus=4)],
        pods=[
            simulator.PodConfig(
                name=f"pod-{i}", dialect=d, model="llama-3-8b", node="node-0", gpus=[i]
            )
            for i, d in enumerate(["vllm", "vllm-legacy", "sglang", "trtllm"])
        ],
        speed=20.0,
        seed=0,
    )
    with simulator.Fleet(config) as running:
        yield running


def _complete(url: str) -> None:
    body = json.dumps({"model": "llama-3-8b", "prompt": "hello", "max_tokens": 8}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=30).read()


def test_every_simulator_dialect_reaches_duckdb_with_the_served_values(
    fleet: Any, bus: Bus, store: Store
) -> None:
    for pod in fleet.pods:
        for _ in range(3):
            _complete(pod.url)
    time.sleep(1.0)  # let the pods go idle so the scrape and the reference read agree
    # every body crosses a server that writes it in random pieces, framings and encodings
    # (one server per target: the instance is the scraped host:port)
    with contextlib.ExitStack() as stack:
        urls = [p.url + "/metrics" for p in fleet.pods] + [fleet.dcgm[0].url + "/metrics"]
        servers = [stack.enter_context(PiecewiseServer(seed=i)) for i in range(len(urls))]
        for server, (mode_index, url) in zip(servers, enumerate(urls), strict=True):
            server.proxy("/metrics", url, mode=MODES[mode_index % len(MODES)])
        targets = [TargetConfig(url=server.url()) for server in servers]
        config = CollectConfig(targets=targets, interval_s=0.5, jitter_s=0.05, timeout_s=10)
        rounds: list[tuple[RecordSchema, pa.Table]] = []
        producer = bus.producer()
        collector = Collector(config, lambda schema, table: rounds.append((schema, table)))
        asyncio.run(collector.run(rounds=1))
        assert {mode for server in servers for _, mode in server.requests} == set(MODES)
    for schema, table in rounds:
        producer.publish(schema, table)
    producer.flush(30)
    producer.close()
    engine_rows = sum(t.num_rows for s, t in rounds if s is ENGINE_SAMPLES)
    assert {h.dialect for h in collector.health.values()} == {
        "vllm",
        "vllm-legacy",
        "sglang",
        "trtllm",
        "dcgm",
    }
    assert all(h.up and h.bad_lines == 0 for h in collector.health.values())
    gpu_rows = sum(t.num_rows for s, t in rounds if s is GPU_SAMPLES)
    ingest_until(bus, store, {"engine_samples": engine_rows, "gpu_samples": gpu_rows})
    expected_signals = {
        "vllm": {"running", "waiting", "kv_usage", "generation_tokens", "ttft", "itl", "tpot"}
        | {"prefix_cache_queries", "prefix_cache_hits"},
        "vllm-legacy": {"running", "waiting", "kv_usage", "generation_tokens", "ttft", "itl"}
        | {"prefix_cache_queries", "prefix_cache_hits"},
        "sglang": {"running", "waiting", "kv_usage", "ttft", "itl", "prefix_cache_hit_rate"},
        "trtllm": {"running", "waiting", "kv_usage"},
    }
    instances = {t.url: t.instance for t in targets}
    for pod, target in zip(fleet.pods, targets, strict=False):
        stored = store.con.execute(
            "SELECT metric, engine, le, value, signal, dialect FROM engine_samples"
            " WHERE instance = ? AND signal IS NOT NULL",
            [instances[target.url]],
        ).fetchall()
        dialect = stored[0][5]
        assert expected_signals[dialect] <= {row[4] for row in stored}, dialect
        derived = ("gauges_unchanged_s", "counter_reset")
        ours = Counter(
            (m, le, round(v, 9)) for m, _, le, v, signal, _ in stored if signal not in derived
        )
        names = {key[0] for key in ours}
        served = served_samples(pod.url + "/metrics")
        # prometheus-client appends _total to counters exposed without it (Triton's);
        # we keep raw names
        raw = [(m if m in names else m.removesuffix("_total"), le, v) for m, le, v in served]
        theirs = Counter((m, le, round(v, 9)) for m, le, v in raw if m in names)
        not_served = ours - theirs  # every canonical value stored was served, with its le
        assert not not_served, (dialect, list(not_served)[:5])
        assert sum(ours.values()) >= 5, dialect
    gpu = store.con.execute(
        "SELECT DISTINCT signal FROM gpu_samples WHERE signal IS NOT NULL"
    ).fetchall()
    assert {"gpu_util", "fb_used_mib", "xid"} <= {row[0] for row in gpu}
    dcgm_rows = store.con.execute(
        "SELECT metric, value FROM gpu_samples WHERE signal IS NOT NULL"
    ).fetchall()
    served_dcgm = Counter(
        (m, round(v, 6)) for m, _, v in served_samples(fleet.dcgm[0].url + "/metrics")
    )
    stored_dcgm = Counter((m, round(v, 6)) for m, v in dcgm_rows)
    assert not stored_dcgm - served_dcgm and len(dcgm_rows) >= 8


# -- a hanging target -------------------------------------------------------------------------
def test_a_hanging_target_does_not_delay_the_others() -> None:
    async def scenario() -> tuple[Collector, list[pa.Table]]:
        fast_text = vllm_exposition()
        release = asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            if request.path == "/hang":
                await release.wait()
            return web.Response(text=fast_text)

        app = web.Application()
        app.router.add_get("/{name}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        # the fast targets write their bodies in random pieces (all framings and encodings)
        pieces = PiecewiseServer({f"/fast{i}": Page(body=fast_text) for i in range(5)})
        targets = [TargetConfig(url=f"127.0.0.1:{port}/hang")] + [
            TargetConfig(url=pieces.url(f"/fast{i}")) for i in range(5)
        ]
        tables: list[pa.Table] = []
        collector = Collector(
            CollectConfig(targets=targets, timeout_s=2.0, jitter_s=0),
            # the engine samples (each round also hands over one target_health table)
            lambda schema, table: tables.append(table) if schema is ENGINE_SAMPLES else None,
        )
        with pieces:
            async with __import__("aiohttp").ClientSession() as session:
                await collector.scrape_round(session)
        release.set()
        await runner.cleanup()
        return collector, tables

    collector, tables = asyncio.run(scenario())
    health = collector.health
    hung = next(h for url, h in health.items() if url.endswith("/hang"))
    assert not hung.up and hung.last_error is not None and hung.last_error.startswith("timeout")
    registry = collector.metrics.registry
    hung_target = hung.url
    assert (
        registry.get_sample_value(
            "llmslo_collect_scrape_errors_total", {"target": hung_target, "reason": "timeout"}
        )
        == 1.0
    )
    fast = [h for url, h in health.items() if not url.endswith("/hang")]
    assert all(h.up and h.duration_s is not None and h.duration_s < 1.5 for h in fast)
    assert len(tables) == 1 and tables[0].num_rows == 5 * len(
        ExpositionParser().parse(vllm_exposition())
    )


# -- file discovery -----------------------------------------------------------------------------
def test_file_sd_is_reloaded_when_it_changes_and_a_broken_file_keeps_its_targets(
    tmp_path: Path,
) -> None:
    sd = tmp_path / "targets.json"
    sd.write_text(
        json.dumps([{"targets": ["10.0.0.1:8000"], "labels": {"dialect": "vllm", "pool": "p"}}])
    )
    now = [0.0]
    discovery = TargetDiscovery(
        CollectConfig(
            targets=[TargetConfig(url="10.0.0.9:9400")],
            file_sd=[str(tmp_path / "*.json")],
            file_sd_refresh_s=5,
        ),
        clock=lambda: now[0],
    )
    first = discovery.targets()
    assert [t.url for t in first] == [
        "http://10.0.0.9:9400/metrics",
        "http://10.0.0.1:8000/metrics",
    ]
    assert first[1].dialect == "vllm" and first[1].pool == "p"
    sd.write_text(
        "- targets: ['10.0.0.1:8000', '10.0.0.2:8000']\n"
        "  labels: {__metrics_path__: /prometheus/metrics}\n"
    )
    assert len(discovery.targets()) == 2  # not re-read before file_sd_refresh_s
    now[0] = 10.0
    assert [t.url for t in discovery.targets()][1:] == [
        "http://10.0.0.1:8000/prometheus/metrics",
        "http://10.0.0.2:8000/prometheus/metrics",
    ]
    sd.write_text('[{"targets": [')
    now[0] = 20.0
    assert len(discovery.targets()) == 3 and str(sd) in discovery.errors


# -- a broker outage ------------------------------------------------------------------------------
_ROUND_TEXT = vllm_exposition(seed=3)


def _batch(canonicalizer: TargetCanonicalizer, parser: ExpositionParser, ts_ms: int) -> pa.Table:
    return canonicalizer.canonicalize(parser.parse(_ROUND_TEXT), ts_ms).table


def test_broker_outage_loses_nothing_within_the_buffer_bound_and_counts_overflow(
    store: Store,
) -> None:
    port = free_port()
    canonicalizer, parser = TargetCanonicalizer("10.0.0.7:8000"), ExpositionParser()
    rows_per_round = _batch(canonicalizer, parser, 1).num_rows
    metrics = CollectorMetrics()
    buffer = PublishBuffer(
        max_rows=3 * rows_per_round,
        metrics=PublishMetrics("collect", metrics.registry),
        on_drop=metrics.count_drop,
    )
    broker = EmbeddedBroker(port=port).start()
    config = BusConfig(
        bootstrap_servers=broker.bootstrap_servers, topic_prefix="outage.", partitions=1
    )
    bus = Bus(config).start()
    try:
        bus.ensure_topics()
        publisher = KafkaPublisher(
            lambda: bus.producer(
                max_block_ms=2000,
                request_timeout_ms=2000,
                delivery_timeout_ms=4000,
                reconnect_backoff_max_ms=500,
            ),
            buffer,
            publish_timeout_s=2.0,
            backoff_s=0.2,
            backoff_max_s=1.0,
        ).start()
        buffer.put(ENGINE_SAMPLES, _batch(canonicalizer, parser, 1000))
        _wait(lambda: publisher.published_rows == rows_per_round, "first round published")

        broker.stop()  # the outage begins
        buffer.put(ENGINE_SAMPLES, _batch(canonicalizer, parser, 2000))
        _wait(lambda: len(buffer) == 0 and publisher.in_flight_rows > 0, "round 2 in flight")
        for ts in range(3000, 8000, 1000):  # five more rounds: two of them overflow the bound
            buffer.put(ENGINE_SAMPLES, _batch(canonicalizer, parser, ts))
        assert buffer.dropped_rows == 2 * rows_per_round
        assert (
            metrics.registry.get_sample_value(
                "llmslo_collect_dropped_total", {"reason": "buffer_full"}
            )
            == 2 * rows_per_round
        )
        assert (
            metrics.registry.get_sample_value(
                "llmslo_dropped_total", {"component": "collect", "reason": "buffer_full"}
            )
            == 2 * rows_per_round
        )

        broker = EmbeddedBroker(port=port).start()  # memory storage: a fresh, empty broker
        bus.ensure_topics()
        _wait(
            lambda: len(buffer) == 0 and publisher.in_flight_rows == 0,
            "buffer drained",
            timeout_s=90,
        )
        publisher.stop()
        publisher.close()
        ingest_until(bus, store, {"engine_samples": 4 * rows_per_round})
        kept = [
            row[0]
            for row in store.con.execute(
                "SELECT DISTINCT ts_ms FROM engine_samples ORDER BY ts_ms"
            ).fetchall()
        ]
        assert kept == [2000, 5000, 6000, 7000]  # the in-flight round and the newest three
        assert store.count("engine_samples") == 4 * rows_per_round  # nothing doubled
    finally:
        bus.stop()
        broker.stop()


def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.05)
