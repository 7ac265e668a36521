"""A real receiver on loopback for tests: :func:`running_receiver` and a remote-write sender."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import snappy

from collectors.receive._prompb import WriteRequest
from collectors.receive.config import ReceiveConfig
from collectors.receive.service import ReceiveService
from pipeline.bus import Bus

Labels = dict[str, str]


@contextmanager
def running_receiver(bus: Bus, config: ReceiveConfig | None = None) -> Iterator[ReceiveService]:
    """A :class:`ReceiveService` serving on a free loopback port, publishing to ``bus``."""
    service = ReceiveService(config or ReceiveConfig(port=0), bus.producer)
    stop = threading.Event()
    worker = threading.Thread(target=service.run, args=(stop,), daemon=True)
    worker.start()
    assert service.ready.wait(30), "receiver did not start"
    try:
        yield service
    finally:
        stop.set()
        worker.join(60)


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of ``value`` (a negative int64 as its two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            return bytes(out + bytes((byte,)))
        out.append(byte | 0x80)


def length_delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field ``number`` holding ``payload``, written by hand
    (for bodies the generated classes would not write: label orders, field layouts)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def write_request(series: list[tuple[Labels, list[tuple[int, float]]]]) -> bytes:
    """A serialised (uncompressed) ``WriteRequest`` of ``series``."""
    request = WriteRequest()
    for labels, samples in series:
        ts = request.timeseries.add()
        for name, value in sorted(labels.items()):
            ts.labels.add(name=name, value=value)
        for ts_ms, sample in samples:
            ts.samples.add(value=sample, timestamp=ts_ms)
    return request.SerializeToString()


def post(
    port: int,
    body: bytes,
    *,
    headers: dict[str, str] | None = None,
    compress: bool = True,
) -> tuple[int, str]:
    """POST a remote-write body; returns (status, response text)."""
    sent = {
        "Content-Encoding": "snappy",
        "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    } | (headers or {})
    data = snappy.compress(body) if compress else body
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/write", data=data, headers=sent, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
