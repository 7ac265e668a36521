"""OTLP/HTTP metrics through a real receiver: the OpenTelemetry SDK's own OTLP/HTTP exporter
(the one vLLM uses) against the collector scraping a ``prometheus_client`` registry (vLLM's
``/metrics``) holding the same observations; OTLP JSON; malformed bodies."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import prometheus_client
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, UpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.receive.config import ReceiveConfig
from pipeline.bus import Bus
from pipeline.schema import ENGINE_SAMPLES, RecordSchema
from pipeline.store import Store
from tests.collectors.receive.running import running_receiver
from tests.collectors.test_collect import ingest_until

TOKEN = "otlp-token"
TTFT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
MODEL = {"model_name": "llama-3-8b"}
# one round of observations per export (and per scrape)
ROUNDS = [
    {"running": 3, "waiting": 2, "tokens": 40, "ttft": [0.02, 0.3, 0.07]},
    {"running": 1, "waiting": -1, "tokens": 25, "ttft": [0.6, 2.0]},
]
E2E = [0.3, 0.7, 1.5, 3.0]  # into an exponential histogram: one per power-of-two bucket
# derived by each path's canonicalizer per scrape, not values the engine served
DERIVED = ("counter_reset", "gauges_unchanged_s")


class Engine:
    """The same observations recorded twice: into a ``prometheus_client`` registry (what a
    scrape reads) and into OpenTelemetry SDK instruments exported over OTLP/HTTP."""

    def __init__(self, endpoint: str, temporality: AggregationTemporality, gzip: bool) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        r = self.registry
        labels = list(MODEL)
        self.p_running = prometheus_client.Gauge(
            "vllm:num_requests_running", "", labels, registry=r
        )
        self.p_waiting = prometheus_client.Gauge(
            "vllm:num_requests_waiting", "", labels, registry=r
        )
        self.p_tokens = prometheus_client.Counter("vllm:generation_tokens", "", labels, registry=r)
        self.p_ttft = prometheus_client.Histogram(
            "vllm:time_to_first_token_seconds", "", labels, buckets=TTFT_BUCKETS, registry=r
        )
        exporter = OTLPMetricExporter(
            endpoint=endpoint,
            headers={"Authorization": f"Bearer {TOKEN}"},
            compression=Compression.Gzip if gzip else Compression.NoCompression,
            preferred_temporality={
                Counter: temporality,
                UpDownCounter: temporality,
                Histogram: temporality,
            },
        )
        self.reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        resource = Resource.create(
            {"service.name": "vllm", "k8s.pod.name": "vllm-0", "k8s.namespace.name": "llm"}
        )
        self.provider = MeterProvider(
            metric_readers=[self.reader],
            resource=resource,
            views=[
                View(
                    instrument_name="vllm.e2e_request_latency",
                    aggregation=ExponentialBucketHistogramAggregation(),
                )
            ],
        )
        meter = self.provider.get_meter("vllm")
        self.o_running = meter.create_gauge("vllm.num_requests_running")
        self.o_waiting = meter.create_up_down_counter("vllm.num_requests_waiting")
        self.o_tokens = meter.create_counter("vllm.generation_tokens", unit="{token}")
        self.o_ttft = meter.create_histogram(
            "vllm.time_to_first_token",
            unit="s",
            explicit_bucket_boundaries_advisory=list(TTFT_BUCKETS),
        )
        self.o_e2e = meter.create_histogram("vllm.e2e_request_latency", unit="s")

    def observe(self, round_: dict[str, Any]) -> None:
        self.p_running.labels(**MODEL).set(round_["running"])
        self.o_running.set(round_["running"], MODEL)
        self.p_waiting.labels(**MODEL).inc(round_["waiting"])
        self.o_waiting.add(round_["waiting"], MODEL)
        self.p_tokens.labels(**MODEL).inc(round_["tokens"])
        self.o_tokens.add(round_["tokens"], MODEL)
        for value in round_["ttft"]:
            self.p_ttft.labels(**MODEL).observe(value)
            self.o_ttft.record(value, MODEL)

    def export(self) -> None:
        assert self.provider.force_flush(30_000)


def serve_text_format(registry: prometheus_client.CollectorRegistry) -> ThreadingHTTPServer:
    """``registry`` on ``/metrics`` in the 0.0.4 text format, whatever the scraper accepts.

    prometheus_client 0.26 escapes ``:`` to ``_`` in its OpenMetrics samples (``vllm_…``
    under a ``# TYPE vllm:…`` line), which no dialect map names; vLLM's own server answers
    the text format.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = prometheus_client.generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return [
        (r["instance"], r["metric"], r["signal"], r["kind"], r["le"], r["labels_json"], r["value"])
        for r in table.to_pylist()
        if r["signal"] is not None and r["signal"] not in DERIVED
    ]


@pytest.mark.parametrize(
    ("temporality", "gzipped"),
    [
        pytest.param(AggregationTemporality.CUMULATIVE, False, id="cumulative"),
        pytest.param(AggregationTemporality.DELTA, True, id="delta, gzip"),
    ],
)
def test_the_otel_sdk_exporter_gives_the_records_a_scrape_of_the_same_values_gives(
    bus: Bus, store: Store, temporality: AggregationTemporality, gzipped: bool
) -> None:
    scraped: list[tuple[RecordSchema, pa.Table]] = []
    config = ReceiveConfig(port=0, bearer_token=TOKEN)
    with running_receiver(bus, config) as service:
        engine = Engine(f"http://127.0.0.1:{service.port}/v1/metrics", temporality, gzipped)
        server = serve_text_format(engine.registry)
        try:
            collector = Collector(
                CollectConfig(
                    targets=[
                        TargetConfig(
                            url=f"127.0.0.1:{server.server_port}", labels={"pod": "vllm-0"}
                        )
                    ],
                    readiness_interval_s=0,
                ),
                lambda schema, table: scraped.append((schema, table)),
            )

            async def scrape_and_export() -> None:  # one loop: the collector keeps its session
                for round_ in ROUNDS:
                    engine.observe(round_)
                    scraped.clear()  # the last round's scrape is compared
                    await collector.run(rounds=1)
                    await asyncio.to_thread(engine.export)

            asyncio.run(scrape_and_export())
            for value in E2E:
                engine.o_e2e.record(value, MODEL)
            engine.export()
        finally:
            server.shutdown()
            engine.provider.shutdown()
        assert _otlp_requests(service, "200") >= 3
    ingest_until(bus, store, {"engine_samples": service.published_rows})
    received = store.con.execute(
        "SELECT instance, metric, signal, kind, le, labels_json, round(value, 9) FROM"
        f" engine_samples WHERE signal NOT IN {DERIVED} ORDER BY ts_ms, metric, le"
    ).fetchall()
    last_scrape = {
        row[:6]: round(row[6], 9)
        for schema, table in scraped
        if schema is ENGINE_SAMPLES
        for row in _rows(table)
    }
    # the same series, and each at the value the last scrape read (rows come in ts order)
    latest = {r[:6]: r[6] for r in received if r[2] != "e2e"}
    assert latest == last_scrape
    assert {r[0] for r in received} == {"vllm-0"}
    # the exponential histogram: classic buckets at powers of two, one observation in each
    e2e = {r[:6]: r[6] for r in received if r[2] == "e2e"}  # the shutdown exports it again
    buckets = sorted((key[4], value) for key, value in e2e.items() if key[3] == "bucket")
    assert buckets == [(0.0, 0), (0.5, 1), (1.0, 2), (2.0, 3), (4.0, 4), (float("inf"), 4)]
    assert sorted(v for key, v in e2e.items() if key[3] != "bucket") == [4, sum(E2E)]


def _otlp_requests(service: Any, code: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "llmslo_receive_requests_total", {"door": "otlp", "code": code}
    )
    return value or 0.0


def post_otlp(
    port: int | None, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/metrics",
        data=body,
        headers={"Content-Type": content_type} | (headers or {}),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _json_request(points: list[dict[str, Any]]) -> bytes:
    """An OTLP JSON body (the spec's encoding: camelCase, int64 as strings)."""
    resource = {
        "attributes": [
            {"key": "service.name", "value": {"stringValue": "sglang"}},
            {"key": "service.instance.id", "value": {"stringValue": "sglang-1"}},
        ]
    }
    metric = {"name": "sglang.num_running_reqs", "gauge": {"dataPoints": points}}
    return json.dumps(
        {"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": [metric]}]}]}
    ).encode()


def test_otlp_json_is_stored_and_a_refused_point_is_a_partial_success(
    bus: Bus, store: Store
) -> None:
    ok = {
        "timeUnixNano": "1764000000000000000",
        "asInt": "5",
        "attributes": [{"key": "model_name", "value": {"stringValue": "qwen"}}],
        "exemplars": [{"traceId": "5b8efff798038103d269b633813fc60c", "asDouble": 1.0}],
    }
    long_label = {
        "timeUnixNano": "1764000000000000000",
        "asDouble": 1.0,
        "attributes": [{"key": "x", "value": {"stringValue": "a" * 10_000}}],
    }
    with running_receiver(bus) as service:
        status, body = post_otlp(service.port, _json_request([ok, long_label]), "application/json")
    assert status == 200, body
    answer = json.loads(body)
    assert answer["partialSuccess"]["rejectedDataPoints"] in ("1", 1)
    assert "label_too_long: sglang:num_running_reqs" in answer["partialSuccess"]["errorMessage"]
    ingest_until(bus, store, {"engine_samples": service.published_rows})
    rows = store.con.execute(
        "SELECT ts_ms, instance, dialect, signal, value, model FROM engine_samples"
        f" WHERE signal NOT IN {DERIVED}"
    ).fetchall()
    assert rows == [(1_764_000_000_000, "sglang-1", "sglang", "running", 5.0, "qwen")]


MALFORMED = [
    pytest.param(
        b"\x0a\xff\xff\xff", "application/x-protobuf", {}, 400, "protobuf", id="truncated protobuf"
    ),
    pytest.param(
        b'{"resourceMetrics": [', "application/json", {}, 400, "json", id="truncated JSON"
    ),
    pytest.param(
        b'{"resourceMetrics": [{"scopeMetrics": 7}]}',
        "application/json",
        {},
        400,
        "json",
        id="JSON of the wrong shape",
    ),
    pytest.param(
        gzip.compress(b"\x00" * (65 * 1024 * 1024)),
        "application/x-protobuf",
        {"Content-Encoding": "gzip"},
        413,
        "decompressed_size",
        id="gzip bomb",
    ),
    pytest.param(
        b"\x1f\x8b\x08garbage",
        "application/x-protobuf",
        {"Content-Encoding": "gzip"},
        400,
        "gzip",
        id="corrupt gzip",
    ),
    pytest.param(
        gzip.compress(b" " * (9 * 1024 * 1024) + b"{}"),
        "application/json",
        {"Content-Encoding": "gzip"},
        413,
        "json_size",
        id="JSON past max_json_bytes",
    ),
    pytest.param(b"{}", "text/plain", {}, 415, "content_type", id="wrong content type"),
    pytest.param(
        b"{}",
        "application/json",
        {"Content-Encoding": "br"},
        415,
        "content_encoding",
        id="wrong content-encoding",
    ),
]


@pytest.mark.parametrize(("body", "content_type", "headers", "status", "reason"), MALFORMED)
def test_a_malformed_otlp_body_is_refused_with_its_reason_and_nothing_is_published(
    bus: Bus, body: bytes, content_type: str, headers: dict[str, str], status: int, reason: str
) -> None:
    with running_receiver(bus) as service:
        got, answer = post_otlp(service.port, body, content_type, headers)
        assert service.buffer.rows == 0
    assert got == status
    assert f"{reason}: ".encode() in answer, answer
    assert service.published_rows == 0
