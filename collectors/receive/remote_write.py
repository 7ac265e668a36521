"""Prometheus remote-write 1.0: a snappy-compressed protobuf ``WriteRequest``.

:func:`check_headers` checks the headers the spec requires (``Content-Encoding:
snappy``, ``Content-Type: application/x-protobuf``); :meth:`RemoteWriteDecoder.decode` reads the snappy length header and
refuses a body that would decompress past ``max_decompressed_bytes`` *before*
decompressing it (a snappy bomb costs nothing), then parses the protobuf. Every refusal is a
:class:`RefusedWrite` with a 4xx status (the sender must not retry it) and a reason.

Prometheus sends the same series on every scrape, so :class:`RemoteWriteDecoder` parses a
label set once: a series' label fields, as serialised on the wire (one ``bytes``), key a
bounded LRU cache of the parsed and checked label set. The cache holds what those bytes
mean and nothing else (no target, no receiver state), so a hit is exactly what a fresh
parse would give; a refused label set is not cached, nor one over
:data:`MAX_CACHED_LABEL_SET_BYTES`.

The request is parsed once with its series left serialised, and the series are read as
columns (:func:`collectors.receive._columns.read_columns`: numpy over the bytes, no Python
object per label or sample) when every one is laid out as Prometheus writes it — labels,
then one sample. Any other request is parsed series by series (:data:`KeyedWriteRequest`),
with the same refusals; both reads give the same series. A request whose series the receiver
all knows (the steady state of a remote-write) is read from each series' end
(:func:`collectors.receive._columns.read_tails`): its sample, and the bytes before it looked
up among the known label sets, the labels not walked at all.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from itertools import repeat

import numpy as np
import snappy
from google.protobuf.message import DecodeError as ProtobufDecodeError

from collectors.receive._columns import SeriesColumns, read_columns, read_tails
from collectors.receive._prompb import (
    METADATA_TYPES,
    KeyedWriteRequest,
    LabelSet,
    SeriesWriteRequest,
)
from collectors.receive.config import ReceiveLimits
from collectors.receive.series import (
    KnownSeries,
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


def _label_field(label: bytes) -> bytes:
    """``label`` (a serialised ``Label``) as the ``TimeSeries.labels`` field it was sent as."""
    size, prefix = len(label), bytearray((0x0A,))
    while size >= 0x80:
        prefix.append(size & 0x7F | 0x80)
        size >>= 7
    prefix.append(size)
    return bytes(prefix) + label


#: Per series: its serialised label fields, how many, and its (timestamp_ms, value) samples.
_RawSeries = tuple[list[bytes], list[int], list[list[tuple[int, float]]]]


def _columns_read(series: list[bytes], max_labels: int) -> _RawSeries | None:
    """Every series of a request read as columns (:func:`read_columns`), or ``None``."""
    columns = read_columns(series, max_labels)
    return None if columns is None else _raw_columns(columns)


def _raw_columns(columns: SeriesColumns) -> _RawSeries:
    """:data:`_RawSeries` of a request read as columns."""
    samples = zip(columns.timestamp_ms.tolist(), columns.value.tolist(), strict=True)
    return columns.label_keys(), columns.labels.tolist(), [[sample] for sample in samples]


def _series_read(raw: bytes) -> _RawSeries:
    """Every series of a request parsed one by one (any layout protobuf reads)."""
    try:
        request = KeyedWriteRequest.FromString(raw)
    except ProtobufDecodeError as exc:
        raise RefusedWrite(400, "protobuf", f"not a WriteRequest: {exc}"[:200]) from exc
    timeseries = request.timeseries
    return (
        [b"".join(map(_label_field, s.labels)) for s in timeseries],
        [len(s.labels) for s in timeseries],
        [[(p.timestamp, p.value) for p in s.samples] for s in timeseries],
    )


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

    def _parse_label_set(self, raw: bytes) -> _LabelSet:
        """(``__name__``, sorted labels, target) of a series' serialised label fields;
        raises :class:`_LabelsRefused` past a label bound, :class:`RefusedWrite` when
        unreadable."""
        try:
            parsed = LabelSet.FromString(raw).labels
        except ProtobufDecodeError as exc:
            raise RefusedWrite(400, "protobuf", f"not a WriteRequest: {exc}"[:200]) from exc
        intern = sys.intern  # the same names and values recur across series: store them once
        labels = tuple(sorted((intern(label.name), intern(label.value)) for label in parsed))
        name = next((value for key, value in labels if key == "__name__"), "")
        refusal = labels_refusal(labels, self.limits)
        if refusal is not None:
            raise _LabelsRefused(refusal, name[:100])
        return name, labels, target_of(labels)

    def decode(self, body: bytes, known: Mapping[bytes, int] | None = None) -> PushedBatch:
        """The series of one snappy remote-write body (headers checked by
        :func:`check_headers`); series past a label bound are refused and counted.

        ``known``: the receiver's known series (:meth:`Receiver.known_series`, serialised
        labels → slot). When the request is read as columns, the series it names are left as
        columns in :attr:`PushedBatch.known`, and the others parsed, with their places in
        the request and serialised labels."""
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
        try:  # the series left serialised: read as columns, or one by one
            request = SeriesWriteRequest.FromString(raw)
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
        series = list(request.timeseries)
        if known:
            tails = read_tails(series)
            if tails is not None:
                keys, timestamp_ms, value = tails
                slots = np.fromiter(map(known.get, keys, repeat(-1)), np.int64, len(keys))
                if (slots >= 0).all():  # every candidate a known label set: read exactly
                    positions = np.arange(len(keys))
                    batch.known = KnownSeries(slots, timestamp_ms, value, positions)
                    return batch
        columns = read_columns(series, limits.max_labels_per_series)
        if known is not None and columns is not None:
            return self._known_read(batch, columns, known)
        read = _raw_columns(columns) if columns is not None else _series_read(raw)
        for raw_labels, count, samples in zip(*read, strict=True):
            parsed = self._series(batch, raw_labels, count, samples)
            if parsed is not None:
                batch.series.append(parsed)
        return batch

    def _series(
        self, batch: PushedBatch, raw_labels: bytes, count: int, samples: list[tuple[int, float]]
    ) -> PushedSeries | None:
        """The series of ``raw_labels`` (serialised label fields, ``count`` of them) with
        ``samples``, or ``None`` when its labels are refused (counted in ``batch``)."""
        small = self._cacheable(raw_labels, count)
        try:
            name, labels, target = (self._label_set if small else self._parse_label_set)(raw_labels)
        except _LabelsRefused as refused:
            batch.refuse(refused.reason, refused.name)
            return None
        return PushedSeries(name, labels, target, samples)

    def _cacheable(self, raw_labels: bytes, count: int) -> bool:
        """Whether a label set is small enough to keep (parsed once, and a known series'
        key): see the module docstring."""
        return (
            count <= self.limits.max_labels_per_series
            and len(raw_labels) <= MAX_CACHED_LABEL_SET_BYTES
        )

    def _known_read(
        self, batch: PushedBatch, columns: SeriesColumns, known: Mapping[bytes, int]
    ) -> PushedBatch:
        """:meth:`decode`'s columnar read with the ``known`` series left as columns."""
        keys = columns.label_keys()
        slots = np.fromiter(map(known.get, keys, repeat(-1)), np.int64, len(keys))
        is_known = slots >= 0
        positions = np.flatnonzero(is_known)
        batch.known = KnownSeries(
            slots[positions],
            columns.timestamp_ms[positions],
            columns.value[positions],
            positions,
        )
        if len(positions) == len(keys):
            return batch
        counts, timestamps, values = columns.labels, columns.timestamp_ms, columns.value
        for position in np.flatnonzero(~is_known).tolist():
            raw_labels, count = keys[position], int(counts[position])
            sample = (int(timestamps[position]), float(values[position]))
            parsed = self._series(batch, raw_labels, count, [sample])
            if parsed is None:
                continue
            batch.series.append(parsed)
            batch.positions.append(position)
            batch.keys.append(raw_labels if self._cacheable(raw_labels, count) else b"")
        return batch
