"""The tap's own /metrics and its OpenTelemetry GenAI metrics and spans (in memory and OTLP)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import aiohttp
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from collectors.tap.telemetry import GenAiTelemetry
from tests.collectors.tap.fakes import CHAT, Script, ScriptedUpstream, post, stream_script, tap_over


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_endpoint_exposes_what_the_tap_measured() -> None:
    async def scenario() -> str:
        up = ScriptedUpstream(lambda req: stream_script(5, gap_s=0.002), models=["m"])
        async with tap_over([up]) as (url, _, proxy):
            await post(url, CHAT)
            server, _thread = start_http_server(0, "127.0.0.1", registry=proxy.metrics.registry)
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(f"http://127.0.0.1:{server.server_port}/metrics") as r,
                ):
                    return await r.text()
            finally:
                server.shutdown()

    text = asyncio.run(scenario())
    got = samples(text)
    instance = next(dict(k[1])["instance"] for k in got if k[0] == "llmslo_tap_ttft_seconds_count")
    labels = (("instance", instance), ("model", "m"))
    assert got[("llmslo_tap_ttft_seconds_count", labels)] == 1
    assert got[("llmslo_tap_tpot_seconds_count", labels)] == 1
    assert got[("llmslo_tap_itl_seconds_count", labels)] == 4
    counted = (("code", "200"), ("instance", instance), ("outcome", "ok"))
    assert got[("llmslo_tap_requests_total", counted)] == 1
    assert got[("llmslo_tap_in_flight", (("instance", instance),))] == 0
    assert got[("llmslo_tap_bytes_total", (("direction", "client"),))] > 0


def test_genai_semantic_convention_metrics_and_spans() -> None:
    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    genai = GenAiTelemetry(MeterProvider(metric_readers=[reader]), tracers)

    async def scenario() -> None:
        ok = ScriptedUpstream(lambda req: stream_script(4, gap_s=0.002), models=["m"])
        async with tap_over([ok], genai=genai) as (url, _, _):
            await post(url, CHAT)
        bad = ScriptedUpstream(lambda req: Script([], status=500))
        async with tap_over([bad], genai=genai, max_attempts=1) as (url, _, _):
            await post(url, CHAT)

    asyncio.run(scenario())
    data = reader.get_metrics_data()
    assert data is not None
    # The SDK types data points as a union of point kinds; these are histogram points.
    points: dict[str, Any] = {
        m.name: m.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    [ttft] = points["gen_ai.server.time_to_first_token"]
    assert ttft.count == 1 and ttft.attributes["gen_ai.operation.name"] == "chat"
    assert ttft.attributes["gen_ai.request.model"] == "m"
    assert ttft.explicit_bounds[0] == pytest.approx(0.001)
    [tpot] = points["gen_ai.server.time_per_output_token"]
    assert tpot.count == 1
    durations = points["gen_ai.server.request.duration"]
    assert sorted(p.attributes.get("error.type", "") for p in durations) == ["", "http_500"]
    assert sum(p.count for p in points["gen_ai.client.operation.time_per_output_chunk"]) == 3
    finished: Any = spans.get_finished_spans()
    assert [s.name for s in finished] == ["chat m", "chat m"]
    good, failed = finished
    assert good.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert (
        good.attributes["gen_ai.usage.output_tokens"] == 4
        and good.attributes["gen_ai.request.stream"]
    )
    assert good.end_time > good.start_time
    assert (
        failed.status.status_code.name == "ERROR"
        and failed.attributes["http.response.status_code"] == 500
    )


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str, int]]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        self.received.append((self.path, self.headers.get("Content-Type", ""), length))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def otlp_collector() -> Iterator[str]:
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_otlp_export_reaches_a_collector(otlp_collector: str) -> None:
    from llmslo.commands.tap import build_genai_otlp

    genai, providers = build_genai_otlp(otlp_collector)

    async def scenario() -> None:
        up = ScriptedUpstream(lambda req: stream_script(3), models=["m"])
        async with tap_over([up], genai=genai) as (url, _, _):
            await post(url, CHAT)

    asyncio.run(scenario())
    for provider in providers:
        provider.shutdown()
    paths = {(path, ctype) for path, ctype, size in _Collector.received if size > 0}
    assert ("/v1/metrics", "application/x-protobuf") in paths
    assert ("/v1/traces", "application/x-protobuf") in paths
