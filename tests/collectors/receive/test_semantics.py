"""Prometheus semantics through a real receiver into DuckDB: naming, staleness, up, dedup."""

from __future__ import annotations

import json
import struct

from pipeline.bus import Bus
from pipeline.store import Store
from tests.collectors.receive.running import post, running_receiver, write_request
from tests.collectors.test_collect import ingest_until

STALE = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
T0 = 1_764_000_000_000
TARGET = {"job": "vllm", "instance": "10.0.0.7:8000"}


def vllm_series(
    ts: list[int], running: list[float]
) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    """A vLLM target's scrapes at ``ts``: its ``up``, a gauge, a counter, an unmapped gauge."""
    return [
        ({"__name__": "up", **TARGET, "pod": "vllm-0", "pool": "chat"}, [(t, 1.0) for t in ts]),
        (
            {
                "__name__": "vllm:num_requests_running",
                **TARGET,
                "pod": "vllm-0",
                "pool": "chat",
                "model_name": "llama",
            },
            list(zip(ts, running, strict=True)),
        ),
        (
            {
                "__name__": "vllm:generation_tokens_total",
                **TARGET,
                "pod": "vllm-0",
                "pool": "chat",
                "model_name": "llama",
            },
            [(t, 100.0 * i) for i, t in enumerate(ts)],
        ),
        (
            {"__name__": "go_goroutines", **TARGET, "pod": "vllm-0", "pool": "chat"},
            [(t, 7.0) for t in ts],
        ),
    ]


def test_resent_and_stale_samples_are_stored_once_under_the_pods_name(
    bus: Bus, store: Store
) -> None:
    ts = [T0, T0 + 1000, T0 + 2000]
    with running_receiver(bus) as service:
        assert service.port is not None
        first = write_request(vllm_series(ts[:2], [1.0, 2.0]))
        assert post(service.port, first)[0] == 204
        # a retry of the same request, then the next write overlapping it (a WAL replay)
        assert post(service.port, first)[0] == 204
        assert post(service.port, write_request(vllm_series(ts, [1.0, 2.0, 3.0])))[0] == 204
        # the target goes away: staleness markers end its series
        stale = [(labels, [(T0 + 3000, STALE)]) for labels, _ in vllm_series(ts, [0, 0, 0])]
        assert post(service.port, write_request(stale))[0] == 204
        text = post_metrics(service.port)
    ingest_until(bus, store, {"engine_samples": 6, "target_health": 3})
    rows = store.con.execute(
        "SELECT ts_ms, instance, address, pool, signal, kind, value, labels_json, dialect"
        " FROM engine_samples ORDER BY signal, ts_ms"
    ).fetchall()
    assert [(r[0], r[4], r[6]) for r in rows] == [
        (T0, "generation_tokens", 0.0),
        (T0 + 1000, "generation_tokens", 100.0),
        (T0 + 2000, "generation_tokens", 200.0),
        (T0, "running", 1.0),
        (T0 + 1000, "running", 2.0),
        (T0 + 2000, "running", 3.0),
    ]
    assert {(r[1], r[2], r[3], r[8]) for r in rows} == {("vllm-0", "10.0.0.7:8000", "chat", "vllm")}
    assert {r[5] for r in rows} == {"gauge", "counter"}
    # target labels (job, instance, pod, pool) stay out of the series' labels
    assert {json.loads(r[7]) == {} for r in rows} == {True}
    health = store.con.execute(
        "SELECT ts_ms, instance, up FROM target_health ORDER BY ts_ms"
    ).fetchall()
    assert health == [(t, "vllm-0", True) for t in ts]
    assert 'llmslo_receive_dropped_total{reason="duplicate"} 8.0' in text  # 4 series × 2
    assert 'llmslo_receive_dropped_total{reason="stale"} 4.0' in text
    assert 'llmslo_receive_dropped_total{reason="unmapped"} 3.0' in text  # go_goroutines


def post_metrics(port: int | None) -> str:
    import urllib.request

    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
