"""The known-series path: a remote-write's series already seen are deduplicated, grouped and
canonicalised as columns (slots), and store and drop exactly what the series-by-series path
does, down to the rows' order and every count."""

from __future__ import annotations

import json
import math
import struct

import pyarrow as pa
import snappy
from hypothesis import example, given, settings
from hypothesis import strategies as st

from collectors.receive._prompb import Label
from collectors.receive.config import ReceiveLimits
from collectors.receive.receiver import Receiver
from collectors.receive.remote_write import RemoteWriteDecoder
from collectors.receive.series import STALE_NAN_BITS
from pipeline.schema import RecordSchema
from tests.collectors.receive.running import length_delimited, varint, write_request

T0 = 1_764_000_000_000
RUNNING = "vllm:num_requests_running"
LATENCY = "vllm:e2e_request_latency_seconds"
STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
_LABEL_SETS = [
    {"__name__": "up", "pool": "chat"},
    {"__name__": "up", "pool": "batch"},  # the target relabelled
    {"__name__": "scrape_duration_seconds"},
    {"__name__": RUNNING, "model_name": "m", "engine": "0"},
    {"__name__": RUNNING, "model_name": "m", "engine": "1"},
    {"__name__": "vllm:prompt_tokens_total", "model_name": "m"},
    {"__name__": "vllm:prompt_tokens", "model_name": "m"},  # an unmapped name
    {"__name__": f"{LATENCY}_bucket", "model_name": "m", "le": "0.5"},
    {"__name__": f"{LATENCY}_bucket", "model_name": "m", "le": "+Inf"},
    {"__name__": f"{LATENCY}_sum", "model_name": "m"},
    {"__name__": f"{LATENCY}_count", "model_name": "m"},
]
_INSTANCES = ["10.0.0.7:8000", "10.0.0.8:8000"]
_ODD_VALUES = [0.0, 2.5, -1.0, math.inf, math.nan, STALE]
_MEMBERS = len(_LABEL_SETS) * len(_INSTANCES)
_Written = list[tuple[int, str, list[tuple[int, float]], bool]]


@st.composite
def _writes(draw: st.DrawFn) -> list[_Written]:
    """Writes as Prometheus sends them, mostly: scrapes of some of the series one after the
    other, a scrape's value the same in every series (so histograms are sound) — and now and
    then a write resent or late, a series sent twice, an odd value (a staleness marker, NaN,
    a negative count, +Inf), two samples in a series, or labels in another order."""
    writes = []
    for scrape in range(draw(st.integers(1, 7))):
        step = max(0, scrape + draw(st.sampled_from([0, 0, 0, -1, -2])))
        members = draw(
            st.lists(st.integers(0, _MEMBERS - 1), min_size=1, max_size=_MEMBERS, unique=True)
        )
        if draw(st.integers(0, 4)) == 0:  # a series sent twice: again, later or earlier
            members.append(members[0])
        written = []
        for i, member in enumerate(members):
            label_set, instance = divmod(member, len(_INSTANCES))
            at = step if i < len(set(members)) else max(0, step + draw(st.integers(-1, 1)))
            odd = draw(st.integers(0, 9)) == 0
            value = draw(st.sampled_from(_ODD_VALUES)) if odd else float(at + 1)
            samples = [(at, value)]
            if draw(st.integers(0, 99)) == 0:
                samples.append((at + 1, value))
            reverse = draw(st.integers(0, 49)) == 0
            written.append((label_set, _INSTANCES[instance], samples, reverse))
        writes.append(written)
    return writes


def _labels(label_set: int, instance: str) -> dict[str, str]:
    return _LABEL_SETS[label_set] | {"job": "vllm", "instance": instance}


def _body(written: _Written) -> bytes:
    """A remote-write body of ``written``; a series' labels in reverse order when asked (the
    same label set sent as other bytes)."""
    request = b""
    for label_set, instance, samples, reverse in written:
        pairs = sorted(_labels(label_set, instance).items(), reverse=reverse)
        encoded = b"".join(
            length_delimited(1, Label(name=k, value=v).SerializeToString()) for k, v in pairs
        )
        for step, value in samples:
            ts = T0 + 5000 * step
            bits = struct.unpack("<Q", struct.pack("<d", value))[0]
            sample = (b"\x09" + bits.to_bytes(8, "little") if bits else b"") + b"\x10" + varint(ts)
            encoded += length_delimited(2, sample)
        request += length_delimited(1, encoded)
    return snappy.compress(request)


def _published(tables: list[tuple[RecordSchema, pa.Table]]) -> list[tuple[str, str]]:
    out = [(schema.name, json.dumps(t.to_pylist(), sort_keys=True)) for schema, t in tables]
    tables.clear()
    return out


@settings(max_examples=300, deadline=None)
@given(
    _writes(),
    st.sampled_from([6, 2_000_000, 2_000_000]),
    st.sampled_from([3, 500_000, 500_000]),
)
@example(  # steady state: the same scrape twice, then resent, then a staleness marker
    [
        [(i, "10.0.0.7:8000", [(step, 1.0)], False) for i in (0, 3, 5, 7, 8, 9, 10)]
        for step in (0, 1, 1)
    ]
    + [[(3, "10.0.0.7:8000", [(2, STALE)], False), (5, "10.0.0.7:8000", [(2, 2.0)], False)]],
    2_000_000,
    500_000,
)
@example(  # a write whose only known samples are one series twice, NaN both times
    [
        [(i, "10.0.0.7:8000", [(0, 1.0)], True) for i in (0, 1)]
        + [(8, "10.0.0.8:8000", [(0, 1.0)], False)],
        [(8, "10.0.0.8:8000", [(3, math.nan)], False)] * 2,
    ],
    6,
    3,
)
def test_known_series_are_stored_and_dropped_as_the_series_by_series_path_does(
    writes: list[_Written], max_tracked: int, max_series_per_target: int
) -> None:
    limits = ReceiveLimits()
    columns: list[tuple[RecordSchema, pa.Table]] = []
    reference: list[tuple[RecordSchema, pa.Table]] = []
    receiver = Receiver(
        lambda s, t: columns.append((s, t)),
        max_tracked_series=max_tracked,
        max_series_per_target=max_series_per_target,
    )
    series_by_series = Receiver(
        lambda s, t: reference.append((s, t)),
        max_tracked_series=max_tracked,
        max_series_per_target=max_series_per_target,
    )
    decoder, reference_decoder = RemoteWriteDecoder(limits), RemoteWriteDecoder(limits)
    for written in writes:
        body = _body(written)
        batch = decoder.decode(body, receiver.known_series())
        expected_batch = reference_decoder.decode(body)
        assert batch.samples == expected_batch.samples
        assert batch.refused == expected_batch.refused
        report, expected = receiver.ingest(batch), series_by_series.ingest(expected_batch)
        assert (report.rows, report.dropped) == (expected.rows, expected.dropped)
        assert _published(columns) == _published(reference)
    assert receiver.targets == series_by_series.targets


def test_a_series_seen_once_is_then_read_as_columns_and_stored_from_its_slot() -> None:
    tables: list[tuple[RecordSchema, pa.Table]] = []
    receiver = Receiver(lambda s, t: tables.append((s, t)))
    decoder = RemoteWriteDecoder(ReceiveLimits())
    running = _labels(3, _INSTANCES[0])
    for step in range(3):
        body = snappy.compress(write_request([(running, [(T0 + 5000 * step, float(step))])]))
        batch = decoder.decode(body, receiver.known_series())
        assert batch.known is not None
        assert (len(batch.known.slots), len(batch.series)) == ((0, 1) if step == 0 else (1, 0))
        assert receiver.ingest(batch).rows == {"engine_sample": 1}
    assert [r["value"] for _, t in tables for r in t.to_pylist()] == [0.0, 1.0, 2.0]
    # a resent write is a duplicate, found on the columns
    batch = decoder.decode(body, receiver.known_series())
    assert receiver.ingest(batch).dropped == {"duplicate": 1}
