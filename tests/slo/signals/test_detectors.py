"""Each failure signature on data with its fault pattern; nothing on a healthy run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pipeline.store import Store
from slo.signals import detectors
from slo.signals.detectors import DETECTORS, DetectorConfig, Finding, detect_all, gini
from slo.signals.snapshot import Series, Snapshot, load_snapshot
from tests.slo.factories import T0_MS, engine_sample, insert
from tests.slo.fleet import FleetTimeline, State

CFG = DetectorConfig()


def run(store: Store, fleet: FleetTimeline, cfg: DetectorConfig = CFG) -> list[Finding]:
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
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


def xid(code: int) -> Callable[[State, float], None]:
    def fault(s: State, _: float) -> None:
        s["xid"] = float(code)

    return fault


def crash(s: State, since: float) -> None:
    """Down for a minute from 300 s after the fault starts, then a new process."""
    if 300 <= since < 360:
        s["up"], s["requests"] = False, 0
    elif since >= 360 and s["process_start_s"] < 2e9:
        s["up"], s["requests"] = True, 8
        s["process_start_s"] = 2e9 + since
        s["generation_tokens"] = s["tokens_per_s"] * 15  # counters start again from 0
        s["resets_now"] = 1


def down(s: State, _: float) -> None:
    s["up"], s["requests"] = False, 0


def not_ready(s: State, _: float) -> None:
    s["ready"] = False
    s["request"] = {"outcome": "rejected", "http_status": 503, "upstream_status": 503}
    s["request"].update(ttft_s=None, tpot_s=None, finish_reason=None)


def model_load_failure(s: State, since: float) -> None:
    not_ready(s, since)
    s["models"] = 0


def slow_prefill(s: State, _: float) -> None:
    s["ttft_s"] = 0.9


def slow_decode(s: State, _: float) -> None:
    s["tpot_s"] = 0.075


def itl_jitter(s: State, _: float) -> None:
    s["request"] = {"itl_jitter_s": 0.2}  # p99 gap 200 ms above the median (pool: 16 ms)


def hot_by_tokens(s: State, _: float) -> None:
    s["request"] = {"completion_tokens": 600, "token_chunks": 600}  # same requests, 6× tokens


def hot_rank(s: State, _: float) -> None:
    s["ranks"] = [4, 4, 4, 1, 1, 1, 1, 1]  # three DP ranks at 4× (a real SGLang scrape)


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
    (
        "crash: down, then a new process with reset counters",
        crash,
        "crash",
        "process_start_changed+counter_reset+down_then_up",
    ),
    ("target down", down, "target_down", "scrape_failed"),
    ("worker up but not ready", not_ready, "worker_not_ready", "health"),
    (
        "model-load failure: no model listed",
        model_load_failure,
        "model_load_failure",
        "no_model_listed",
    ),
    ("slow prefill: TTFT shifted against the pool", slow_prefill, "slow_prefill", "mann_whitney"),
    ("slow decode: TPOT shifted against the pool", slow_decode, "slow_decode", "mann_whitney"),
    ("ITL jitter shifted against the pool", itl_jitter, "itl_jitter", "mann_whitney"),
    ("hot instance by tokens, not requests", hot_by_tokens, "hot_instance", "token_share"),
    ("hot DP rank within an instance", hot_rank, "hot_rank", "rank_throughput"),
    ("XID 79: fallen off the bus", xid(79), "xid_fallen_off_bus", "dcgm_xid"),
    ("XID 119: GSP timeout (GPU lost)", xid(119), "xid_fallen_off_bus", "dcgm_xid"),
    ("XID 48: double-bit ECC", xid(48), "xid_memory_error", "dcgm_xid"),
    ("XID 94: contained ECC", xid(94), "xid_memory_error", "dcgm_xid"),
    ("XID 74: NVLink", xid(74), "xid_interconnect", "dcgm_xid"),
    ("XID 13: graphics engine exception", xid(13), "xid_application_fault", "dcgm_xid"),
    ("XID 31: MMU fault", xid(31), "xid_application_fault", "dcgm_xid"),
    ("XID 999: not in the table", xid(999), "xid_other", "dcgm_xid"),
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
        "target_down",
        "crash",
        "worker_not_ready",
        "model_load_failure",
        "xid",
        "slow_prefill",
        "slow_decode",
        "hot_rank",
        "stall",
        "ghost_requests",
        "preemption_cascade",
        "fragmentation",
        "hot_instance",
        "retry_storm",
        "numeric_anomaly",
        "queue_growth",
        "oom_risk",
        "entry_unavailable",
        "router_unavailable",
        "no_eligible_endpoint",
        "gateway_queue_full",
        "kv_transfer_timeout",
        "kv_index_stale",
        "autoscaler_lag",
        "prefill_failure",
        "stream_interrupted",
        "itl_jitter",
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


def test_a_healthy_dp_deployment_raises_no_hot_rank(store: Store) -> None:
    fleet = FleetTimeline(instances=3, seconds=1800)
    for index in range(3):
        fleet.add_fault(index, 0, lambda s, _: s.update(ranks=[1] * 8))
    assert run(store, fleet) == []


def test_the_faulty_instance_is_the_only_one_with_a_finding(store: Store) -> None:
    """Each new mode on instance 1 of 4: every finding is on instance 1 (no collateral)."""
    for fault in (
        crash,
        down,
        not_ready,
        model_load_failure,
        slow_prefill,
        slow_decode,
        itl_jitter,
    ):
        store.con.execute("DELETE FROM engine_samples_values; DELETE FROM requests")
        store.con.execute("DELETE FROM gpu_samples_values; DELETE FROM target_health")
        fleet = FleetTimeline(instances=4, seconds=900).add_fault(1, 300, fault)
        findings = run(store, fleet)
        assert findings and {f.scope_id for f in findings} == {fleet.instance(1)}, fault


@pytest.mark.parametrize("code", [79, 48, 13, 74])
def test_an_xid_is_no_memory_pressure(store: Store, code: int) -> None:
    fleet = FleetTimeline(instances=2, seconds=600).add_fault(0, 300, xid(code))
    assert [f for f in run(store, fleet) if f.signal == "oom_risk"] == []


def test_xid_findings_say_whether_the_gpu_is_lost(store: Store) -> None:
    fleet = FleetTimeline(instances=2, seconds=600).add_fault(0, 300, xid(95))
    (finding,) = [f for f in run(store, fleet) if f.signal.startswith("xid_")]
    assert (finding.signal, finding.severity) == ("xid_memory_error", "page")
    assert finding.evidence["takes_gpu_out"] is True
    assert finding.evidence["names"] == {"95": "Uncontained ECC error"}


def test_a_restart_longer_ago_than_restart_hold_is_not_reported(store: Store) -> None:
    fleet = FleetTimeline(instances=2, seconds=1200).add_fault(0, 0, crash)  # back at 360 s
    assert [f for f in run(store, fleet) if f.signal == "crash"] == []


def test_a_short_blip_of_not_ready_is_not_reported(store: Store) -> None:
    fleet = FleetTimeline(instances=2, seconds=600, probe_every=1).add_fault(0, 590, not_ready)
    assert [f for f in run(store, fleet) if f.signal == "worker_not_ready"] == []


def test_not_ready_evidence_counts_the_taps_503s(store: Store) -> None:
    fleet = FleetTimeline(instances=2, seconds=600).add_fault(0, 300, not_ready)
    (finding,) = [f for f in run(store, fleet) if f.signal == "worker_not_ready"]
    assert finding.evidence["tap_503"] > 0 and finding.evidence["ready_status"] == 503
    assert finding.evidence["not_ready_since_ts_ms"] == T0_MS + 300_000


def test_an_engines_ready_gauge_at_zero_is_a_not_ready_worker(store: Store) -> None:
    fleet = FleetTimeline(instances=2, seconds=600)
    requests, engine, gpu, health = fleet.all_rows()
    engine += [
        engine_sample(
            T0_MS + t * 1000, "ready", 1.0 if t < 500 else 0.0, instance=fleet.instance(1)
        )
        for t in range(0, 601, 15)
    ]
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    snap = load_snapshot(store.con, fleet.end_ms, 600_000)
    (finding,) = [f for f in detect_all(snap, CFG) if f.signal == "worker_not_ready"]
    assert (finding.scope_id, finding.basis) == (fleet.instance(1), "gauge")
    assert finding.evidence["not_ready_for_s"] == 90


def test_a_detector_that_raises_costs_only_its_own_findings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
        raise IndexError("a series empty after its window was cut")

    def working(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
        return [Finding(snap.now_ms, "stall", "instance", "pod-0", "pool", "page", "b", {})]

    monkeypatch.setattr(detectors, "DETECTORS", {"broken": broken, "stall": working})
    failed: list[str] = []
    found = detect_all(Snapshot(T0_MS), DetectorConfig(), failed.append)
    assert [(f.signal, f.scope_id) for f in found] == [("stall", "pod-0")]
    assert failed == ["broken"]


def test_front_end_targets_are_not_members_of_their_pool() -> None:
    """Two of three engines stalled is most of the pool, whatever stands in front of it."""
    flat = Series(np.array([T0_MS, T0_MS + 5_000], np.int64), np.array([1.0, 1.0]))
    snap = Snapshot(T0_MS + 5_000)
    for name, signal in [
        ("pod-0", "running"),
        ("pod-1", "running"),
        ("pod-2", "running"),
        ("gateway", "gateway_queue"),
        ("autoscaler", "replicas_ready"),
    ]:
        snap.engine[name] = {signal: flat}
        snap.pools[name] = "llama"
    stalled = [
        Finding(snap.now_ms, "stall", "instance", pod, "llama", "page", "b", {})
        for pod in ("pod-0", "pod-1")
    ]
    [pool] = detectors.pool_findings(snap, stalled, DetectorConfig())
    assert (pool.scope_id, pool.evidence["pool_instances"]) == ("llama", 3)
