"""The tap's telemetry about what it measured: Prometheus metrics and OTel GenAI metrics/spans.

:class:`TapMetrics` owns a private prometheus-client registry served on the tap's own
``/metrics`` port. :class:`GenAiTelemetry` emits the OpenTelemetry GenAI semantic
conventions (server trio ``gen_ai.server.time_to_first_token``,
``gen_ai.server.time_per_output_token``, ``gen_ai.server.request.duration``, plus
``gen_ai.client.operation.time_per_output_chunk`` for ITL) and one span per attempt, through
whatever Meter/TracerProvider it is given (OTLP in production, in-memory readers in tests).

Deviations from the semconv buckets: TPOT and ITL histograms add 1, 2 and 5 ms bounds
because the recommended ones start at 10 ms, too coarse for fast decoders; TTFT adds 2 s
and TPOT 80 ms, DESIGN §4's default targets, so the generated Prometheus rules can count
those SLOs exactly (a rule's threshold must be a bucket bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GenAiTelemetry", "TapMetrics"]

#: The GenAI semconv's recommended boundaries for gen_ai.server.time_to_first_token
#: (canary-and-peers.md §3); vLLM's default TTFT buckets happen to start the same way.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
TPOT_BUCKETS_S = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
#: The tap's own loop lag and GC pauses: 0.1 ms (healthy) to 2.5 s (a stalled process).
LAG_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)
DURATION_BUCKETS_S = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)


class TapMetrics:
    """Prometheus metrics of one tap process (label ``instance`` = upstream ``host:port``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "llmslo_tap_ttft_seconds",
            "Time to first token as measured by the tap",
            ["instance", "model"],
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.tpot = Histogram(
            "llmslo_tap_tpot_seconds",
            "Time per output token (usage-based)",
            ["instance", "model"],
            buckets=TPOT_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "llmslo_tap_itl_seconds",
            "Gaps between token-bearing chunks",
            ["instance", "model"],
            buckets=TPOT_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "llmslo_tap_e2e_seconds",
            "Last byte to the client minus arrival",
            ["instance", "model"],
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        # `code` (the status sent to the client, "" if none) lets rules class a record the
        # way the jobs do: a client's 404 is no availability event, a 503 is a bad one.
        self.requests = Counter(
            "llmslo_tap_requests",
            "Attempts by outcome and HTTP status sent to the client",
            ["instance", "outcome", "code"],
            registry=r,
        )
        self.in_flight = Gauge(
            "llmslo_tap_in_flight",
            "Streams open to the upstream right now",
            ["instance"],
            registry=r,
        )
        self.disconnects = Counter(
            "llmslo_tap_disconnects", "Client disconnects before the end", ["instance"], registry=r
        )
        self.bytes = Counter("llmslo_tap_bytes", "Response bytes", ["direction"], registry=r)
        self.dropped = Counter(
            "llmslo_dropped",
            "Things the tap dropped or could not parse, by reason",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "llmslo_tap_retries", "Retries before the first token", ["result"], registry=r
        )
        # The tap's own health: how late its loop ran, GC pauses, requests whose gaps were
        # too uncertain to count (collectors/tap/loopwatch.py).
        self.loop_lag = Histogram(
            "llmslo_tap_loop_lag_seconds",
            "How late the tap's event loop ran its watch tick",
            buckets=LAG_BUCKETS_S,
            registry=r,
        )
        self.gc_pause = Histogram(
            "llmslo_tap_gc_pause_seconds",
            "Garbage-collection pauses of the tap's interpreter",
            buckets=LAG_BUCKETS_S,
            registry=r,
        )
        self.uncertain = Counter(
            "llmslo_tap_uncertain_requests",
            "Attempts whose ITL gap error bound exceeded gap_error_max_s (itl_uncertain)",
            ["instance"],
            registry=r,
        )
        self.degradation_actions = Counter(
            "llmslo_tap_degradation_actions",
            "Requests a degradation flag acted on (fail_open: flags stale, nothing enforced)",
            ["level", "action"],
            registry=r,
        )


class GenAiTelemetry:
    """OpenTelemetry GenAI semantic-convention metrics and spans for each attempt."""

    def __init__(
        self, meter_provider: MeterProvider, tracer_provider: TracerProvider | None = None
    ) -> None:
        meter = meter_provider.get_meter("llmslo.tap")
        self._ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Time to generate first token",
            explicit_bucket_boundaries_advisory=list(TTFT_BUCKETS_S),
        )
        self._tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token generated after the first token",
            explicit_bucket_boundaries_advisory=list(TPOT_BUCKETS_S),
        )
        self._duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Server request duration (last byte)",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
        )
        self._chunk = meter.create_histogram(
            "gen_ai.client.operation.time_per_output_chunk",
            unit="s",
            description="Gap between consecutive token-bearing chunks (ITL)",
            explicit_bucket_boundaries_advisory=list(TPOT_BUCKETS_S),
        )
        self._tracer = tracer_provider.get_tracer("llmslo.tap") if tracer_provider else None

    def record(
        self,
        row: dict[str, Any],
        start_ns: int,
        end_ns: int,
        *,
        itl_gaps_s: Sequence[float] | None = None,
        model_label: str | None = None,
    ) -> None:
        """Emit the metrics and the span of one finished attempt (a request record row).

        ``itl_gaps_s``: every ITL gap of the attempt; the row's ``itl_gaps_s`` holds only
        the first ones (``tap.record_max_gaps``) and is used when it is not given.
        ``model_label``: the bounded label for the requested model (see
        :mod:`collectors.tap.labels`); without it, the row's raw ``model``.
        """
        route = row.get("route") or ""
        operation = (
            "text_completion" if route.endswith("/completions") and "chat" not in route else "chat"
        )
        host, _, port = str(row["instance"]).rpartition(":")
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "openai",
            "server.address": host,
            "server.port": int(port) if port.isdigit() else 0,
        }
        model = model_label or row.get("model")
        if model:
            attrs["gen_ai.request.model"] = model
        ok = row["outcome"] == "ok"
        if not ok:
            attrs["error.type"] = row.get("error_kind") or row["outcome"]
        if ok and row.get("ttft_s") is not None:
            self._ttft.record(row["ttft_s"], attrs)
        if ok and row.get("tpot_s") is not None:
            self._tpot.record(row["tpot_s"], attrs)
        if row.get("e2e_s") is not None:
            self._duration.record(row["e2e_s"], attrs)
        for gap in itl_gaps_s if itl_gaps_s is not None else row.get("itl_gaps_s") or ():
            self._chunk.record(gap, attrs)
        if self._tracer is not None:
            self._span(row, attrs, start_ns, end_ns, ok)

    def _span(
        self, row: dict[str, Any], attrs: dict[str, Any], start_ns: int, end_ns: int, ok: bool
    ) -> None:
        assert self._tracer is not None
        name = f"{attrs['gen_ai.operation.name']} {row.get('model') or ''}".strip()
        span = self._tracer.start_span(
            name, kind=SpanKind.SERVER, start_time=start_ns, attributes=attrs
        )
        extra: dict[str, Any] = {
            "gen_ai.request.stream": bool(row.get("streamed")),
            "llmslo.request_id": row["request_id"],
            "llmslo.attempt": int(row["attempt"]),
            "llmslo.outcome": row["outcome"],
        }
        if row.get("finish_reason"):
            extra["gen_ai.response.finish_reasons"] = [row["finish_reason"]]
        if row.get("ttft_s") is not None:
            extra["gen_ai.response.time_to_first_chunk"] = row["ttft_s"]
        if row.get("prompt_tokens") is not None:
            extra["gen_ai.usage.input_tokens"] = row["prompt_tokens"]
        if row.get("completion_tokens") is not None:
            extra["gen_ai.usage.output_tokens"] = row["completion_tokens"]
        if row.get("http_status") is not None:
            extra["http.response.status_code"] = row["http_status"]
        span.set_attributes(extra)
        if not ok:
            span.set_status(Status(StatusCode.ERROR, row.get("error_kind") or row["outcome"]))
        span.end(end_time=end_ns)
