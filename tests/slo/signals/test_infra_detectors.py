"""P/D KV-transfer timeout, stale KV index and autoscaler lag on factory rows: each fires on
its fault pattern with its evidence and stays silent on the healthy (or look-alike) run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.store import Store
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import load_snapshot
from tests.slo.factories import T0_MS, engine_sample, insert, request

CFG = DetectorConfig()
STEP_S, END_S = 5, 600
NOW_MS = T0_MS + END_S * 1000
PD, GATEWAY, KSM = "pd-0", "gateway-0", "ksm-0"
ENGINES = ["pod-0", "pod-1", "pod-2"]
BOUNDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0)

Rate = Callable[[float], float]  # per-second rate (or gauge value) at time t (s from T0)


def _counter(instance: str, signal: str, rate: Rate, **kw: Any) -> list[dict[str, Any]]:
    rows, total = [], 0.0
    for t in range(0, END_S + 1, STEP_S):
        rows.append(
            engine_sample(T0_MS + t * 1000, signal, total, instance=instance, kind="counter", **kw)
        )
        total += rate(t) * STEP_S
    return rows


def _gauge(instance: str, signal: str, value: Rate, **kw: Any) -> list[dict[str, Any]]:
    return [
        engine_sample(T0_MS + t * 1000, signal, value(t), instance=instance, **kw)
        for t in range(0, END_S + 1, STEP_S)
    ]


def _transfer_histogram(instance: str, slow_from_s: float | None) -> list[dict[str, Any]]:
    """2 transfers/s of 3 ms; from ``slow_from_s`` on, half of them take 2 s (timed out)."""
    rows, fast, slow = [], 0.0, 0.0
    for t in range(0, END_S + 1, STEP_S):
        ts = T0_MS + t * 1000
        for le in (*BOUNDS, float("inf")):
            value = fast + (slow if le >= 2.0 else 0.0)
            rows.append(
                engine_sample(
                    ts, "kv_transfer_time", value, instance=instance, kind="bucket", le=le
                )
            )
        timing_out = slow_from_s is not None and t >= slow_from_s
        fast += (1.0 if timing_out else 2.0) * STEP_S
        slow += (1.0 if timing_out else 0.0) * STEP_S
    return rows


def _pd(fault_from_s: float | None, *, failures: bool = True) -> list[dict[str, Any]]:
    on = lambda t: fault_from_s is not None and t >= fault_from_s  # noqa: E731
    rows = _transfer_histogram(PD, fault_from_s)
    rows += _counter(PD, "kv_transfer_failures", lambda t: 1.0 if on(t) and failures else 0.0)
    rows += _counter(PD, "kv_transfer_expired", lambda t: 0.0)
    rows += _gauge(PD, "kv_transfer_leaked_blocks", lambda t: 0.0)
    return rows


def _engines(hit_ratio: Rate) -> list[dict[str, Any]]:
    rows = []
    for pod in ENGINES:
        rows += _counter(pod, "prefix_cache_queries", lambda t: 1000.0)
        rows += _counter(pod, "prefix_cache_hits", lambda t: 1000.0 * hit_ratio(t))
    return rows


def _router(rejections: Rate) -> list[dict[str, Any]]:
    common = {"pool": "", "model": None, "dialect": "epp"}
    return _counter(GATEWAY, "router_prefix_lookups", lambda t: 3.0, **common) + _counter(
        GATEWAY, "router_hints_rejected", rejections, **common
    )


def _autoscaler(desired: Rate, ready: Rate, queue: Rate) -> list[dict[str, Any]]:
    ksm = {"pool": "", "model": None, "dialect": "kube-state-metrics"}
    gw = {"pool": "", "model": None, "dialect": "epp"}
    return (
        _gauge(KSM, "replicas_desired", desired, **ksm)
        + _gauge(KSM, "replicas_ready", ready, **ksm)
        + _gauge(KSM, "replicas_current", desired, **ksm)
        + _gauge(GATEWAY, "gateway_queue", queue, **gw)
    )


def _detect(store: Store, rows: list[dict[str, Any]], cfg: DetectorConfig = CFG) -> list[Finding]:
    insert(store, engine=rows)
    snap = load_snapshot(store.con, NOW_MS, int(cfg.lookback_s * 1000))
    return detect_all(snap, cfg)


def _only(findings: list[Finding], signal: str) -> list[Finding]:
    return [f for f in findings if f.signal == signal]


def test_failed_kv_transfers_are_a_kv_transfer_timeout_on_the_pd_instance(store: Store) -> None:
    findings = _detect(store, _pd(fault_from_s=500))
    [found] = _only(findings, "kv_transfer_timeout")
    assert (found.scope_id, found.basis, found.severity) == (PD, "failed_transfers", "page")
    ev = found.evidence
    assert ev["failed_transfers"] >= 95  # 1/s over the last 100 s
    assert 1.0 < ev["p99_transfer_s"] <= 2.0 and ev["p99_transfer_before_s"] <= 0.005
    assert ev["leaked_blocks"] == 0


def test_a_transfer_time_shift_without_failures_is_reported_as_latency_shift(
    store: Store,
) -> None:
    findings = _detect(store, _pd(fault_from_s=500, failures=False))
    [found] = _only(findings, "kv_transfer_timeout")
    assert (found.basis, found.severity) == ("latency_shift", "ticket")


def test_healthy_transfers_and_an_old_incident_out_of_the_window_find_nothing(
    store: Store,
) -> None:
    assert _only(_detect(store, _pd(fault_from_s=None)), "kv_transfer_timeout") == []


def test_hints_rejected_while_the_engines_hit_ratio_falls_is_a_stale_kv_index(
    store: Store,
) -> None:
    stale_from = 500
    rows = _engines(lambda t: 0.05 if t >= stale_from else 0.6)
    rows += _router(lambda t: 2.0 if t >= stale_from else 0.0)
    [found] = _only(_detect(store, rows), "kv_index_stale")
    assert (found.scope_id, found.basis) == (GATEWAY, "hints_rejected")
    ev = found.evidence
    assert ev["hints_rejected"] >= 190 and ev["hit_ratio"] < 0.2 < 0.5 < ev["hit_ratio_before"]
    assert ev["engines"] == ENGINES


def test_a_burst_of_rejections_within_one_scrape_counts_from_the_scrape_before_it(
    store: Store,
) -> None:
    """A stale index rejects each known prefix once: the whole burst can land between two
    scrapes. It must count (the jump at the onset is the rejections)."""
    rows = _engines(lambda t: 0.05 if t >= 500 else 0.6)
    rows += _router(lambda t: 1.0 if 500 <= t < 500 + STEP_S else 0.0)  # 5, then flat
    [found] = _only(_detect(store, rows), "kv_index_stale")
    assert found.evidence["hints_rejected"] == 5


@pytest.mark.parametrize(
    ("hit_ratio", "rejections"),
    [
        pytest.param(lambda t: 0.6, lambda t: 0.0, id="healthy: hints hit, nothing rejected"),
        pytest.param(
            lambda t: 0.05 if t >= 500 else 0.6,
            lambda t: 0.0,
            id="new prompts that share nothing: the ratio falls but no hint is rejected",
        ),
        pytest.param(
            lambda t: 0.6,
            lambda t: 0.2,
            id="a few rejections from LRU evictions while the engines still hit",
        ),
    ],
)
def test_no_stale_kv_index_without_both_rejections_and_a_falling_hit_ratio(
    store: Store, hit_ratio: Rate, rejections: Rate
) -> None:
    rows = _engines(hit_ratio) + _router(rejections)
    assert _only(_detect(store, rows), "kv_index_stale") == []


def test_ready_below_desired_for_minutes_while_the_queue_grows_is_autoscaler_lag(
    store: Store,
) -> None:
    rows = _autoscaler(
        desired=lambda t: 3.0 if t >= 300 else 1.0,
        ready=lambda t: 1.0,
        queue=lambda t: max(0.0, (t - 300) / 10),
    )
    [found] = _only(_detect(store, rows), "autoscaler_lag")
    assert (found.scope_id, found.basis, found.severity) == (KSM, "queue_growth", "page")
    ev = found.evidence
    assert (ev["desired"], ev["ready"]) == (3.0, 1.0)
    assert ev["behind_s"] == 300.0 and ev["queue_now"] == 30.0 and ev["queue_at_start"] == 0.0


@pytest.mark.parametrize(
    ("desired", "ready", "queue"),
    [
        pytest.param(
            lambda t: 3.0 if t >= 300 else 1.0,
            lambda t: 3.0 if t >= 360 else 1.0,
            lambda t: 5.0 if 300 <= t < 360 else 0.0,
            id="a normal scale-out: ready follows within a minute",
        ),
        pytest.param(
            lambda t: 3.0 if t >= 300 else 1.0,
            lambda t: 1.0,
            lambda t: 2.0,
            id="behind for minutes but nothing queues",
        ),
        pytest.param(
            lambda t: 2.0,
            lambda t: 2.0,
            lambda t: t / 20,
            id="the queue grows with every replica ready: load, not lag",
        ),
    ],
)
def test_no_autoscaler_lag_on_a_normal_scale_out_or_without_queue_growth(
    store: Store, desired: Rate, ready: Rate, queue: Rate
) -> None:
    rows = _autoscaler(desired, ready, queue)
    assert _only(_detect(store, rows), "autoscaler_lag") == []


def test_a_healthy_infra_run_finds_nothing_at_all(store: Store) -> None:
    rows = _pd(fault_from_s=None) + _engines(lambda t: 0.6) + _router(lambda t: 0.0)
    rows += _autoscaler(lambda t: 2.0, lambda t: 2.0, lambda t: 1.0)
    assert _detect(store, rows) == []


def test_an_entry_point_tapped_alone_is_not_a_hot_instance_against_its_untapped_pods(
    store: Store,
) -> None:
    """A tap in front of a P/D pair or gateway sees every request of the pool; the engines
    behind it have no tap, so their share is unknown, not 0."""
    requests = [
        request(T0_MS + i * 2_000, instance=PD) for i in range(END_S // 2)
    ]  # 300 requests, every one through the pair
    rows = _pd(fault_from_s=None)
    for pod in ENGINES:  # engines scraped, not tapped
        rows += _gauge(pod, "running", lambda t: 2.0)
    insert(store, requests=requests, engine=rows)
    snap = load_snapshot(store.con, NOW_MS, int(CFG.lookback_s * 1000))
    assert [f for f in detect_all(snap, CFG) if f.signal == "hot_instance"] == []


@pytest.mark.parametrize(("failed", "found"), [(2, False), (3, True)])
def test_a_timed_out_transfer_seen_on_both_sides_counts_once(
    store: Store, failed: int, found: bool
) -> None:
    """Each timeout shows as the decode's failed read and the prefill's expired blocks."""
    burst = lambda t: failed / STEP_S if 500 <= t < 500 + STEP_S else 0.0  # noqa: E731
    rows = _transfer_histogram(PD, None)
    rows += _counter(PD, "kv_transfer_failures", burst)
    rows += _counter(PD, "kv_transfer_expired", burst)
    rows += _gauge(PD, "kv_transfer_leaked_blocks", lambda t: 0.0)
    assert bool(_only(_detect(store, rows), "kv_transfer_timeout")) is found


def test_a_lag_longer_than_the_lookback_stays_reported(store: Store) -> None:
    """Behind at every scrape of the lookback: still a lag, at least that long."""
    rows = _autoscaler(desired=lambda t: 3.0, ready=lambda t: 1.0, queue=lambda t: t / 10)
    [found] = _only(_detect(store, rows), "autoscaler_lag")
    assert found.evidence["behind_s"] >= 300 and found.evidence["behind_s_is_at_least"]
