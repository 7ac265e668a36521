"""Prometheus remote-write 1.0 messages (``prometheus/prompb``), built from descriptors.

No maintained PyPI package ships the ``prompb`` messages, so the subset of
``types.proto`` / ``remote.proto`` a receiver needs is declared here as a
``FileDescriptorProto`` and turned into classes by the installed ``protobuf`` runtime (the
one ``opentelemetry-proto`` brings). Field numbers and types are those of prompb; fields a
receiver ignores (exemplars, native histograms) are left out and skipped by the parser as
unknown fields.

``KeyedWriteRequest`` reads the same bytes with each ``TimeSeries.labels`` entry kept as the
serialised ``Label`` it is on the wire (``bytes`` and an embedded message share the
length-delimited wire type): the series-by-series read of a request the columnar read
declines, whose label entries, re-encoded as fields, key the label-set cache.

``SeriesWriteRequest`` gives each series still serialised (and the metadata), for
:mod:`collectors.receive._columns` to read as columns; ``LabelSet`` reads the serialised
label fields that key the label-set cache into their ``Label`` s in one call.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "KeyedWriteRequest",
    "Label",
    "LabelSet",
    "SeriesWriteRequest",
    "WriteRequest",
]

_F = descriptor_pb2.FieldDescriptorProto
# message → [(field, number, type, label, message type or None)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "Label": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("value", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ],
    "Sample": [
        ("value", 1, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, None),
        ("timestamp", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
    ],
    "TimeSeries": [
        ("labels", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.Label"),
        ("samples", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.Sample"),
    ],
    "MetricMetadata": [
        ("type", 1, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),  # prompb's enum, as its int
        ("metric_family_name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("help", 4, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("unit", 5, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ],
    "WriteRequest": [
        ("timeseries", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.TimeSeries"),
        ("metadata", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.MetricMetadata"),
    ],
    # the same wire format, labels left serialised (see the module docstring)
    "KeyedTimeSeries": [
        ("labels", 1, _F.TYPE_BYTES, _F.LABEL_REPEATED, None),
        ("samples", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.Sample"),
    ],
    "KeyedWriteRequest": [
        ("timeseries", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.KeyedTimeSeries"),
        ("metadata", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.MetricMetadata"),
    ],
    # the same wire format, each series left serialised
    "SeriesWriteRequest": [
        ("timeseries", 1, _F.TYPE_BYTES, _F.LABEL_REPEATED, None),
        ("metadata", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.MetricMetadata"),
    ],
    # a series' label fields alone (its samples and the rest left out)
    "LabelSet": [
        ("labels", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".llmslo.prompb.Label"),
    ],
}
#: prompb ``MetricMetadata.MetricType`` → the exposition ``# TYPE`` it stands for.
METADATA_TYPES = {
    0: "untyped",
    1: "counter",
    2: "gauge",
    3: "histogram",
    4: "gaugehistogram",
    5: "summary",
    6: "info",
    7: "stateset",
}


def _build() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="llmslo/prompb.proto", package="llmslo.prompb", syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, type_, label, type_name in fields:
            added = message.field.add(name=field, number=number, type=type_, label=label)
            if type_name:
                added.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    file = pool.Add(proto)
    del file
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"llmslo.prompb.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _build()
#: The remote-write request message class (``prometheus.WriteRequest``).
WriteRequest: Any = _CLASSES["WriteRequest"]
#: ``WriteRequest`` with each series' labels as serialised ``Label`` messages.
KeyedWriteRequest: Any = _CLASSES["KeyedWriteRequest"]
#: One label (``name``, ``value``).
Label: Any = _CLASSES["Label"]
#: ``WriteRequest`` with each series serialised (``timeseries``: ``bytes`` each) and its metadata.
SeriesWriteRequest: Any = _CLASSES["SeriesWriteRequest"]
#: A series' label fields alone, parsed (``labels``: its ``Label`` s).
LabelSet: Any = _CLASSES["LabelSet"]
