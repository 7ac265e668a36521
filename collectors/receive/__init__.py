"""Receivers: telemetry pushed to llmslo, into the same records and topics as scrapes.

``llmslo receive`` accepts Prometheus remote-write 1.0 (snappy protobuf ``WriteRequest``)
and OTLP/HTTP metrics (protobuf or JSON), so Prometheus' own discovery (kubernetes_sd,
PodMonitors), an OpenTelemetry Collector or an engine's OTLP exporter feeds llmslo and
nothing on the fleet is scraped twice. Pushed series go through the collector's dialect maps and
canonicalizer (:mod:`collectors.canonical`) and the one publish buffer
(:mod:`pipeline.publisher`) into the ``engine``, ``gpu`` and ``health`` topics.

* :mod:`collectors.receive.config` — the ``receive`` section (listen address, token, bounds);
* :mod:`collectors.receive.remote_write` — decoding and refusing remote-write bodies;
* :mod:`collectors.receive.otlp` — decoding OTLP metrics into the series a scrape shows;
* :mod:`collectors.receive.naming` — OTel names and units → the dialect maps' names;
* :mod:`collectors.receive.receiver` — staleness, ``up``, deduplication, canonicalising;
  known remote-write series handled as columns (their slots: ``_slots``);
* :mod:`collectors.receive.targets` — a pushed series' target: naming, families, series;
* :mod:`collectors.receive.server` — the HTTP door and its response codes.

See ``docs/receivers.md`` for the Prometheus, Prometheus Operator, OTLP and limits reference.
"""

from __future__ import annotations

from collectors.receive.config import ReceiveConfig, ReceiveLimits
from collectors.receive.otlp import decode_otlp
from collectors.receive.receiver import IngestReport, Receiver
from collectors.receive.remote_write import RemoteWriteDecoder
from collectors.receive.series import PushedBatch, PushedSeries, RefusedWrite
from collectors.receive.server import ReceiveMetrics, receive_app

__all__ = [
    "IngestReport",
    "PushedBatch",
    "PushedSeries",
    "ReceiveConfig",
    "ReceiveLimits",
    "ReceiveMetrics",
    "Receiver",
    "RefusedWrite",
    "RemoteWriteDecoder",
    "decode_otlp",
    "receive_app",
]
