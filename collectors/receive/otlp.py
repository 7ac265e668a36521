"""OTLP/HTTP metrics: an ``ExportMetricsServiceRequest`` → the series of a :class:`PushedBatch`.

The messages are ``opentelemetry-proto``'s generated classes; bodies are
``application/x-protobuf`` or ``application/json`` (OTLP's JSON mapping), optionally
``Content-Encoding: gzip`` (inflated with the decompressed-size bound, so a gzip bomb stops
at ``max_decompressed_bytes``). Each data point becomes the series a Prometheus scrape of the
same instrument would show, named by :func:`collectors.receive.naming.prometheus_name`:

* gauge → a gauge; monotonic sum → a counter (``_total``); non-monotonic sum → a gauge;
* explicit-bucket histogram → ``_bucket{le}`` (cumulative counts), ``_sum``, ``_count``;
* summary → ``{quantile}`` gauges, ``_sum``, ``_count``;
* exponential histogram → the classic histogram of its buckets downscaled to scale 0 (or
  kept at its scale when below 0): ``le`` = the powers of two bounding the populated
  buckets, plus ``le=zero_threshold`` for the zero bucket. This loses nothing at those
  bounds and keeps the ``le`` set stable while the SDK rescales. A point with negative
  buckets (no latency or count has them) is refused as ``exponential_negative``;
* delta temporality (sums, histograms) → marked ``delta``: the receiver adds each stored
  point to the series' running total, so downstream sees a cumulative counter;
* ``NO_RECORDED_VALUE`` flag → Prometheus' staleness marker (the series ended).

Resource attributes name the target as a scrape's target labels do (see :func:`_target`).
Data points past a label bound are refused and counted (the OTLP partial success).
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from collectors.config import check_label_value
from collectors.receive.config import ReceiveLimits
from collectors.receive.naming import label_name, prometheus_name
from collectors.receive.series import (
    STALE,
    PushedBatch,
    PushedSeries,
    RefusedWrite,
    labels_refusal,
)

__all__ = ["check_otlp_headers", "decode_otlp", "error_body", "success_body"]

PROTOBUF, JSON = "application/x-protobuf", "application/json"
_DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
_NO_VALUE = metrics_pb2.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
#: Most classic buckets one exponential histogram point becomes (at scale 0, 2^-40..2^40).
MAX_EXPONENTIAL_BUCKETS = 160
Labels = dict[str, str]


def check_otlp_headers(content_type: str, content_encoding: str) -> tuple[str, bool]:
    """(content type, gzipped) of an OTLP request; 415 for anything else, before the body."""
    kind = content_type.split(";")[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise RefusedWrite(
            415,
            "content_type",
            f"Content-Type must be {PROTOBUF} or {JSON}, not {content_type!r}",
        )
    encoding = content_encoding.strip().lower()
    if encoding not in ("", "identity", "gzip"):
        raise RefusedWrite(
            415, "content_encoding", f"Content-Encoding must be gzip or none, not {encoding!r}"
        )
    return kind, encoding == "gzip"


def _inflate(body: bytes, limits: ReceiveLimits) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        raw = inflater.decompress(body, limits.max_decompressed_bytes + 1)
    except zlib.error as exc:
        raise RefusedWrite(400, "gzip", f"corrupt gzip body: {exc}"[:200]) from exc
    if len(raw) > limits.max_decompressed_bytes or inflater.unconsumed_tail:
        raise RefusedWrite(
            413,
            "decompressed_size",
            f"gzip body inflates past {limits.max_decompressed_bytes} bytes",
        )
    if not inflater.eof:
        raise RefusedWrite(400, "gzip", "truncated gzip body")
    return raw


def _strip_exemplars(node: Any) -> Any:
    """Exemplars carry hex trace ids (OTLP JSON), which the protobuf JSON parser reads as
    base64; the receiver does not keep exemplars, so they are dropped before parsing."""
    if isinstance(node, dict):
        return {k: _strip_exemplars(v) for k, v in node.items() if k != "exemplars"}
    if isinstance(node, list):
        return [_strip_exemplars(v) for v in node]
    return node


def _parse(raw: bytes, kind: str) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(raw)
        except ProtobufDecodeError as exc:
            raise RefusedWrite(
                400, "protobuf", f"not an ExportMetricsServiceRequest: {exc}"[:200]
            ) from exc
        return request
    try:
        json_format.ParseDict(
            _strip_exemplars(json.loads(raw)), request, ignore_unknown_fields=True
        )
    except (ValueError, json_format.ParseError, RecursionError) as exc:
        raise RefusedWrite(
            400, "json", f"not an OTLP JSON ExportMetricsServiceRequest: {exc}"[:200]
        ) from exc
    return request


def _text(value: AnyValue) -> str:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "int_value":
        return str(value.int_value)
    if which == "double_value":
        return repr(value.double_value)
    if which is None:
        return ""
    return json_format.MessageToJson(value, indent=None)  # arrays, kvlists, bytes


def _attributes(pairs: Iterable[KeyValue]) -> Labels:
    return {label_name(kv.key): _text(kv.value) for kv in pairs}


def _target(resource: Iterable[KeyValue], peer: str) -> tuple[str, str, Labels]:
    """(job, instance, target labels) of a resource, as Prometheus' OTLP translation and a
    PodMonitor would give them.

    ``job`` is ``service.namespace/service.name``; the target's key and name is
    ``k8s.pod.name`` (the name the pod's scrape and its tap go by), else
    ``service.instance.id``, else the sender's address. ``k8s.pod.name`` and
    ``k8s.namespace.name`` are the target labels ``pod`` and ``namespace``; ``llmslo.pool``
    and ``llmslo.dialect`` are its pool and forced dialect (as relabelled scrape labels are).
    """
    attrs = {kv.key: _text(kv.value) for kv in resource}
    service, namespace = attrs.get("service.name", ""), attrs.get("service.namespace", "")
    job = f"{namespace}/{service}" if namespace and service else service or "otlp"
    instance = attrs.get("k8s.pod.name") or attrs.get("service.instance.id") or peer
    labels: Labels = {}
    for attribute, label in (
        ("k8s.pod.name", "pod"),
        ("k8s.namespace.name", "namespace"),
        ("llmslo.pool", "pool"),
        ("llmslo.dialect", "dialect"),
    ):
        if attrs.get(attribute):
            labels[label] = check_label_value(attribute, attrs[attribute])
    check_label_value("instance", instance)
    return job, instance, labels


def _number(point: metrics_pb2.NumberDataPoint) -> float:
    return float(point.as_int) if point.WhichOneof("value") == "as_int" else point.as_double


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _exponential(point: metrics_pb2.ExponentialHistogramDataPoint) -> list[tuple[str, float]]:
    """Cumulative classic buckets ``(le, count)`` of an exponential point (module docstring)."""
    if any(point.negative.bucket_counts):
        raise ValueError("exponential_negative")
    scale = point.scale
    shift, exponent = max(scale, 0), 2 ** -min(scale, 0)
    merged: dict[int, int] = {}
    for i, count in enumerate(point.positive.bucket_counts):
        if count:
            index = (point.positive.offset + i) >> shift
            merged[index] = merged.get(index, 0) + count
    running = float(point.zero_count)
    out = [(_le(point.zero_threshold), running)]
    if merged:
        low, high = min(merged), max(merged)
        if high - low + 1 > MAX_EXPONENTIAL_BUCKETS:
            raise ValueError("exponential_buckets")
        for index in range(low, high + 1):
            running += merged.get(index, 0)
            try:
                bound = 2.0 ** ((index + 1) * exponent)
            except OverflowError:
                break  # past the largest double: the +Inf bucket holds it
            out.append((_le(bound), running))
    return out


def _points(metric: metrics_pb2.Metric) -> Iterator[tuple[Any, str, bool]]:
    """(data point, kind, delta) of one metric; kind is the Prometheus family type."""
    which = metric.WhichOneof("data")
    if which == "gauge":
        for p in metric.gauge.data_points:
            yield p, "gauge", False
    elif which == "sum":
        kind = "counter" if metric.sum.is_monotonic else "gauge"
        delta = metric.sum.aggregation_temporality == _DELTA
        for p in metric.sum.data_points:
            yield p, kind, delta
    elif which == "histogram":
        delta = metric.histogram.aggregation_temporality == _DELTA
        for p in metric.histogram.data_points:
            yield p, "histogram", delta
    elif which == "exponential_histogram":
        delta = metric.exponential_histogram.aggregation_temporality == _DELTA
        for p in metric.exponential_histogram.data_points:
            yield p, "exponential", delta
    elif which == "summary":
        for p in metric.summary.data_points:
            yield p, "summary", False


def _series_of(point: Any, kind: str, name: str, labels: Labels) -> list[tuple[str, Labels, float]]:
    """(name, extra labels, value) of every series one data point becomes."""
    if kind in ("gauge", "counter"):
        return [(name, {}, _number(point))]
    if kind == "summary":
        out = [(name, {"quantile": repr(q.quantile)}, q.value) for q in point.quantile_values]
        return [*out, (f"{name}_sum", {}, point.sum), (f"{name}_count", {}, float(point.count))]
    if kind == "exponential":
        buckets = _exponential(point)
    else:
        bounds, counts = list(point.explicit_bounds), list(point.bucket_counts)
        if counts and len(counts) != len(bounds) + 1:
            raise ValueError("histogram_buckets")
        buckets, running = [], 0.0
        for bound, count in zip(bounds, counts, strict=False):
            running += count
            buckets.append((_le(bound), running))
    out = [(f"{name}_bucket", {"le": le}, count) for le, count in buckets]
    out.append((f"{name}_bucket", {"le": "+Inf"}, float(point.count)))
    if point.HasField("sum"):
        out.append((f"{name}_sum", {}, point.sum))
    out.append((f"{name}_count", {}, float(point.count)))
    return out


def decode_otlp(
    body: bytes, kind: str, gzipped: bool, limits: ReceiveLimits, *, peer: str = ""
) -> PushedBatch:
    """The series of one OTLP/HTTP metrics body (headers checked by
    :func:`check_otlp_headers`); ``peer``: the sender's host, naming a resource that has
    neither ``k8s.pod.name`` nor ``service.instance.id``."""
    raw = _inflate(body, limits) if gzipped else body
    if len(raw) > limits.max_decompressed_bytes:
        raise RefusedWrite(413, "decompressed_size", f"body of {len(raw)} bytes")
    if kind == JSON and len(raw) > limits.max_json_bytes:
        raise RefusedWrite(
            413, "json_size", f"JSON body of {len(raw)} bytes, more than {limits.max_json_bytes}"
        )
    request = _parse(raw, kind)
    batch = PushedBatch()
    now_ms = int(time.time() * 1000)
    for resource_metrics in request.resource_metrics:
        points = [
            p for scope in resource_metrics.scope_metrics for m in scope.metrics for p in _points(m)
        ]
        try:
            job, instance, target_labels = _target(resource_metrics.resource.attributes, peer)
        except ValueError as exc:
            batch.refuse("resource_labels", str(exc), len(points))
            continue
        batch.targets[(job, instance)] = target_labels
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                _decode_metric(metric, job, instance, batch, limits, now_ms)
    return batch


def _decode_metric(
    metric: metrics_pb2.Metric,
    job: str,
    instance: str,
    batch: PushedBatch,
    limits: ReceiveLimits,
    now_ms: int,
) -> None:
    for point, kind, delta in _points(metric):
        family = "histogram" if kind == "exponential" else kind
        name = prometheus_name(metric.name, metric.unit, family)
        batch.family_types[name] = family
        labels = _attributes(point.attributes)
        labels |= {"__name__": name, "job": job, "instance": instance}
        ts_ms = point.time_unix_nano // 1_000_000 or now_ms
        try:
            series = _series_of(point, kind, name, labels)
        except ValueError as exc:
            batch.refuse(str(exc), name[:100])
            continue
        if len(batch.series) + len(series) > limits.max_series_per_request:
            raise RefusedWrite(
                413,
                "series_per_request",
                f"more than {limits.max_series_per_request} series in one request",
            )
        stale = bool(point.flags & _NO_VALUE)
        built = [
            PushedSeries(
                series_name,
                tuple(sorted((labels | extra | {"__name__": series_name}).items())),
                (job, instance),
                [(ts_ms, STALE if stale else value)],
                family,
                delta,
            )
            for series_name, extra, value in series
        ]
        # one refusal per data point: its series share the point's attributes
        refusal = next(
            (r for s in built if (r := labels_refusal(s.labels, limits)) is not None), None
        )
        if refusal is None:
            batch.series.extend(built)
        else:
            batch.refuse(refusal, name[:100])


def success_body(kind: str, batch: PushedBatch) -> bytes:
    """The ``ExportMetricsServiceResponse``: a partial success when points were refused."""
    response = ExportMetricsServiceResponse()
    if batch.refused:
        response.partial_success.CopyFrom(
            ExportMetricsPartialSuccess(
                rejected_data_points=sum(batch.refused.values()),
                error_message="; ".join(batch.errors)[:1000],
            )
        )
    if kind == JSON:
        return json_format.MessageToJson(response, indent=None).encode()
    return response.SerializeToString()


def error_body(kind: str, status: int, message: str) -> bytes:
    """A ``google.rpc.Status`` (the OTLP/HTTP failure body) in the request's encoding."""
    code = {400: 3, 401: 16, 413: 8, 415: 3, 503: 14}.get(status, 2)
    rpc = status_pb2.Status(code=code, message=message[:1000])
    if kind == JSON:
        return json_format.MessageToJson(rpc, indent=None).encode()
    return rpc.SerializeToString()
