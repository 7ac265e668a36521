"""P/D transfer timeouts, a stale KV index and autoscaler lag on live data: simulator pods and
front ends (P/D pair, gateway + locality router, autoscaler) → the real collector → DuckDB →
detectors. Each run is read twice: just before the fault (nothing found) and at the end (the
finding, on the component at fault).

Intervals are compressed honestly: 0.5 s scrapes and windows of a few seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest

from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from pipeline.schema import RecordSchema
from pipeline.store import Store
from simulator import Fleet, FleetConfig, PodConfig
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import load_snapshot
from tests.simulator.conftest import MODEL, post_quietly

pytestmark = pytest.mark.slow

CFG = DetectorConfig(
    lookback_s=60,
    kv_transfer_window_s=5,
    kv_index_window_s=5,
    kv_index_min_rejections=3,
    autoscaler_lag_for_s=3,
)


_LOCK = threading.Lock()  # one DuckDB connection: the collector's commits and our reads take turns


@contextmanager
def _collecting(store: Store, fleet: Fleet) -> Iterator[None]:
    """The real collector over the pods and the front ends (named as ``llmslo sim`` names
    them) every 0.5 s, committing into ``store``, until the block ends."""
    lock = _LOCK

    def sink(schema: RecordSchema, table: pa.Table) -> None:
        with lock:
            store.commit_batch({schema.table: [table]}, group_id="live", offsets={}, now_ts_ms=0)

    targets = [TargetConfig(url=f"{p.url}/metrics", labels={"pod": p.name}) for p in fleet.pods]
    targets += [
        TargetConfig(url=f"{url}/metrics", pool=pool or None, labels={"instance": name})
        for name, url, pool in fleet.front_ends.targets()
    ]
    config = CollectConfig(targets=targets, interval_s=0.5, jitter_s=0, timeout_s=2.0)
    collector = Collector(config, sink)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(collector.run(),))
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(collector.stop)
        thread.join(timeout=30)
        loop.close()


def _findings(store: Store, signal: str) -> list[Finding]:
    time.sleep(1.0)  # the round in flight lands
    with _LOCK:
        snap = load_snapshot(store.con, int(time.time() * 1000), int(CFG.lookback_s * 1000))
    return [f for f in detect_all(snap, CFG) if f.signal == signal]


def _send_for(url: str, seconds: float, rate: float, body: Callable[[int], dict[str, Any]]) -> None:
    """Open-loop requests at ``rate``/s for ``seconds`` (each in its own thread)."""
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        threading.Thread(
            target=post_quietly, args=(f"{url}/v1/chat/completions", body(i)), daemon=True
        ).start()
        i += 1
        time.sleep(1 / rate)


def _chat(content: str, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }


def test_kv_transfer_timeout_is_found_on_the_pd_pair_and_not_before(store: Store) -> None:
    config = FleetConfig(
        pods=[PodConfig(name="prefill"), PodConfig(name="decode")],
        pd={"prefill": "prefill", "decode": "decode"},
    )
    with Fleet(config) as fleet, _collecting(store, fleet):
        assert fleet.pd is not None
        _send_for(fleet.pd.url, 6, 4, lambda i: _chat(f"hello {i}"))
        assert _findings(store, "kv_transfer_timeout") == []
        params = {"fraction": 0.5, "timeout_s": 0.5, "cleanup_fail_fraction": 0.5}
        fleet.set_front_end_fault("kv_transfer_timeout", **params)
        _send_for(fleet.pd.url, 5, 4, lambda i: _chat(f"hello {i}"))
        time.sleep(1.0)
        found = _findings(store, "kv_transfer_timeout")
    assert [(f.scope_id, f.basis) for f in found] == [("pd", "failed_transfers")]
    ev = found[0].evidence
    assert ev["failed_transfers"] >= 3 and ev["p99_transfer_s"] >= 0.1
    assert ev["expired_requests"] + ev["leaked_blocks_added"] > 0  # each failure is cleaned or not


def test_a_stale_kv_index_is_found_on_the_router_and_not_before(store: Store) -> None:
    engine = {"prefix_cache_prefixes": 64}
    config = FleetConfig(
        pods=[PodConfig(name=f"pod-{i}", engine=engine) for i in range(3)],
        gateway={"policy": "prefix_locality"},
    )

    sent = itertools.count()

    def prompt(_: int) -> dict[str, Any]:
        """Conversations of four turns, a new one every four requests, turns 9 apart."""
        n = next(sent)
        turn = n % 4
        return _chat(f"conversation {max(n // 4 - 2 * turn, 0)} " + "system prompt " * 30)

    with Fleet(config) as fleet, _collecting(store, fleet):
        assert fleet.gateway is not None
        _send_for(fleet.gateway.url, 8, 6, prompt)
        assert _findings(store, "kv_index_stale") == []
        fleet.set_front_end_fault("stale_kv_index")
        _send_for(fleet.gateway.url, 8, 6, prompt)
        time.sleep(1.0)
        found = _findings(store, "kv_index_stale")
    assert [(f.scope_id, f.basis) for f in found] == [("gateway", "hints_rejected")]
    ev = found[0].evidence
    # A stale index lowers the token-weighted hit ratio by a third to a half (first turns always
    # miss): the fall the detector requires, not more.
    fall = DetectorConfig().kv_index_drop
    assert ev["hints_rejected"] >= 3 and ev["hit_ratio"] <= ev["hit_ratio_before"] * (1 - fall)
    assert ev["engines"] == ["pod-0", "pod-1", "pod-2"]


def _scaled_fleet() -> FleetConfig:
    autoscaler = {"target_in_flight": 2, "replica_in_flight": 2, "startup_s": 0.3, "cooldown_s": 60}
    return FleetConfig(
        pods=[PodConfig(name=f"pod-{i}") for i in range(3)],
        gateway={"policy": "least_in_flight", "autoscaler": autoscaler},
    )


def _ramp(fleet: Fleet) -> None:
    for pod in fleet.pods:  # each request holds its slot for seconds
        fleet.set_fault(pod.name, "slow_decode", factor=20)
    assert fleet.gateway is not None
    _send_for(fleet.gateway.url, 4, 3, lambda i: _chat(f"ramp {i}", max_tokens=8))


def test_autoscaler_lag_is_found_on_the_autoscaler_when_ready_stays_behind(store: Store) -> None:
    fleet = Fleet(_scaled_fleet())
    with fleet, _collecting(store, fleet):
        time.sleep(2)
        assert _findings(store, "autoscaler_lag") == []
        fleet.set_front_end_fault("autoscaler_lag", lag_s=30)
        _ramp(fleet)
        time.sleep(1.0)
        found = _findings(store, "autoscaler_lag")
    assert [(f.scope_id, f.basis) for f in found] == [("autoscaler", "queue_growth")]
    ev = found[0].evidence
    assert ev["desired"] > ev["ready"] == 1 and ev["behind_s"] >= 3
    assert ev["queue_max"] - ev["queue_at_start"] >= 3


def test_a_ramp_the_autoscaler_follows_in_time_is_no_lag(store: Store) -> None:
    fleet = Fleet(_scaled_fleet())
    with fleet, _collecting(store, fleet):
        _ramp(fleet)
        time.sleep(1.0)
        assert _findings(store, "autoscaler_lag") == []
