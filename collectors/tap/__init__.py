"""The sidecar stream tap: a reverse proxy on the OpenAI SSE path that measures every request.

Owns: per-request measurement exactly per DESIGN §3 (ttfb, TTFT, TPOT, ITL gaps with tokens
per chunk, E2E, outcomes), the request contract (deadlines, retries only before the first
token within a budget), client-disconnect handling and ghost evidence (in-flight and
disconnect gauges, optional drain mode), and the tap's telemetry (Prometheus ``/metrics``,
OpenTelemetry GenAI metrics and spans). It never stores or logs prompt or completion text.

Public names:

* :class:`TapProxy` — the aiohttp proxy (``await start()`` / ``await stop()``);
* :class:`TapConfig` — the ``tap`` config section;
* :class:`SseFramer`, :class:`StreamMeter`, :class:`Measurements`, :class:`ItlSummary` —
  framing and measuring, usable without the proxy;
* :class:`ModelLabels` — which requested model names may become metrics labels;
* sinks: :class:`KafkaSink`, :class:`JsonLinesSink`, :class:`ListSink`, :class:`MultiSink`;
* :class:`TapMetrics`, :class:`GenAiTelemetry` — telemetry about what was measured;
* degradation flags that act: :class:`FlagFollower` (follows a :class:`FlagSource` such as
  :class:`KafkaFlagSource`; its ``current`` is ``TapProxy(flags=...)``),
  :class:`DegradationConfig` (the ``tap.degradation`` section).
"""

from collectors.tap.config import TapConfig
from collectors.tap.degradation import DegradationConfig, FlagFollower, FlagSource
from collectors.tap.flagsource import KafkaFlagSource
from collectors.tap.labels import ModelLabels
from collectors.tap.measure import ItlSummary, Measurements, StreamMeter
from collectors.tap.proxy import Clock, SystemClock, TapProxy
from collectors.tap.sinks import JsonLinesSink, KafkaSink, ListSink, MultiSink, RecordSink
from collectors.tap.sse import SseEvent, SseFramer
from collectors.tap.telemetry import GenAiTelemetry, TapMetrics

__all__ = [
    "Clock",
    "DegradationConfig",
    "FlagFollower",
    "FlagSource",
    "GenAiTelemetry",
    "ItlSummary",
    "JsonLinesSink",
    "KafkaFlagSource",
    "KafkaSink",
    "ListSink",
    "Measurements",
    "ModelLabels",
    "MultiSink",
    "RecordSink",
    "SseEvent",
    "SseFramer",
    "StreamMeter",
    "SystemClock",
    "TapConfig",
    "TapMetrics",
    "TapProxy",
]
