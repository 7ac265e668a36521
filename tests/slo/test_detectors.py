"""Each failure signature on data with its fault pattern; nothing on a healthy run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.store import Store
from slo.detectors import DETECTORS, DetectorConfig, Finding, detect_all, gini
from slo.snapshot import load_snapshot
from tests.slo.factories import T0_MS, engine_sample, insert
from tests.slo.fleet import FleetTimeline, State

CFG = DetectorConfig()


def run(store: Store, fleet: FleetTimeline, cfg: DetectorConfig = CFG) -> list[Finding]:
    requests, engine, gpu = fleet.rows()
    insert(store, requests=requests, engine=engine, gpu=gpu)
    snap = load_snapshot(
        store.con, fleet.end_ms, int(cfg.lookback_s * 1000), int(cfg.ghost_grace_s * 1000)
    )
    return detect_all(snap, cfg)


def stall(s: State, _: float) -> None:
    s["tokens_per_s"] = 0.0
    s["gpu_util"], s["engine_active"] = 100.0, 1.0  # NCCL spin: busy GPU, no tokens
    s["requests"] = 0


def ghosts(s: State, _: float) -> None:
    s["running"] += 5  # the engine keeps what the tap let go
    s["tap_disconnects"] += 2  # without the matching aborts


def cascade(s: State, since: float) -> None:
    s["preemptions"] += 30
    s["kv_usage"] = 0.95
    s["waiting"] = 5 + since / 5


def fragmentation_blocks(s: State, _: float) -> None:
    s["kv_free_blocks"], s["kv_largest_free_run"] = 1000.0, 300.0


def fragmentation_admission(s: State, since: float) -> None:
    s["waiting"] = 1 + since / 60
    s["kv_usage"] = 0.5


def numeric(s: State, _: float) -> None:
    s["corrupted"] += 2
    s["finished_error"] += 2
    s["request"] = {"finish_reason": "error", "outcome": "interrupted_after_first_token"}


def queue(s: State, since: float) -> None:
    s["waiting"] = since / 6  # +10 per minute


def oom_kv(s: State, _: float) -> None:
    s["kv_usage"] = 0.995


def oom_xid(s: State, _: float) -> None:
    s["xid"] = 79.0


def oom_fb(s: State, _: float) -> None:
    s["fb_used"], s["fb_free"] = 79_500.0, 500.0


def hot(s: State, _: float) -> None:
    s["requests"] = 40


def retries(s: State, _: float) -> None:
    s["request"] = {"attempt": 2}


CASES: list[tuple[str, Callable[[State, float], None], str, str]] = [
    ("stall", stall, "stall", "generation_tokens_flat"),
    ("ghost_requests", ghosts, "ghost_requests", "tap_vs_engine"),
    ("preemption_cascade", cascade, "preemption_cascade", "engine_counters"),
    ("fragmentation from block stats", fragmentation_blocks, "fragmentation", "block_stats"),
    (
        "fragmentation from the admission signature",
        fragmentation_admission,
        "fragmentation",
        "admission_signature",
    ),
    ("numeric_anomaly", numeric, "numeric_anomaly", "error_counters"),
    ("queue_growth", queue, "queue_growth", "engine_gauges"),
    ("oom_risk from KV", oom_kv, "oom_risk", "kv_usage"),
    ("oom_risk from XID", oom_xid, "oom_risk", "xid"),
    ("oom_risk from the frame buffer", oom_fb, "oom_risk", "fb_used_share"),
    ("hot_instance", hot, "hot_instance", "request_share"),
    ("retry_storm", retries, "retry_storm", "tap_attempts"),
]


def test_a_healthy_run_raises_no_signal(store: Store) -> None:
    assert run(store, FleetTimeline(instances=4, seconds=1800)) == []


@pytest.mark.parametrize(
    ("fault", "signal", "basis"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_fault_pattern_raises_its_signal_on_that_instance(
    store: Store, fault: Callable[[State, float], None], signal: str, basis: str
) -> None:
    fleet = FleetTimeline(instances=4, seconds=900).add_fault(1, 300, fault)
    findings = [f for f in run(store, fleet) if f.signal == signal]
    assert findings, f"no {signal}"
    (finding,) = findings
    assert finding.basis == basis
    expected = fleet.pool if finding.scope == "pool" else fleet.instance(1)
    assert finding.scope_id == expected
    assert finding.evidence


def test_stall_evidence_is_corroborated_by_gpu_and_silent_streams(store: Store) -> None:
    fleet = FleetTimeline(seconds=600).add_fault(0, 400, stall)
    (finding,) = [f for f in run(store, fleet) if f.signal == "stall"]
    assert finding.evidence["gpu_engine_active_mean"] == 1.0
    assert finding.evidence["tap_streams_silent"] is True


def test_a_stall_shorter_than_stall_for_is_not_reported(store: Store) -> None:
    fleet = FleetTimeline(seconds=600).add_fault(0, 560, stall)  # 40 s < 60 s
    assert [f for f in run(store, fleet) if f.signal == "stall"] == []


def test_frozen_sglang_gauges_are_a_stall_without_token_counter(store: Store) -> None:
    def frozen(s: State, _: float) -> None:
        s["running"], s["waiting"], s["kv_usage"], s["tap_in_flight"] = 7.0, 3.0, 0.6, 7.0
        s["requests"] = 0

    fleet = FleetTimeline(seconds=600).add_fault(0, 400, frozen)
    requests, engine, gpu = fleet.rows()
    engine = [r for r in engine if r["signal"] != "generation_tokens"]
    insert(store, requests=requests, engine=engine, gpu=gpu)
    snap = load_snapshot(store.con, fleet.end_ms, 600_000)
    (finding,) = [f for f in detect_all(snap, CFG) if f.signal == "stall"]
    assert finding.basis == "gauge_unchanged"


def test_gini_and_the_detector_table() -> None:
    assert gini([1, 1, 1, 1]) == 0.0
    assert gini([0, 0, 0, 10]) == pytest.approx(0.75)
    assert gini([]) == 0.0
    assert set(DETECTORS) == {
        "stall",
        "ghost_requests",
        "preemption_cascade",
        "fragmentation",
        "hot_instance",
        "retry_storm",
        "numeric_anomaly",
        "queue_growth",
        "oom_risk",
    }


def test_empty_store_gives_no_findings(store: Store) -> None:
    assert detect_all(load_snapshot(store.con, 10**12, 600_000), CFG) == []


def _evidence(findings: list[Finding]) -> dict[str, Any]:
    return {f.signal: f.evidence for f in findings}


def test_a_signal_on_most_of_a_pool_is_raised_on_the_pool(store: Store) -> None:
    fleet = FleetTimeline(instances=3, seconds=600)
    for index in (0, 2):
        fleet.add_fault(index, 300, queue)
    findings = [f for f in run(store, fleet) if f.signal == "queue_growth"]
    assert {(f.scope, f.scope_id) for f in findings} == {
        ("instance", fleet.instance(0)),
        ("instance", fleet.instance(2)),
        ("pool", fleet.pool),
    }
    pool = next(f for f in findings if f.scope == "pool")
    assert pool.evidence["instances"] == [fleet.instance(0), fleet.instance(2)]


def test_the_collectors_frozen_gauge_clock_is_a_stall_basis(store: Store) -> None:
    def frozen(s: State, since: float) -> None:
        s["requests"], s["tokens_per_s"] = 0, 0.0

    fleet = FleetTimeline(seconds=600).add_fault(0, 400, frozen)
    requests, engine, gpu = fleet.rows()
    # the collector's derived gauge: seconds the scheduler gauges have been bit-identical
    engine += [
        engine_sample(
            T0_MS + t * 1000,
            "gauges_unchanged_s",
            max(0, t - 400),
            metric="llmslo_gauges_unchanged_seconds",
            engine="",
            dialect="sglang",
            instance=fleet.instance(0),
        )
        for t in range(0, 601, 15)
    ]
    insert(store, requests=requests, engine=engine, gpu=gpu)
    (finding,) = [
        f
        for f in detect_all(load_snapshot(store.con, fleet.end_ms, 600_000), CFG)
        if f.signal == "stall"
    ]
    assert finding.basis == "gauge_unchanged" and finding.evidence["gauges_unchanged_s"] == 200


def test_a_steady_trickle_of_errors_is_not_a_numeric_anomaly(store: Store) -> None:
    def trickle(s: State, since: float) -> None:
        s["finished_error"] += 0.25  # 1 error a minute against ~1,900 finished requests
        s["aborts"] += 30

    fleet = FleetTimeline(instances=2, seconds=900).add_fault(0, 0, trickle)
    assert [f for f in run(store, fleet) if f.signal == "numeric_anomaly"] == []
