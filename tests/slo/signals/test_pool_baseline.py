"""Pool-relative detectors compare an instance with its pool's *serving* instances only.

A pool where most pods fail (the drill's fleet of seven faults on nine pods) answers with
few tokens, and only its lightly loaded pods still stream: its healthy pods must not come
out hot or jittery against that. A real hot or jittery pod must still be found.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipeline.store import Store
from slo.signals._failures import BEFORE_FIRST_TOKEN, FailureKind, FailureStats
from slo.signals._serving import SERVING_FAILURE, not_serving, pool_baselines
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import RequestStats, Series, Snapshot, load_snapshot
from tests.slo.factories import T0_MS, insert
from tests.slo.fleet import FleetTimeline, State

CFG = DetectorConfig()
POOL = "llama-3-8b"
NOW_MS = T0_MS + 600_000
POOL_SIGNALS = ("hot_instance", "slow_prefill", "slow_decode", "itl_jitter")


def pod(index: int) -> str:
    return f"10.0.0.{index + 1}:8000"


def _pod_rows(
    snap: Snapshot,
    instance: str,
    *,
    records: int,
    tokens: int,
    served: int,
    jitter_ms: float,
    ok_records: int,
    rng: np.random.Generator,
    cancelled: int = 0,
) -> None:
    """One tapped pod over a 600-s lookback: records and tokens split evenly over its halves,
    the recent half's attempts of which ``served`` were served, and the ITL jitter (log-normal
    around ``jitter_ms``) of its ``ok_records``."""
    per_request = tokens / max(records, 1)
    snap.pools[instance] = POOL
    snap.requests[instance] = RequestStats(
        records=records,
        recent_records=records // 2,
        completion_tokens=tokens,
        recent_completion_tokens=tokens // 2,
        completion_tokens_sq=records * per_request**2,
    )
    snap.failures[instance] = FailureStats(
        attempts=records // 2,
        client_cancelled=cancelled,
        served=served,
        pod_failed=records // 2 - cancelled - served,  # the rest failed on the pod
    )
    jitter = np.exp(rng.normal(np.log(jitter_ms / 1000), 0.25, ok_records))
    snap.latency[instance] = {
        "ttft_s": np.full(ok_records, 0.3),
        "tpot_s": np.full(ok_records, 0.03),
        "itl_jitter_s": jitter,
    }
    ts = np.arange(NOW_MS - 600_000, NOW_MS + 1, 15_000, dtype=np.int64)
    snap.engine[instance] = {"tap_in_flight": Series(ts, np.full(len(ts), 4.0))}


def pool(
    healthy: int, failing: int, hot: int | None = None, jittery: int | None = None
) -> Snapshot:
    """``healthy`` pods serving 80 requests / 10,000 tokens with 9-ms median jitter (the
    first a little busier), then ``failing`` pods: as many attempts, 70 % failed, and 24 ok
    records of ~40 tokens each, smooth (5 ms: a pod that serves little is lightly batched).
    ``hot``: that healthy pod gets three times the requests and tokens; ``jittery``: 30 ms."""
    snap = Snapshot(NOW_MS)
    rng = np.random.default_rng(7)
    for i in range(healthy):
        scale = 3 if i == hot else 1
        _pod_rows(
            snap,
            pod(i),
            records=80 * scale,
            tokens=(10_400 if i == 0 else 9_600) * scale,
            served=40 * scale,
            jitter_ms=30.0 if i == jittery else 9.0,
            ok_records=60 * scale,
            rng=rng,
        )
    for i in range(healthy, healthy + failing):
        _pod_rows(
            snap, pod(i), records=80, tokens=960, served=12, jitter_ms=5.0, ok_records=24, rng=rng
        )
    return snap


def on(findings: list[Finding], signal: str) -> list[str]:
    return sorted(f.scope_id for f in findings if f.signal == signal)


def test_healthy_pods_of_a_mostly_failing_pool_are_neither_hot_nor_jittery() -> None:
    snap = pool(healthy=2, failing=7)
    found = detect_all(snap, CFG)
    assert on(found, "hot_instance") == []
    assert on(found, "itl_jitter") == []
    baseline = pool_baselines(snap, CFG)[POOL]
    assert baseline.serving == (pod(0), pod(1))
    assert baseline.left_out == {pod(i): SERVING_FAILURE for i in range(2, 9)}


def test_the_same_pool_serving_finds_its_truly_hot_pod() -> None:
    found = detect_all(pool(healthy=9, failing=0, hot=4), CFG)
    assert on(found, "hot_instance") == [pod(4)]
    hot = next(f for f in found if f.signal == "hot_instance")
    assert hot.basis == "request_share"
    assert hot.evidence["left_out"] == {}


def test_a_hot_pod_among_serving_peers_is_found_while_others_fail() -> None:
    found = detect_all(pool(healthy=3, failing=6, hot=1), CFG)
    assert on(found, "hot_instance") == [pod(1)]
    evidence = next(f for f in found if f.signal == "hot_instance").evidence
    assert sorted(evidence["requests"]) == [pod(0), pod(1), pod(2)]
    assert evidence["left_out"] == {pod(i): SERVING_FAILURE for i in range(3, 9)}


def test_a_jittery_pod_among_serving_peers_is_found_while_others_fail() -> None:
    found = detect_all(pool(healthy=3, failing=6, jittery=2), CFG)
    assert on(found, "itl_jitter") == [pod(2)]
    evidence = next(f for f in found if f.signal == "itl_jitter").evidence
    assert evidence["pool_n"] == 120  # the two serving peers' 60 records each
    assert evidence["median_ratio"] > 3


@pytest.mark.parametrize(("jitter_ms", "found"), [(6.7, False), (20.0, True)])
def test_a_jitter_shift_counts_only_when_it_is_milliseconds_a_user_could_notice(
    jitter_ms: float, found: bool
) -> None:
    """The drill's healthy pod at 6.7 ms beside a pool at 4 ms: 1.7 times and significant,
    but 2.7 ms is not a stutter (``jitter_min_shift_s``, 10 ms); 16 ms more is."""
    snap = Snapshot(NOW_MS)
    rng = np.random.default_rng(3)
    for i in range(4):
        _pod_rows(
            snap,
            pod(i),
            records=80,
            tokens=10_000,
            served=40,
            jitter_ms=jitter_ms if i == 3 else 4.0,
            ok_records=60,
            rng=rng,
        )
    assert on(detect_all(snap, CFG), "itl_jitter") == ([pod(3)] if found else [])


def test_a_pod_with_no_serving_peer_gets_no_pool_verdict() -> None:
    snap = pool(healthy=1, failing=8, hot=0, jittery=0)
    assert [f for f in detect_all(snap, CFG) if f.signal in POOL_SIGNALS] == []
    assert len(pool_baselines(snap, CFG)[POOL].serving) < CFG.pool_min_serving


def test_client_cancels_are_not_failures_and_few_failures_are_not_failing() -> None:
    snap = Snapshot(NOW_MS)
    rng = np.random.default_rng(1)
    # ghosts: three of four attempts cancelled by their clients, the rest served
    _pod_rows(
        snap,
        pod(0),
        records=80,
        tokens=5_000,
        served=10,
        jitter_ms=9,
        ok_records=20,
        rng=rng,
        cancelled=30,
    )
    # four of four failed: below failure_min_count (5), not yet visibly failing
    _pod_rows(snap, pod(1), records=8, tokens=0, served=0, jitter_ms=9, ok_records=0, rng=rng)
    _pod_rows(snap, pod(2), records=80, tokens=0, served=0, jitter_ms=9, ok_records=0, rng=rng)
    assert not_serving(snap, CFG) == {pod(2): SERVING_FAILURE}


def test_the_failure_share_over_the_pool_is_judged_against_serving_peers() -> None:
    """5 % prefill failures, against peers that never fail: reported over the pool, though a
    peer failing 60 % raised the old baseline (the rest of the whole pool) to 20 %."""
    snap = pool(healthy=3, failing=1)
    for instance, attempts, failed in ((pod(0), 200, 10), (pod(3), 200, 120)):
        kind = FailureKind(failed, {"500": failed}, {"http_500": failed}, [], 0.0, 0.0)
        snap.failures[instance] = FailureStats(
            attempts=attempts,
            served=attempts - failed,
            pod_failed=failed,
            kinds={BEFORE_FIRST_TOKEN: kind},
        )
    for instance in (pod(1), pod(2)):
        snap.failures[instance] = FailureStats(attempts=200, served=200)
    found = [f for f in detect_all(snap, CFG) if f.signal == "prefill_failure"]
    assert {f.scope_id: f.evidence["basis_share"] for f in found} == {
        pod(0): "over_pool",
        pod(3): "absolute",
    }
    assert next(f for f in found if f.scope_id == pod(0)).evidence["pool_rest_share"] == 0.0


# ---- the same, end to end: rows in DuckDB, the snapshot read, every detector -------------


def _request(**fields: Any) -> Any:
    def fault(s: State, _: float) -> None:
        s["request"] = dict(fields)

    return fault


def _stalled_gpu_lost(s: State, since: float) -> None:
    s["tokens_per_s"], s["requests"], s["xid"] = 0.0, 0, 79.0


def _down(s: State, _: float) -> None:
    s["up"], s["requests"] = False, 0


def _not_ready(s: State, _: float, models: int = 1) -> None:
    s["ready"], s["models"] = False, models
    s["request"] = {"outcome": "rejected", "http_status": 503, "upstream_status": 503}
    s["request"].update(ttft_s=None, tpot_s=None, finish_reason=None, itl_jitter_s=None)
    s["request"].update(completion_tokens=None, token_chunks=0)


def _stall(s: State, _: float) -> None:
    s["tokens_per_s"], s["requests"] = 0.0, 0


def _prefill_failures_or_smooth(s: State, since: float) -> None:
    """Three scrapes in five answer 500 before any token; the rest stream smoothly."""
    if (since // 15) % 5 < 3:
        s["request"] = {"outcome": "error_before_first_token", "http_status": 500}
        s["request"].update(upstream_status=500, finish_reason=None, ttft_s=None, tpot_s=None)
        s["request"].update(completion_tokens=None, token_chunks=0, itl_jitter_s=None)
    else:
        s["request"] = {"itl_jitter_s": 0.005}


def _crash_and_back(s: State, since: float) -> None:
    """Down 60 s, then a new process that serves as before (the crash is still reported)."""
    if since < 60:
        s["up"], s["requests"] = False, 0
    elif s["process_start_s"] < 2e9:
        s["up"], s["requests"], s["process_start_s"] = True, 8, 2e9 + since


_nan = _request(finish_reason="error", completion_tokens=12, token_chunks=12)


def _nan_burst(s: State, since: float) -> None:
    """A NaN burst: a dozen tokens, then finish_reason=error; its few streams run smooth."""
    _nan(s, since)
    s["request"].update(itl_jitter_s=0.005)


@pytest.fixture
def seven_faults() -> FleetTimeline:
    fleet = FleetTimeline(instances=9, seconds=900)
    fleet.add_fault(2, 450, _down)  # down for the last 450 s of the 600-s lookback
    fleet.add_fault(3, 0, _not_ready)
    fleet.add_fault(4, 0, lambda s, t: _not_ready(s, t, models=0))
    fleet.add_fault(5, 0, _stall)
    fleet.add_fault(6, 0, _nan_burst)
    fleet.add_fault(7, 0, _stalled_gpu_lost)
    fleet.add_fault(8, 0, _prefill_failures_or_smooth)
    return fleet


def test_a_fleet_of_seven_faults_leaves_its_healthy_pods_alone(
    store: Store, seven_faults: FleetTimeline
) -> None:
    requests, engine, gpu, health = seven_faults.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    snap = load_snapshot(store.con, seven_faults.end_ms, int(CFG.lookback_s * 1000))
    found = detect_all(snap, CFG)
    healthy = {pod(0), pod(1)}
    assert [f.key for f in found if f.signal in POOL_SIGNALS and f.scope_id in healthy] == []
    baseline = pool_baselines(snap, CFG)[POOL]
    assert baseline.serving == tuple(sorted(healthy))
    assert baseline.left_out == {
        pod(2): "target_down",
        pod(3): "worker_not_ready",
        pod(4): "model_load_failure",
        pod(5): "stall",
        pod(6): SERVING_FAILURE,
        pod(7): "stall",
        pod(8): SERVING_FAILURE,
    }


def test_a_crashed_pod_serving_again_is_back_in_the_baseline(store: Store) -> None:
    fleet = FleetTimeline(instances=3, seconds=900).add_fault(2, 750, _crash_and_back)
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    snap = load_snapshot(store.con, fleet.end_ms, int(CFG.lookback_s * 1000))
    assert on(detect_all(snap, CFG), "crash") == [pod(2)]  # still reported for restart_hold_s
    assert pool_baselines(snap, CFG)[POOL].serving == (pod(0), pod(1), pod(2))
