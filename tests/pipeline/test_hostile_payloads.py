"""Hostile payloads: a decompression bomb and a 64 MiB message are dead-lettered, and the
ingester neither balloons nor stops."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pyarrow as pa
import pytest

from pipeline._ipc_size import decoded_size
from pipeline.bus import Bus
from pipeline.codec import JSON_CONTENT_TYPE, decode_message, encode_arrow, headers_for
from pipeline.config import IngestConfig
from pipeline.errors import DecodeError
from pipeline.ingest import Ingester
from pipeline.schema import ENGINE_SAMPLES
from pipeline.store import DEADLETTER_PAYLOAD_LIMIT, Store
from tests.pipeline.ingest_helpers import numbered_samples

MiB = 1024 * 1024
_ROWS_PER_CHUNK = 1_000_000
_CHUNKS = 34  # ~2 GB once decompressed, ~8 MB on the wire


def _bomb_bytes() -> bytes:
    """An LZ4 Arrow stream of ~34 M zero samples: a few MB that decompress to gigabytes."""
    zeros = np.zeros(_ROWS_PER_CHUNK, np.int64)
    one = lambda text: pa.DictionaryArray.from_arrays(  # noqa: E731
        pa.array(np.zeros(_ROWS_PER_CHUNK, np.int32)), pa.array([text])
    )
    chunk = pa.table(
        {
            "ts_ms": zeros,
            "instance": one("pod-0"),
            "metric": one("vllm:num_requests_running"),
            "signal": one("running"),
            "kind": one("gauge"),
            "value": zeros.astype(np.float64),
        }
    )
    return encode_arrow(ENGINE_SAMPLES, pa.concat_tables([chunk] * _CHUNKS))


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _bomb_bytes()


class _PeakRss:
    """Samples this process's RSS every 5 ms while in use; ``growth_bytes`` over the start."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def growth_bytes(self) -> int:
        return self.peak - self.start


@pytest.fixture
def peak_rss() -> Iterator[_PeakRss]:
    with _PeakRss() as sampler:
        yield sampler


def test_a_decompression_bomb_is_refused_before_decompressing(
    bomb: bytes, peak_rss: _PeakRss
) -> None:
    assert len(bomb) < 16 * MiB  # it passes the wire-size limit
    with pytest.raises(DecodeError) as refused:
        decode_message(bomb, headers_for(ENGINE_SAMPLES))
    assert refused.value.reason == "oversized_decoded"
    assert "decodes to" in str(refused.value)
    assert peak_rss.growth_bytes < 100 * MiB  # decompressing it would take ~2 GB


def test_a_buffer_declaring_a_terabyte_is_refused_without_allocating_it() -> None:
    # A lying length prefix: Arrow would allocate what the buffer declares before reading it.
    honest = encode_arrow(ENGINE_SAMPLES, numbered_samples(0, 1000, "pod-0"))
    marker = struct.pack("<q", 8 * 1000)  # the ts_ms buffer's uncompressed length
    at = honest.rindex(marker)
    lying = honest[:at] + struct.pack("<q", 1 << 40) + honest[at + 8 :]
    with pytest.raises(DecodeError) as refused:
        decode_message(lying, headers_for(ENGINE_SAMPLES))
    assert refused.value.reason == "oversized_decoded"


@pytest.mark.parametrize(
    ("rows", "compressed"),
    [(1, True), (50_000, True), (50_000, False)],
    ids=["one row", "a large lz4 message", "an uncompressed message"],
)
def test_the_decoded_size_is_what_arrow_allocates(rows: int, compressed: bool) -> None:
    table = numbered_samples(0, rows, "pod-0")
    if compressed:
        payload = encode_arrow(ENGINE_SAMPLES, table)
    else:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        payload = sink.getvalue().to_pybytes()
    size = decoded_size(payload)
    assert size is not None
    decoded = pa.ipc.open_stream(payload).read_all()
    # Buffers plus their padding: never less than the table, and not far above it.
    assert decoded.nbytes <= size <= decoded.nbytes + 4096
    # A limit at the exact size lets the message through; one byte less refuses it.
    assert decode_message(payload, headers_for(ENGINE_SAMPLES), max_decoded_bytes=size)
    with pytest.raises(DecodeError):
        decode_message(payload, headers_for(ENGINE_SAMPLES), max_decoded_bytes=size - 1)


def test_hostile_messages_are_dead_lettered_and_the_consumer_goes_on(
    bus: Bus, store: Store, bomb: bytes, peak_rss: _PeakRss
) -> None:
    huge_json = b"[" + b" " * (64 * MiB) + b"]"
    producer = bus.producer(max_request_size=80 * MiB)
    producer.publish(ENGINE_SAMPLES, numbered_samples(0, 100, "pod-0"))
    producer.send_raw("engine", bomb, key=b"pod-0", headers=headers_for(ENGINE_SAMPLES))
    producer.send_raw(
        "engine",
        huge_json,
        key=b"pod-0",
        headers=headers_for(ENGINE_SAMPLES, JSON_CONTENT_TYPE),
    )
    producer.publish(ENGINE_SAMPLES, numbered_samples(100, 100, "pod-0"))
    producer.flush()
    producer.close()
    del huge_json
    peak_rss.start = peak_rss.process.memory_info().rss  # what the ingester adds
    started = time.monotonic()
    ingester = Ingester(bus, store, IngestConfig(group_id=bus.prefix, max_message_bytes=16 * MiB))
    ingester.run(max_idle_s=2.0)
    letters = store.con.execute(
        "SELECT reason, payload_bytes, octet_length(payload) FROM deadletter ORDER BY reason"
    ).fetchall()
    assert letters == [
        ("oversized", 64 * MiB + 2, DEADLETTER_PAYLOAD_LIMIT),
        ("oversized_decoded", len(bomb), DEADLETTER_PAYLOAD_LIMIT),
    ]
    values = store.con.execute("SELECT value FROM engine_samples ORDER BY value").fetchall()
    assert [v for (v,) in values] == list(range(200))  # the messages after them too
    # The Kafka client's copies of the 64 MiB message (fetch buffer, record, value: ~4 ×
    # 64 MiB, measured 320 MiB) are the largest thing held; decompressing the bomb would
    # add ~2 GB. The broker's message size limit is what keeps such a message out.
    assert peak_rss.growth_bytes < 400 * MiB, peak_rss.growth_bytes
    assert time.monotonic() - started < 60
