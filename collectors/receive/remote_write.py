"""Prometheus remote-write 1.0: a snappy-compressed protobuf ``WriteRequest``.

:func:`decode_remote_write` checks the headers the spec requires (``Content-Encoding:
snappy``, ``Content-Type: application/x-protobuf``), reads the snappy length header and
refuses a body that would decompress past ``max_decompressed_bytes`` *before*
decompressing it (a snappy bomb costs nothing), then parses the protobuf. Every refusal is a
:class:`RefusedWrite` with a 4xx status (the sender must not retry it) and a reason.
"""

from __future__ import annotations

import snappy
from google.protobuf.message import DecodeError as ProtobufDecodeError

from collectors.receive._prompb import METADATA_TYPES, WriteRequest
from collectors.receive.config import ReceiveLimits
from collectors.receive.series import PushedBatch, PushedSeries, RefusedWrite, labels_refusal

__all__ = ["check_headers", "decode_remote_write", "snappy_length"]


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


def decode_remote_write(body: bytes, limits: ReceiveLimits) -> PushedBatch:
    """The series of one snappy remote-write body (headers checked by :func:`check_headers`);
    series past a label bound are refused and counted."""
    announced = snappy_length(body)
    if announced > limits.max_decompressed_bytes:
        raise RefusedWrite(
            413,
            "decompressed_size",
            f"snappy body announces {announced} bytes, more than {limits.max_decompressed_bytes}",
        )
    try:
        raw = snappy.uncompress(body)
    except Exception as exc:  # cramjam raises its own types: every one means a corrupt body
        raise RefusedWrite(400, "snappy", f"corrupt snappy body: {exc}"[:200]) from exc
    try:
        request = WriteRequest.FromString(raw)
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
    for series in request.timeseries:
        labels = tuple(sorted((label.name, label.value) for label in series.labels))
        name = next((value for key, value in labels if key == "__name__"), "")
        refusal = labels_refusal(labels, limits)
        if refusal is not None:
            batch.refuse(refusal, name[:100])
            continue
        samples = [(s.timestamp, s.value) for s in series.samples]
        batch.series.append(PushedSeries(name, labels, samples))
    return batch
