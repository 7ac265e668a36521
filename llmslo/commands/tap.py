"""``llmslo tap``: run the sidecar stream tap in front of one or more engines."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import textwrap
from typing import Any

from collectors.tap.config import TapConfig
from collectors.tap.degradation import FlagFollower
from collectors.tap.flagsource import KafkaFlagSource
from collectors.tap.proxy import TapProxy, run_event_loop
from collectors.tap.sinks import JsonLinesSink, KafkaSink, MultiSink, RecordSink
from collectors.tap.telemetry import GenAiTelemetry, TapMetrics
from llmslo.options import (
    add_common_options,
    pipeline_bus,
    resolve_config,
    serve_metrics,
)
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError
from pipeline.processes import freeze_startup_heap

__all__ = ["build_genai_otlp", "register"]

log = logging.getLogger(__name__)


EXAMPLES = """\
llmslo tap --port 8100 --upstream http://127.0.0.1:8000
llmslo tap --host 0.0.0.0 --port 8100 --upstream http://10.0.0.7:8000,http://10.0.0.8:8000 \\
    --bootstrap-servers kafka:9092 --metrics-port 9466
llmslo tap --port 8100 --upstream http://127.0.0.1:8000 --no-kafka --records-out -
llmslo tap --upstream http://127.0.0.1:8000 --instance pod-3 --revision r42 --cohort canary
llmslo tap -c config/tap.example.yaml --drain-s 5 --otlp-endpoint http://127.0.0.1:4318
"""


def register(subparsers: Any) -> None:
    """Add the ``tap`` subcommand."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "tap",
        help="Reverse proxy on the OpenAI SSE path that measures every request.",
        description="Sidecar stream tap: proxies /v1/chat/completions and /v1/completions to the "
        "engines, records TTFT/TPOT/ITL/E2E and outcomes per request (DESIGN §3), publishes "
        "request records to the bus and/or a JSON-lines file; every other path passes through.",
        epilog="examples:\n" + textwrap.indent(EXAMPLES, "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_options(parser)
    parser.add_argument("--host", help="listen address (overrides tap.listen's host, 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, help="port to serve on (overrides tap.listen's port, 8100; 0: any)"
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="deprecated: give --host and --port (still works)"
    )
    parser.add_argument(
        "--upstream", metavar="URL[,URL…]", help="engine base URLs (overrides tap.upstreams)"
    )
    parser.add_argument(
        "--instance",
        help="name of the one engine this tap fronts, as its scrape target is named (e.g. pod-3)",
    )
    parser.add_argument("--pool", help="pool of the engines this tap fronts (overrides tap.pool)")
    parser.add_argument("--revision", help="revision stamped on every request record")
    parser.add_argument("--cohort", help="cohort stamped on every request record (e.g. canary)")
    parser.add_argument("--records-out", metavar="FILE|-", help="also write records as JSON lines")
    parser.add_argument("--no-kafka", action="store_true", help="do not publish to the bus")
    parser.add_argument(
        "--metrics-port", type=int, help="serve the tap's /metrics on this loopback port"
    )
    parser.add_argument(
        "--drain-s", type=float, help="drain mode: read upstream this long after a disconnect"
    )
    parser.add_argument("--tenant-header", help="header naming the tenant (default x-tenant-id)")
    parser.add_argument(
        "--default-timeout-s", type=float, help="deadline for requests that carry none"
    )
    parser.add_argument(
        "--max-attempts", type=int, help="attempts per request (retries before the first token)"
    )
    parser.add_argument(
        "--otlp-endpoint", help="export GenAI metrics and spans over OTLP/HTTP to this URL"
    )
    parser.add_argument(
        "--follow-flags",
        action="store_true",
        help="follow the flags topic and enforce L1–L3 (tap.degradation.follow_flags)",
    )
    parser.set_defaults(handler=run_tap)


def tap_config(config: LlmsloConfig, args: argparse.Namespace) -> TapConfig:
    """The ``tap`` section with command-line overrides applied (validated again)."""
    section = config.section("tap", TapConfig)
    updates: dict[str, Any] = {}
    listen = _listen(section.listen, args)
    if listen != section.listen:
        updates["listen"] = listen
    for name in (
        "records_out",
        "metrics_port",
        "tenant_header",
        "default_timeout_s",
        "max_attempts",
        "otlp_endpoint",
        "instance",
        "pool",
        "revision",
        "cohort",
    ):
        value = getattr(args, name, None)
        # An empty value is unset: a downward-API variable of a label the pod lacks is "".
        if value is not None and value != "":
            updates[name] = value
    if args.upstream:
        updates["upstreams"] = [url for url in args.upstream.split(",") if url]
    if args.drain_s is not None:
        updates["drain_max_s"] = args.drain_s
    if args.no_kafka:
        updates["kafka"] = False
    if getattr(args, "follow_flags", False):
        degradation = section.degradation.model_dump() | {"follow_flags": True}
        updates["degradation"] = degradation
    try:
        return TapConfig.model_validate(section.model_dump() | updates)
    except ValueError as exc:
        raise ConfigError(f"tap: {exc}") from exc


def _listen(configured: str, args: argparse.Namespace) -> str:
    """``HOST:PORT`` to serve on: ``--host`` and ``--port`` over ``--listen`` (the old
    spelling) over ``tap.listen``."""
    # No warning for the old spelling: the tap's stderr may carry its JSON banner first.
    listen = getattr(args, "listen", None) or configured
    host, _, port = listen.rpartition(":")
    host = getattr(args, "host", None) or host
    if getattr(args, "port", None) is not None:
        port = str(args.port)
    return f"{host}:{port}"


def build_genai_otlp(endpoint: str) -> tuple[GenAiTelemetry, list[Any]]:
    """GenAI telemetry exported over OTLP/HTTP; returns it and the providers to shut down."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            "tap.otlp_endpoint: needs the package opentelemetry-exporter-otlp-proto-http"
        ) from exc
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    base = endpoint.rstrip("/")
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{base}/v1/metrics"), export_interval_millis=10_000
    )
    meters = MeterProvider(metric_readers=[reader])
    tracers = TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
    return GenAiTelemetry(meters, tracers), [meters, tracers]


def run_tap(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    tap = tap_config(config, args)
    if not tap.upstreams:
        raise ConfigError("tap.upstreams: give --upstream URL[,URL…] or set tap.upstreams")
    metrics = TapMetrics()
    sinks: list[RecordSink] = []
    flags = None
    if tap.degradation.follow_flags and not tap.kafka:
        raise ConfigError("tap.degradation.follow_flags: needs tap.kafka (the flags topic)")
    with contextlib.ExitStack() as stack:
        if tap.kafka:
            bus = stack.enter_context(pipeline_bus(config, args))
            bus.ensure_topics()
            sinks.append(
                KafkaSink(
                    bus.producer,
                    batch_max_rows=tap.batch_max_rows,
                    flush_interval_s=tap.flush_interval_s,
                    max_pending=tap.max_pending_records,
                    on_drop=lambda reason, rows: metrics.dropped.labels(reason).inc(rows),
                )
            )
            if tap.degradation.follow_flags:
                source = KafkaFlagSource(
                    bus, on_drop=lambda reason: metrics.dropped.labels(reason).inc()
                )
                follower = FlagFollower(
                    source,
                    staleness_s=tap.degradation.staleness_s,
                    registry=metrics.registry,
                ).start()
                stack.callback(follower.stop)
                flags = follower.current
        if tap.records_out:
            sinks.append(JsonLinesSink(tap.records_out))
        genai, providers = build_genai_otlp(tap.otlp_endpoint) if tap.otlp_endpoint else (None, [])
        metrics_port = None
        if tap.metrics_port is not None:
            metrics_port = serve_metrics(tap.metrics_port, tap.metrics_host, metrics.registry)
        proxy = TapProxy(tap, MultiSink(sinks), metrics=metrics, genai=genai, flags=flags)
        run_event_loop(_serve(proxy, tap, metrics_port))
        for provider in providers:
            provider.shutdown()
    return 0


async def _serve(proxy: TapProxy, tap: TapConfig, metrics_port: int | None) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    port = await proxy.start()
    freeze_startup_heap()
    host = tap.listen.rpartition(":")[0]
    banner = {
        "tap": "listening",
        "url": f"http://{host}:{port}",
        "upstreams": tap.upstreams,
        "metrics_port": metrics_port,
        "kafka": tap.kafka,
        "tap_id": proxy.tap_id,
    }
    # Records may own stdout (--records-out -): the banner then goes to stderr.
    out = sys.stderr if tap.records_out == "-" else sys.stdout
    out.write(json.dumps(banner, sort_keys=True) + "\n")
    out.flush()
    await stopped.wait()
    log.info("stopping the tap")
    await proxy.stop()
    proxy.sink.close()
