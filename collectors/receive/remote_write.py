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
"""

from __future__ import annotations

import functools
import sys

import snappy
from google.protobuf.message import DecodeError as ProtobufDecodeError

from collectors.receive._prompb import METADATA_TYPES, KeyedWriteRequest, Label
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

    def label_set(self, raw: tuple[bytes, ...]) -> _LabelSet:
        """:meth:`_parse_label_set`, from the cache when ``raw`` is small enough to keep."""
        if len(raw) > self.limits.max_labels_per_series or (
            sum(map(len, raw)) > MAX_CACHED_LABEL_SET_BYTES
        ):
            return self._parse_label_set(raw)
        return self._label_set(raw)

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
        label_set, out = self.label_set, batch.series
        for series in request.timeseries:
            try:
                name, labels, target = label_set(tuple(series.labels))
            except _LabelsRefused as refused:
                batch.refuse(refused.reason, refused.name)
                continue
            out.append(
                PushedSeries(name, labels, target, [(s.timestamp, s.value) for s in series.samples])
            )
        return batch
