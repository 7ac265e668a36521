"""Reading a remote-write request's series as columns, with numpy, in one pass over its bytes.

Prometheus writes every ``TimeSeries`` the same way: its labels (field 1), then one sample
(field 2) holding ``value`` (field 1, fixed64) and ``timestamp`` (field 2, varint), a field
left out when zero (proto3). :func:`read_columns` walks the series of a request side by side
— step *k* reads the *k*-th field of every series at once — and gives, per series, where its
serialised labels lie (the bytes that key the label-set cache) and its timestamp and value.
No Python object is made per label or per sample.

Every byte of a series is accounted for: label fields end to end, then exactly one sample
field ending where the series ends, whose payload is one of the four layouts a proto3
encoder writes. Anything else — a second sample, an exemplar, a label length of three
varint bytes or more, a ten-byte (negative) timestamp, fields out of order — makes
:func:`read_columns` answer ``None``, and the caller reads the request series by series.
What the labels say is not checked here: a label set is parsed (and refused if unreadable)
when it is first seen.

:func:`read_tails` reads a request whose series are already known faster: each series'
sample from its end, and the bytes before it as the candidate labels the caller looks up
(no walk through the labels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SeriesColumns", "read_columns"]

_LABEL_TAG, _SAMPLE_TAG = 0x0A, 0x12  # TimeSeries: field 1 and field 2, length-delimited
_VALUE_TAG, _TIMESTAMP_TAG = 0x09, 0x10  # Sample: field 1 fixed64, field 2 varint
#: The longest timestamp varint read here (9 bytes: any int64 from 0 to 2**63 - 1).
_MAX_VARINT = 9
#: Bytes past the end of the joined series, so every gather stays inside the buffer.
_PAD = 2 + 1 + 8 + 1 + _MAX_VARINT + 8


@dataclass(frozen=True)
class SeriesColumns:
    """The series of one request, as columns (one entry per series, in request order).

    ``blob`` is the series joined end to end; a series' serialised label fields are
    ``blob[label_start[i]:label_end[i]]`` (``labels[i]`` of them). ``timestamp_ms`` and
    ``value`` are its one sample.
    """

    blob: bytes
    label_start: np.ndarray
    label_end: np.ndarray
    labels: np.ndarray
    timestamp_ms: np.ndarray
    value: np.ndarray

    def label_keys(self) -> list[bytes]:
        """Each series' serialised labels (a slice of :attr:`blob`)."""
        blob = self.blob
        return [
            blob[a:b]
            for a, b in zip(self.label_start.tolist(), self.label_end.tolist(), strict=True)
        ]


def _varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, length) of the varint at each offset ``at``; length 0 where it is longer than
    :data:`_MAX_VARINT` bytes."""
    window = buf[at[:, None] + np.arange(_MAX_VARINT)].astype(np.uint64)
    ends = (window & 0x80) == 0
    has_end = ends.any(axis=1)
    length = np.where(has_end, ends.argmax(axis=1) + 1, 0)
    used = np.arange(_MAX_VARINT) < length[:, None]
    shifts = (7 * np.arange(_MAX_VARINT)).astype(np.uint64)
    value = (np.where(used, window & 0x7F, 0) << shifts).sum(axis=1, dtype=np.uint64)
    return value.view(np.int64), length


def read_columns(series: list[bytes], max_labels: int) -> SeriesColumns | None:
    """The series of a request (each a serialised ``TimeSeries``) as columns, or ``None``
    unless every one is labels then one sample (see the module docstring) and has at most
    ``max_labels`` labels: each step reads one label of every series, so the steps are
    bounded (a series with more is refused by the per-series read)."""
    count = len(series)
    lengths = np.fromiter(map(len, series), np.int64, count)
    blob = b"".join(series)
    buf = np.frombuffer(blob + bytes(_PAD), np.uint8)
    stop = np.cumsum(lengths)
    start = stop - lengths
    # the label fields, one step per field: a tag, a one- or two-byte length, the label
    at, labels = start.copy(), np.zeros(count, np.int64)
    reading = at < stop
    while reading.any():
        if labels.max() > max_labels:
            return None
        reading &= buf[at] == _LABEL_TAG
        first, second = buf[at + 1].astype(np.int64), buf[at + 2].astype(np.int64)
        short = first < 0x80
        if (reading & ~short & (second >= 0x80)).any():
            return None  # a label of 16 KiB or more: left to the per-series read
        size = np.where(short, 2 + first, 3 + (first & 0x7F) + (second << 7))
        at = np.where(reading, at + size, at)
        if (at > stop).any():
            return None  # a label running past its series (and maybe past the buffer)
        labels += reading
        reading &= at < stop
    # then one sample field, ending where the series ends
    sample = at + 2
    ok = (at + 2 <= stop) & (buf[at] == _SAMPLE_TAG) & (buf[at + 1] < 0x80)
    ok &= sample + buf[at + 1] == stop
    if not ok.all():
        return None
    size = buf[at + 1].astype(np.int64)
    has_value = (size >= 9) & (buf[sample] == _VALUE_TAG)
    ts_at = sample + 9 * has_value
    has_ts = (ts_at < stop) & (buf[ts_at] == _TIMESTAMP_TAG)
    timestamp, ts_length = _varints(buf, ts_at + 1)
    ends = ts_at + np.where(has_ts, 1 + ts_length, 0)
    if not ((ends == stop) & (~has_ts | (ts_length > 0))).all():
        return None
    value = buf[(sample + 1)[:, None] + np.arange(8)].copy().view("<f8").ravel()
    return SeriesColumns(
        blob,
        start,
        at,
        labels,
        np.where(has_ts, timestamp, 0),
        np.where(has_value, value, 0.0),
    )


#: Bytes before the joined series, so a gather back from a series' end stays in the buffer.
_BACK = 2 + 1 + 8 + 1 + 8
_BACK_BYTES = bytes(_BACK)
#: Per pattern of the continuation bits of the last 8 bytes (bit ``j``: byte ``j`` of them),
#: the length of the varint ending the last byte: 1 + the continuation bytes right before it.
_TAIL_VARINT = np.array(
    [1 + next(k for k in range(8) if k == 7 or not p >> (6 - k) & 1) for p in range(256)],
    np.int64,
)


def read_tails(series: list[bytes]) -> tuple[list[bytes], np.ndarray, np.ndarray] | None:
    """Each series' serialised labels, timestamp and value, read back from its end, or
    ``None`` unless every series ends with one sample field holding a timestamp of at most
    7 varint bytes, below 2⁴⁹ ms (what Prometheus writes: the value, when not zero, then the
    timestamp; a longer one takes the columnar read).

    The label bytes are only *candidates*: they are everything before that last field, and
    are not walked. A candidate that is a label set :func:`read_columns` has read is a
    sequence of label fields, so a parse from the series' start ends where it ends and reads
    that sample field next: for such a series, this read is exactly :func:`read_columns`'.
    The caller must use a series' sample only when its candidate is one it knows.
    """
    count = len(series)
    lengths = np.fromiter(map(len, series), np.int64, count)
    joined = b"".join([_BACK_BYTES, *series])
    buf = np.frombuffer(joined, np.uint8)
    stop = np.cumsum(lengths) + _BACK
    start = stop - lengths
    # the series' last 8 bytes as one little-endian word: the timestamp varint ends it
    last8 = buf[(stop - 8)[:, None] + np.arange(8)].copy().view("<u8").ravel()
    continuation = (last8 >> np.uint64(7)) & np.uint64(0x0101010101010101)
    pattern = (continuation * np.uint64(0x0102040810204080)) >> np.uint64(56)  # bit j: byte j
    length = _TAIL_VARINT[pattern.astype(np.int64)]
    varint = last8 >> (np.uint64(8) * (8 - length).astype(np.uint64))  # its bytes, zero above
    timestamp = np.zeros(count, np.uint64)
    for k in range(8):
        timestamp |= ((varint >> np.uint64(8 * k)) & np.uint64(0x7F)) << np.uint64(7 * k)
    tag = stop - length - 1
    ok = (pattern < 0x80) & (length < 8) & (buf[tag] == _TIMESTAMP_TAG)
    # before it, the value (fixed64) unless zero, and the sample field's tag and length
    with_value = (buf[tag - 11] == _SAMPLE_TAG) & (buf[tag - 10] == 10 + length)
    with_value &= buf[tag - 9] == _VALUE_TAG
    timestamp_only = (buf[tag - 2] == _SAMPLE_TAG) & (buf[tag - 1] == 1 + length)
    field = np.where(with_value, tag - 11, tag - 2)
    ok &= (with_value | timestamp_only) & (field >= start)
    if not ok.all():
        return None
    value = buf[(tag - 8)[:, None] + np.arange(8)].copy().view("<f8").ravel()
    keys = [joined[a:b] for a, b in zip(start.tolist(), field.tolist(), strict=True)]
    return keys, timestamp.view(np.int64), np.where(with_value, value, 0.0)
