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

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TapConfig": "config",
    "DegradationConfig": "degradation",
    "FlagFollower": "degradation",
    "FlagSource": "degradation",
    "KafkaFlagSource": "flagsource",
    "ModelLabels": "labels",
    "ItlSummary": "measure",
    "Measurements": "measure",
    "StreamMeter": "measure",
    "Clock": "proxy",
    "SystemClock": "proxy",
    "TapProxy": "proxy",
    "JsonLinesSink": "sinks",
    "KafkaSink": "sinks",
    "ListSink": "sinks",
    "MultiSink": "sinks",
    "RecordSink": "sinks",
    "SseEvent": "sse",
    "SseFramer": "sse",
    "GenAiTelemetry": "telemetry",
    "TapMetrics": "telemetry",
}


def __getattr__(name: str) -> Any:
    """Import public names lazily: ``collectors.tap.config`` (which the config table needs)
    must not pull the proxy, the Kafka sink and OpenTelemetry in with it."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'collectors.tap' has no attribute {name!r}")
    return getattr(importlib.import_module(f"collectors.tap.{module}"), name)


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
