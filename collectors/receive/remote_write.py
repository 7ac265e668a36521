"""Prometheus remote-write 1.0: a snappy-compressed protobuf ``WriteRequest``.

:func:`check_headers` checks the headers the spec requires (``Content-Encoding:
snappy``, ``Content-Type: application/x-protobuf``); :meth:`RemoteWriteDecoder.decode` reads the snappy length header and
refuses a body that would decompress past ``max_decompressed_bytes`` *before*
decompressing it (a snappy bomb costs nothing), then parses the protobuf. Every refusal is a
:class:`RefusedWrite` with a 4xx status (the sender must not retry it) and a reason.

Prometheus sends the same series on every scrape, so :class:`RemoteWriteDecoder` reads a
request with each series' labels left serialised (:data:`KeyedWriteRequest`) and parses a
label set once: the tuple of its serialised labels keys a bounded LRU cache of the parsed
and checked label set. The cache holds what those bytes mean and nothing else (no target,
no receiver state), so a hit is exactly what a fresh parse would give; a refused label set
is not cached, nor one over :data:`MAX_CACHED_LABEL_SET_BYTES`.

A request is read in bulk (:func:`_bulk_series`): the series are concatenated, each closed
by an end marker, and parsed as one merged message giving flat lists of serialised labels
and samples; the samples, concatenated, parse as two columns (values, timestamps). No
Python object is made per field, and the end markers say which labels and samples belong
to which series. The bulk read is taken only when it provably reads what a per-series parse
reads (every series parses, every sample is in the canonical layout ``value`` then
``timestamp``, no label or sample equals an end marker); any other request is read series
by series, as before, with the same refusals.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np
import snappy
from google.protobuf.message import DecodeError as ProtobufDecodeError

from collectors.receive._prompb import (
    METADATA_TYPES,
    KeyedWriteRequest,
    Label,
    MergedTimeSeries,
    SampleColumns,
    SeriesWriteRequest,
)
from collectors.receive.config import ReceiveLimits
from collectors.receive.series import (
    PushedBatch,
    PushedSeries,
    RefusedWrite,
    labels_refusal,
    target_of,
)
from pipeline.errors import DecodeError

__all__ = ["MAX_CACHED_LABEL_SET_BYTES", "RemoteWriteDecoder", "check_headers", "snappy_length"]

#: Label sets longer than this (serialised) are parsed every time, never cached, so the cache
#: holds at most ``max_cached_label_sets`` times this many bytes of labels.
MAX_CACHED_LABEL_SET_BYTES = 1024


def snappy_length(body: bytes) -> int:
    """The uncompressed length a raw snappy block announces (its leading varint).

    Raises :class:`RefusedWrite` (400 ``snappy``) when the header is not a varint of at most
    32 bits, as the snappy format defines it.
    """
    length, shift = 0, 0
    for position, byte in enumerate(body[:5]):
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if position == 4 and byte > 0x0F:
                break
            return length
        shift += 7
    raise RefusedWrite(400, "snappy", "no valid snappy length header")


def check_headers(content_encoding: str, content_type: str) -> None:
    """Refuse (415) a write whose headers are not remote-write 1.0's, before reading its body.

    Checked first so no other decoder (an HTTP server's gzip) ever sees the body.
    """
    if content_encoding.strip().lower() != "snappy":
        raise RefusedWrite(
            415, "content_encoding", f"Content-Encoding must be snappy, not {content_encoding!r}"
        )
    if content_type.split(";")[0].strip().lower() != "application/x-protobuf":
        raise RefusedWrite(
            415,
            "content_type",
            f"Content-Type must be application/x-protobuf, not {content_type!r}",
        )


#: What closes each series in the merged read, each checked to occur once per series: an
#: empty label (a label with neither name nor value, which no sender means) and a sample
#: whose only field is number 3 (not in the canonical layout).
_LABELS_END = b""
_SAMPLES_END = b"\x18\x01"
_SERIES_END = (
    bytes((0x0A, len(_LABELS_END))) + _LABELS_END + bytes((0x12, len(_SAMPLES_END))) + _SAMPLES_END
)
_VALUE_TAG, _TIMESTAMP_TAG = 0x09, 0x10  # field 1 fixed64, field 2 varint
#: A varint is one byte longer from each of these values on (a negative int64 takes 10).
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each int64 of ``values`` takes as a canonical protobuf varint."""
    unsigned = values.astype(np.uint64)  # two's complement: a negative is 10 bytes
    return 1 + np.searchsorted(_VARINT_STEPS, unsigned, side="right")


def _sample_columns(samples: list[bytes], ends: np.ndarray) -> tuple[list[int], list[float]] | None:
    """(timestamps, values) of the serialised ``samples`` (``ends``: where the end markers
    are, skipped), or ``None`` unless every sample is ``[value][timestamp]`` in canonical
    form, so that the columns read from their concatenation are those of each sample."""
    blob = b"".join(samples)
    try:
        columns = SampleColumns.FromString(blob)
    except ProtobufDecodeError:
        return None
    lengths = np.fromiter(map(len, samples), np.int64, len(samples))
    starts = (np.cumsum(lengths) - lengths)[~ends]
    lengths = lengths[~ends]
    first = np.zeros(len(lengths), np.uint8)
    present = lengths > 0
    first[present] = np.frombuffer(blob, np.uint8)[starts[present]]
    has_value = first == _VALUE_TAG
    has_ts = (first == _TIMESTAMP_TAG) | (has_value & (lengths > 9))
    read_values, read_ts = np.array(columns.value), np.array(columns.timestamp, np.int64)
    if len(read_values) != has_value.sum() or len(read_ts) != has_ts.sum():
        return None
    values = np.zeros(len(lengths))
    values[has_value] = read_values
    timestamps = np.zeros(len(lengths), np.int64)
    timestamps[has_ts] = read_ts
    expected = 9 * has_value + has_ts * (1 + _varint_lengths(timestamps))
    if not np.array_equal(expected, lengths):
        return None
    both = has_value & has_ts
    if not (np.frombuffer(blob, np.uint8)[starts[both] + 9] == _TIMESTAMP_TAG).all():
        return None
    return timestamps.tolist(), values.tolist()


#: Per series: its serialised labels, their total length and its (timestamp_ms, value) samples.
_RawSeries = tuple[list[tuple[bytes, ...]], list[int], list[list[tuple[int, float]]]]


def _bulk_series(request: Any) -> _RawSeries | None:
    """The serialised labels and the samples of every series of ``request`` (a parsed
    :data:`SeriesWriteRequest`) read in bulk (see the module docstring), or ``None`` when
    the bulk read cannot be trusted to be exact."""
    count = len(request.timeseries)
    try:
        merged = MergedTimeSeries.FromString(_SERIES_END.join(request.timeseries) + _SERIES_END)
    except ProtobufDecodeError:
        return None
    labels, samples = list(merged.labels), list(merged.samples)
    label_lengths = np.fromiter(map(len, labels), np.int64, len(labels))
    label_ends = np.flatnonzero(label_lengths == 0)  # empty: _LABELS_END
    sample_ends = np.fromiter(map(_SAMPLES_END.__eq__, samples), bool, len(samples))
    if len(label_ends) != count or sample_ends.sum() != count:
        return None
    columns = _sample_columns(samples, sample_ends)
    if columns is None:
        return None
    before = np.cumsum(label_lengths)[label_ends]
    label_bytes = np.diff(before, prepend=0).tolist()
    keys, start = [], 0
    for stop in label_ends.tolist():
        keys.append(tuple(labels[start:stop]))
        start = stop + 1
    timestamps, values = columns
    # each series' samples end where its end marker is, less the markers before it
    sample_stops = np.flatnonzero(sample_ends) - np.arange(count)
    if np.array_equal(sample_stops, np.arange(1, count + 1)):  # one each, as Prometheus sends
        return keys, label_bytes, [[sample] for sample in zip(timestamps, values, strict=True)]
    series_samples, start = [], 0
    for stop in sample_stops.tolist():
        series_samples.append(list(zip(timestamps[start:stop], values[start:stop], strict=True)))
        start = stop
    return keys, label_bytes, series_samples


#: A parsed label set: its ``__name__``, its sorted labels and its (job, instance).
_LabelSet = tuple[str, tuple[tuple[str, str], ...], tuple[str, str]]


class _LabelsRefused(DecodeError):
    """A label set past a bound (internal: raised so the LRU cache never keeps it)."""

    def __init__(self, reason: str, name: str) -> None:
        super().__init__(reason, f"series {name!r}: labels refused ({reason})")
        self.name = name


class RemoteWriteDecoder:
    """Decodes remote-write bodies into :class:`PushedBatch` es, caching parsed label sets.

    ``limits.max_cached_label_sets`` bounds the cache (least recently used evicted first);
    :meth:`cache_info` says what it holds. Single-threaded, like the receiver.
    """

    def __init__(self, limits: ReceiveLimits) -> None:
        self.limits = limits
        self._label_set = functools.lru_cache(maxsize=limits.max_cached_label_sets)(
            self._parse_label_set
        )

    def cache_info(self) -> functools._CacheInfo:
        """The label-set cache's hits, misses, bound and size (``functools`` statistics)."""
        return self._label_set.cache_info()

    def _parse_label_set(self, raw: tuple[bytes, ...]) -> _LabelSet:
        """(``__name__``, sorted labels, target) of a series' serialised labels; raises
        :class:`_LabelsRefused` past a label bound, :class:`RefusedWrite` when unreadable."""
        try:
            parsed = [Label.FromString(label) for label in raw]
        except ProtobufDecodeError as exc:
            raise RefusedWrite(400, "protobuf", f"not a WriteRequest: {exc}"[:200]) from exc
        intern = sys.intern  # the same names and values recur across series: store them once
        labels = tuple(sorted((intern(label.name), intern(label.value)) for label in parsed))
        name = next((value for key, value in labels if key == "__name__"), "")
        refusal = labels_refusal(labels, self.limits)
        if refusal is not None:
            raise _LabelsRefused(refusal, name[:100])
        return name, labels, target_of(labels)

    def decode(self, body: bytes) -> PushedBatch:
        """The series of one snappy remote-write body (headers checked by
        :func:`check_headers`); series past a label bound are refused and counted."""
        limits = self.limits
        announced = snappy_length(body)
        if announced > limits.max_decompressed_bytes:
            raise RefusedWrite(
                413,
                "decompressed_size",
                f"snappy body announces {announced} bytes, "
                f"more than {limits.max_decompressed_bytes}",
            )
        try:
            raw = snappy.uncompress(body)
        except Exception as exc:  # cramjam raises its own types: every one means a corrupt body
            raise RefusedWrite(400, "snappy", f"corrupt snappy body: {exc}"[:200]) from exc
        try:
            request = KeyedWriteRequest.FromString(raw)
        except ProtobufDecodeError as exc:
            raise RefusedWrite(400, "protobuf", f"not a WriteRequest: {exc}"[:200]) from exc
        if len(request.timeseries) > limits.max_series_per_request:
            raise RefusedWrite(
                413,
                "series_per_request",
                f"{len(request.timeseries)} series, more than {limits.max_series_per_request}",
            )
        batch = PushedBatch()
        for metadata in request.metadata:
            batch.family_types[metadata.metric_family_name] = METADATA_TYPES.get(
                metadata.type, "untyped"
            )
        # the request parsed whole: every series is well formed, so the bulk read is in step
        bulk = _bulk_series(SeriesWriteRequest.FromString(raw))
        if bulk is None:
            keys = [tuple(s.labels) for s in request.timeseries]
            bulk = (
                keys,
                [sum(map(len, key)) for key in keys],
                [[(p.timestamp, p.value) for p in s.samples] for s in request.timeseries],
            )
        cached, parse, out = self._label_set, self._parse_label_set, batch.series
        max_labels = limits.max_labels_per_series
        for raw_labels, label_bytes, samples in zip(*bulk, strict=True):
            # a label set is cached only when small enough to keep (see the module docstring)
            small = len(raw_labels) <= max_labels and label_bytes <= MAX_CACHED_LABEL_SET_BYTES
            try:
                name, labels, target = (cached if small else parse)(raw_labels)
            except _LabelsRefused as refused:
                batch.refuse(refused.reason, refused.name)
                continue
            out.append(PushedSeries(name, labels, target, samples))
        return batch
