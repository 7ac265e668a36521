"""The remote-write decoder: label sets parsed once, in a bounded LRU cache that cannot lie;
a write read as columns reads what a series-by-series parse reads, whatever the encoding."""

from __future__ import annotations

import struct

import pytest
import snappy
from hypothesis import example, given, settings
from hypothesis import strategies as st

from collectors.receive._columns import read_columns
from collectors.receive._prompb import KeyedWriteRequest, Label, LabelSet, SeriesWriteRequest
from collectors.receive.config import ReceiveLimits
from collectors.receive.remote_write import (
    MAX_CACHED_LABEL_SET_BYTES,
    RemoteWriteDecoder,
    _columns_read,
    _series_read,
)
from collectors.receive.series import RefusedWrite
from tests.collectors.receive.running import length_delimited, varint, write_request

T0 = 1_764_000_000_000


def series(pod: int, *, name: str = "vllm:num_requests_running") -> dict[str, str]:
    return {"__name__": name, "job": "vllm", "instance": "10.0.0.7:8000", "pod": f"vllm-{pod}"}


def body(*pods: int, ts_ms: int = T0) -> bytes:
    return snappy.compress(write_request([(series(p), [(ts_ms, float(p))]) for p in pods]))


def test_the_cache_holds_at_most_its_bound_and_every_series_is_still_decoded() -> None:
    decoder = RemoteWriteDecoder(ReceiveLimits(max_cached_label_sets=10))
    batch = decoder.decode(body(*range(50)))
    assert [dict(s.labels)["pod"] for s in batch.series] == [f"vllm-{p}" for p in range(50)]
    assert [s.samples for s in batch.series] == [[(T0, float(p))] for p in range(50)]
    assert decoder.cache_info().currsize == 10


def test_the_least_recently_used_label_set_is_evicted_and_parsed_again_the_same() -> None:
    decoder = RemoteWriteDecoder(ReceiveLimits(max_cached_label_sets=2))
    first = decoder.decode(body(0)).series[0]
    decoder.decode(body(1))
    decoder.decode(body(0))  # 0 is now more recent than 1
    decoder.decode(body(2))  # evicts 1, the least recently used
    misses = decoder.cache_info().misses
    again = decoder.decode(body(0, ts_ms=T0 + 5000)).series[0]
    assert decoder.cache_info().misses == misses, "the recently used label set was evicted"
    decoder.decode(body(1))
    assert decoder.cache_info().misses == misses + 1, "the least recently used one was kept"
    assert (again.name, again.labels, again.target) == (first.name, first.labels, first.target)
    assert again.target == ("vllm", "10.0.0.7:8000")
    assert again.samples == [(T0 + 5000, 0.0)]


def test_a_refused_or_long_label_set_is_never_cached() -> None:
    limits = ReceiveLimits(max_label_value_bytes=4096)
    decoder = RemoteWriteDecoder(limits)
    long = series(0) | {"note": "x" * (MAX_CACHED_LABEL_SET_BYTES + 1)}
    too_long = series(1) | {"note": "x" * 5000}
    batch = decoder.decode(
        snappy.compress(write_request([(long, [(T0, 1.0)]), (too_long, [(T0, 1.0)])]))
    )
    assert [dict(s.labels)["pod"] for s in batch.series] == ["vllm-0"]
    assert batch.refused == {"label_too_long": 1}
    assert decoder.cache_info().currsize == 0
    # the refusal is not remembered as an answer: the same set is refused again
    assert decoder.decode(snappy.compress(write_request([(too_long, [(T0, 1.0)])]))).refused == {
        "label_too_long": 1
    }


@pytest.mark.parametrize(
    "label",
    [
        pytest.param(b"\x0a\x05vll", id="a truncated label"),
        pytest.param(Label(value="x").SerializeToString()[:1] + b"\x02\xff\xfe", id="bad utf-8"),
    ],
)
def test_an_unreadable_label_refuses_the_write_though_the_request_parses(label: bytes) -> None:
    request = KeyedWriteRequest()
    request.timeseries.add(labels=[label]).samples.add(value=1.0, timestamp=T0)
    with pytest.raises(RefusedWrite) as refused:
        RemoteWriteDecoder(ReceiveLimits()).decode(snappy.compress(request.SerializeToString()))
    assert (refused.value.status, refused.value.reason) == (400, "protobuf")


# -- the columnar read: every sample to its own series, whatever the encoding ------------------

STALE_BITS = 0x7FF0000000000002


def _sample(ts_ms: int, value_bits: int, layout: str) -> bytes:
    value = b"\x09" + value_bits.to_bytes(8, "little")
    ts = b"\x10" + varint(ts_ms)
    return {
        # what a proto3 encoder writes: a field at its default value is left out
        "canonical": (value if value_bits else b"") + (ts if ts_ms else b""),
        "timestamp first": ts + value,
        "value twice": b"\x09" + (1).to_bytes(8, "little") + value + ts,
        "unknown field": value + ts + b"\x18\x01",
        # one byte more than needed (a varint has at most 10)
        "padded varint": value + b"\x10" + varint(ts_ms)[:-1] + bytes((varint(ts_ms)[-1] | 0x80, 0))
        if len(varint(ts_ms)) < 10
        else value + ts,
    }[layout]


_LAYOUTS = st.sampled_from(
    ["canonical"] * 6 + ["timestamp first", "value twice", "unknown field", "padded varint"]
)
_VALUE_BITS = st.one_of(
    st.sampled_from([0, 1 << 63, STALE_BITS, 0x7FF8000000000000, 0x3FF0000000000000]),
    st.integers(0, (1 << 64) - 1),
)
_TIMESTAMPS = st.one_of(st.sampled_from([0, T0, -1, 1]), st.integers(-(1 << 63), (1 << 63) - 1))
_SAMPLES = st.lists(st.tuples(_TIMESTAMPS, _VALUE_BITS, _LAYOUTS), max_size=3)
_SERIES = st.tuples(
    st.integers(0, 30),  # the pod: several series of one request may share a label set
    st.booleans(),  # an empty label (name and value ""), as the bulk read's end marker is
    st.booleans(),  # an exemplar (field 3), which the receiver skips
    _SAMPLES,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_SERIES, min_size=1, max_size=12))
@example(
    [(0, False, False, [(T0, 1, "canonical"), (T0 + 1, 2, "canonical")]), (1, False, False, [])]
)
@example(  # as Prometheus writes: one sample per series, zero values and timestamps left out
    [
        (0, False, False, [(T0, 0, "canonical")]),
        (1, True, False, [(0, STALE_BITS, "canonical")]),
        (2, False, False, [(0, 0, "canonical")]),
        (0, False, False, [(T0 + 1, 0x3FF0000000000000, "canonical")]),
    ]
)
def test_every_sample_is_read_into_its_own_series_whatever_the_encoding(
    written: list[tuple[int, bool, bool, list[tuple[int, int, str]]]],
) -> None:
    request = b""
    expected = []
    for pod, empty_label, exemplar, samples in written:
        labels = series(pod) | ({"": ""} if empty_label else {})
        encoded = b"".join(
            length_delimited(1, Label(name=k, value=v).SerializeToString())
            for k, v in sorted(labels.items())
        )
        encoded += b"".join(length_delimited(2, _sample(*sample)) for sample in samples)
        encoded += length_delimited(3, b"\x0a\x00\x11" + bytes(8)) if exemplar else b""
        request += length_delimited(1, encoded)
        expected.append((tuple(sorted(labels.items())), [(ts, bits) for ts, bits, _ in samples]))
    batch = RemoteWriteDecoder(ReceiveLimits()).decode(snappy.compress(request))
    got = [
        (s.labels, [(ts, struct.unpack("<Q", struct.pack("<d", v))[0]) for ts, v in s.samples])
        for s in batch.series
    ]
    assert got == expected


def test_a_prometheus_write_is_read_as_columns_sample_by_sample_as_sent() -> None:
    pods = list(range(40))
    # proto3 leaves a zero value or a zero timestamp out: four layouts of one sample
    samples = [(T0 + p, float(p)) for p in pods] + [(0, 1.0), (0, 0.0), (T0, 0.0), (T0, STALE)]
    long = {"note": "x" * 300}  # a label longer than 127 bytes: a two-byte length
    raw = write_request(
        [(series(p), [sample]) for p, sample in enumerate(samples[:-1])]
        + [(series(len(samples) - 1) | long, [samples[-1]])]
    )
    columns = read_columns(list(SeriesWriteRequest.FromString(raw).timeseries), 64)
    assert columns is not None, "a request as Prometheus sends it was not read as columns"
    read = [
        dict((lb.name, lb.value) for lb in LabelSet.FromString(k).labels)
        for k in columns.label_keys()
    ]
    assert [labels["pod"] for labels in read] == [f"vllm-{p}" for p in range(len(samples))]
    assert read[-1]["note"] == long["note"]
    assert columns.labels.tolist() == [4] * (len(samples) - 1) + [5]
    got = list(zip(columns.timestamp_ms.tolist(), columns.value.view("<u8").tolist(), strict=True))
    assert got == [(ts, _bits(value)) for ts, value in samples]


STALE = struct.unpack("<d", STALE_BITS.to_bytes(8, "little"))[0]


def _bits(value: float) -> int:
    return int.from_bytes(struct.pack("<d", value), "little")


# one sample per series as Prometheus sends, in every layout an encoder may write, beside
# what the columnar read must leave to the per-series parse
_ONE_SAMPLE = st.tuples(
    _TIMESTAMPS,
    _VALUE_BITS,
    st.sampled_from(["canonical"] * 8 + ["timestamp first", "value twice", "unknown field"]),
)
_WRITTEN = st.tuples(
    st.integers(0, 30),
    st.sampled_from(["", "x", "y" * 127, "z" * 128, "w" * 2000]),  # 1- and 2-byte lengths
    st.booleans(),  # an exemplar
    st.one_of(_ONE_SAMPLE.map(lambda sample: [sample]), st.lists(_ONE_SAMPLE, max_size=2)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_WRITTEN, max_size=10))
@example([(0, "", False, [(T0, 0x3FF0000000000000, "canonical")])])
@example([(0, "w" * 2000, False, [(0, 0, "canonical")]), (1, "", False, [(-1, 1, "canonical")])])
def test_the_columnar_read_reads_what_the_series_by_series_parse_reads(
    written: list[tuple[int, str, bool, list[tuple[int, int, str]]]],
) -> None:
    request = b""
    for pod, note, exemplar, samples in written:
        labels = series(pod) | ({"note": note} if note else {})
        encoded = b"".join(
            length_delimited(1, Label(name=k, value=v).SerializeToString())
            for k, v in sorted(labels.items())
        )
        encoded += b"".join(length_delimited(2, _sample(*sample)) for sample in samples)
        encoded += length_delimited(3, b"\x0a\x00\x11" + bytes(8)) if exemplar else b""
        request += length_delimited(1, encoded)
    as_columns = _columns_read(list(SeriesWriteRequest.FromString(request).timeseries), 64)
    prometheus_like = all(
        len(samples) == 1 and samples[0][2] == "canonical" and samples[0][0] >= 0 and not exemplar
        for _, _, exemplar, samples in written
    )
    assert (as_columns is not None) == prometheus_like
    if as_columns is not None:
        keys, counts, read = as_columns
        expected_keys, expected_counts, expected = _series_read(request)
        assert (keys, counts) == (expected_keys, expected_counts)
        assert [[(ts, _bits(v)) for ts, v in s] for s in read] == [
            [(ts, _bits(v)) for ts, v in s] for s in expected
        ]


def test_a_series_of_more_labels_than_the_bound_is_left_to_the_per_series_read_and_refused() -> (
    None
):
    many = series(0) | {f"l{i}": "v" for i in range(100_000)}
    raw = write_request([(many, [(T0, 1.0)]), (series(1), [(T0, 2.0)])])
    # the columnar read stops after max_labels steps instead of one per label of the series
    assert read_columns(list(SeriesWriteRequest.FromString(raw).timeseries), 64) is None
    batch = RemoteWriteDecoder(ReceiveLimits()).decode(snappy.compress(raw))
    assert batch.refused == {"labels_per_series": 1}
    assert [dict(s.labels)["pod"] for s in batch.series] == ["vllm-1"]


# -- known series read back from their end: exactly the columnar read, or the general path --

#: A label value that is, byte for byte, a sample field (value 0x41…41, timestamp 5): a series
#: ending with it and no sample must not be read as one.
_LOOKS_LIKE_A_SAMPLE = "\x12\x0b\x09AAAAAAAA\x10\x05"
#: Mostly as Prometheus writes, with every varint length of a timestamp and the other layouts.
_TAIL_SAMPLE = st.tuples(
    st.one_of(
        *[st.sampled_from([T0, T0 + 1, 1, 1 << 48])] * 30,
        st.just(1 << 55),
        st.sampled_from([0, -1]),
        st.integers(0, (1 << 63) - 1),
    ),
    _VALUE_BITS,
    st.sampled_from(["canonical"] * 40 + ["timestamp first", "value twice", "unknown field"]),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 6),
            st.sampled_from(["", "x", "z" * 128, _LOOKS_LIKE_A_SAMPLE]),
            st.one_of(
                *[_TAIL_SAMPLE.map(lambda sample: [sample])] * 30,
                st.lists(_TAIL_SAMPLE, max_size=2),
            ),
        ),
        min_size=1,
        max_size=6,
    ),
    st.one_of(st.just(set(range(7))), st.sets(st.integers(0, 6))),
)
@example([(0, "", [(T0, 0, "canonical")]), (1, "x", [(T0, 1, "canonical")])], {0, 1})
@example([(0, _LOOKS_LIKE_A_SAMPLE, [])], {0})
def test_known_series_read_from_their_end_read_what_the_series_by_series_parse_reads(
    written: list[tuple[int, str, list[tuple[int, int, str]]]], known_pods: set[int]
) -> None:
    """The decoder reads a write whose series are all known from each series' end (its
    labels' bytes not walked): whatever the write, it gives each sample to the series the
    series-by-series parse gives it to, or leaves the write to the columnar or general read."""
    request = b""
    known: dict[bytes, int] = {}
    for pod, note, samples in written:
        labels = series(pod) | ({"note": note} if note else {})
        key = b"".join(
            length_delimited(1, Label(name=k, value=v).SerializeToString())
            for k, v in sorted(labels.items())
        )
        if pod in known_pods:
            known.setdefault(key, len(known))
        request += length_delimited(
            1, key + b"".join(length_delimited(2, _sample(*sample)) for sample in samples)
        )
    expected = RemoteWriteDecoder(ReceiveLimits()).decode(snappy.compress(request))
    batch = RemoteWriteDecoder(ReceiveLimits()).decode(snappy.compress(request), known)
    labels_of = {
        slot: tuple(sorted((lb.name, lb.value) for lb in LabelSet.FromString(key).labels))
        for key, slot in known.items()
    }
    positions = batch.positions if batch.known is not None else range(len(batch.series))
    got: list[tuple[int, tuple[tuple[str, str], ...], list[tuple[int, int]]]] = [
        (position, s.labels, [(ts, _bits(v)) for ts, v in s.samples])
        for position, s in zip(positions, batch.series, strict=True)
    ]
    if batch.known is not None:
        columns = batch.known
        got += [
            (position, labels_of[slot], [(ts, bits)])
            for position, slot, ts, bits in zip(
                columns.positions.tolist(),
                columns.slots.tolist(),
                columns.timestamp_ms.tolist(),
                columns.value.view("<u8").tolist(),
                strict=True,
            )
        ]
    assert [(labels, samples) for _, labels, samples in sorted(got, key=lambda g: g[0])] == [
        (s.labels, [(ts, _bits(v)) for ts, v in s.samples]) for s in expected.series
    ]
