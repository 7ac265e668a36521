"""Hostile remote-write bodies: refused with a reason and the right status, RSS bounded,
the receiver keeps serving (a real receiver process on loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import snappy

from pipeline.broker import free_port
from pipeline.bus import Bus
from tests.collectors.receive.running import post, write_request

TOKEN = "s3cret-token"
GOOD = write_request(
    [({"__name__": "vllm:num_requests_running", "job": "v", "instance": "h:1"}, [(1, 1.0)])]
)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def receiver_process(bus: Bus, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """``llmslo receive`` as a subprocess with a token; yields (port, pid)."""
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = tmp_path / "llmslo.yaml"
    config.write_text(
        json.dumps(
            {
                "bus": {
                    "bootstrap_servers": bus.bootstrap_servers,
                    "topic_prefix": bus.prefix,
                    "partitions": 2,
                },
                "receive": {"limits": {"max_series_per_request": 100_000}},
            }
        )
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmslo",
            "receive",
            "-c",
            str(config),
            "--port",
            str(port),
            "--bearer-token-file",
            str(tmp_path / "token"),
        ],
        stdout=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[3])},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/-/healthy", timeout=1).read()
            break
        except OSError:
            time.sleep(0.2)
    try:
        yield port, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        assert json.loads(out.decode().splitlines()[-1])["receive"] == "stopped"


def many_series(n: int) -> bytes:
    return write_request(
        [
            (
                {"__name__": "kube_pod_info", "job": "ksm", "instance": "h:1", "pod": f"p{i}"},
                [(1, 1.0)],
            )
            for i in range(n)
        ]
    )


HOSTILE = [
    pytest.param({}, snappy.compress(GOOD), 401, "unauthorized", id="no bearer token"),
    pytest.param(
        AUTH | {"Content-Encoding": "gzip"},
        snappy.compress(GOOD),
        415,
        "content_encoding",
        id="wrong content-encoding",
    ),
    pytest.param(
        AUTH, snappy.compress(GOOD[: len(GOOD) // 2]), 400, "protobuf", id="truncated protobuf"
    ),
    pytest.param(
        AUTH,
        b"\xff\xff\xff\xff\x7f" + b"\x00" * 64,
        400,
        "snappy",
        id="a snappy length header of more than 32 bits",
    ),
    # announces 4 GiB: refused from the header, before any decompression
    pytest.param(
        AUTH, varint(4 * 1024**3 - 1) + b"\x00" * 1024, 413, "decompressed_size", id="snappy bomb"
    ),
    pytest.param(
        AUTH,
        snappy.compress(many_series(100_001)),
        413,
        "series_per_request",
        id="too many series in one request",
    ),
]


@pytest.mark.parametrize(("headers", "body", "status", "reason"), HOSTILE)
def test_a_hostile_body_is_refused_with_its_reason_and_the_receiver_keeps_serving(
    receiver_process: tuple[int, int],
    headers: dict[str, str],
    body: bytes,
    status: int,
    reason: str,
) -> None:
    port, pid = receiver_process
    before = rss_kib(pid)
    got, text = post(port, body, headers=headers, compress=False)
    assert (got, reason in text) == (status, True), text
    assert rss_kib(pid) - before < 200 * 1024  # a refusal costs less than 200 MiB
    assert post(port, GOOD, headers=AUTH) == (204, "")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    assert f'llmslo_receive_refused_total{{reason="{reason}"}} 1.0' in metrics.decode()


def test_a_megabyte_label_value_refuses_its_series_and_keeps_the_others(
    receiver_process: tuple[int, int],
) -> None:
    port, _ = receiver_process
    body = write_request(
        [
            ({"__name__": "vllm:num_requests_running", "job": "v", "instance": "h:1"}, [(5, 1.0)]),
            (
                {
                    "__name__": "vllm:num_requests_waiting",
                    "job": "v",
                    "instance": "h:1",
                    "x": "a" * 1024 * 1024,
                },
                [(5, 1.0)],
            ),
        ]
    )
    status, text = post(port, body, headers=AUTH)
    assert status == 400 and "label_too_long: vllm:num_requests_waiting" in text
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'llmslo_receive_refused_total{reason="label_too_long"} 1.0' in metrics
    assert 'llmslo_receive_samples_total{door="remote_write"} 1.0' in metrics


def test_a_million_series_are_refused_and_rss_stays_bounded(
    receiver_process: tuple[int, int],
) -> None:
    port, pid = receiver_process
    body = snappy.compress(many_series(1_000_000))
    before = rss_kib(pid)
    status, text = post(port, body, headers=AUTH, compress=False)
    # 87 MB of protobuf in 8 MB of snappy: refused from the length header
    assert (status, "decompressed_size" in text) == (413, True), (status, text[:200])
    assert rss_kib(pid) - before < 600 * 1024
    assert post(port, GOOD, headers=AUTH) == (204, "")


def test_an_otlp_gzip_bomb_is_refused_before_it_inflates_and_the_receiver_keeps_serving(
    receiver_process: tuple[int, int],
) -> None:
    import gzip

    port, pid = receiver_process
    bomb = gzip.compress(b"\x00" * (1024 * 1024 * 1024), compresslevel=9)  # 1 GiB in ~1 MB
    before = rss_kib(pid)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/metrics",
        data=bomb,
        headers=AUTH | {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=60)
        raise AssertionError("a gzip bomb was accepted")
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    assert (status, b"decompressed_size" in text) == (413, True), text[:200]
    assert rss_kib(pid) - before < 200 * 1024  # inflated to the 64 MiB bound, no further
    assert post(port, GOOD, headers=AUTH) == (204, "")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'llmslo_receive_requests_total{code="413",door="otlp"} 1.0' in metrics
