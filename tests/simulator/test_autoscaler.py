"""The autoscaler: ready follows desired within the start-up time; under autoscaler_lag it
does not, and the gateway queue grows meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from collectors.canonical import TargetCanonicalizer
from collectors.exposition import ExpositionParser
from pipeline.errors import ConfigError
from pipeline.store import Store
from simulator import Fleet, FleetConfig, PodConfig
from simulator.autoscaler import NEIGHBOUR, Autoscaler
from simulator.gateway import Gateway
from slo.signals.snapshot import load_snapshot
from tests.simulator.conftest import MODEL, get, post_quietly, scrape
from tests.simulator.test_gateway import metric


@pytest.fixture
def scaled() -> Iterator[tuple[Fleet, Gateway, Autoscaler]]:
    pods = [PodConfig(name=f"p{i}") for i in range(3)]
    with Fleet(FleetConfig(pods=pods)) as fleet:
        for pod in fleet.pods:  # requests that hold their slot for a few seconds
            fleet.set_fault(pod.name, "slow_decode", factor=20)
        gw = Gateway([p.url for p in fleet.pods], replica_in_flight=2, health_interval_s=0.2)
        scaler = Autoscaler(gw, min_replicas=1, target_in_flight=2, startup_s=0.3, cooldown_s=60)
        fleet.call(gw.start())
        fleet.call(scaler.start())
        yield fleet, gw, scaler
        fleet.call(scaler.stop())
        fleet.call(gw.stop())


def _burst_and_watch(gw: Gateway, scaler: Autoscaler, seconds: float) -> list[tuple[int, int, int]]:
    """Six long requests at once; (desired, ready, queued) every 0.1 s for ``seconds``."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 48,
    }
    for _ in range(6):
        threading.Thread(
            target=post_quietly, args=(f"{gw.url}/v1/chat/completions", body), daemon=True
        ).start()
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append((scaler.desired, scaler.ready, gw.waiting))
        time.sleep(0.1)
    return seen


def test_without_the_fault_ready_catches_up_with_desired_within_the_startup_time(
    scaled: tuple[Fleet, Gateway, Autoscaler],
) -> None:
    _, gw, scaler = scaled
    seen = _burst_and_watch(gw, scaler, 3.0)
    assert max(d for d, _, _ in seen) == 3
    short = sum(1 for d, r, _ in seen if r < d)
    assert short <= 15, seen  # ≤ 1.5 s behind: two start-ups of 0.3 s plus ticks and load
    assert seen[-1][1] == 3


def test_autoscaler_lag_keeps_ready_below_desired_while_the_gateway_queue_grows(
    scaled: tuple[Fleet, Gateway, Autoscaler],
) -> None:
    _, gw, scaler = scaled
    scaler.set_fault("autoscaler_lag", {"lag_s": 3.0})
    seen = _burst_and_watch(gw, scaler, 2.5)
    behind = [(d, r, q) for d, r, q in seen if r < d]
    assert len(behind) >= 20, seen  # ≥ 2 s with ready < desired
    assert max(q for _, _, q in behind) >= 3  # six requests, one replica of two slots
    assert all(r == 1 for _, r, _ in seen[:20])
    assert scaler.clear_fault("autoscaler_lag") and scaler.lag is None


def test_an_unknown_autoscaler_fault_or_bad_lag_is_refused(
    scaled: tuple[Fleet, Gateway, Autoscaler],
) -> None:
    _, _, scaler = scaled
    with pytest.raises(ConfigError, match="unknown"):
        scaler.set_fault("stall")
    with pytest.raises(ConfigError, match="lag_s"):
        scaler.set_fault("autoscaler_lag", {"lag_s": -1})


def test_the_autoscaler_exports_kube_state_metrics_names_with_desired_above_ready_under_lag(
    scaled: tuple[Fleet, Gateway, Autoscaler],
) -> None:
    _, gw, scaler = scaled
    hpa = {"namespace": "serving", "horizontalpodautoscaler": "llm-pool"}
    desired = "kube_horizontalpodautoscaler_status_desired_replicas"
    ready = "kube_deployment_status_replicas_ready"
    assert metric(scaler.url, desired, **hpa) == metric(scaler.url, ready, deployment="llm-pool")
    scaler.set_fault("autoscaler_lag", {"lag_s": 3.0})
    _burst_and_watch(gw, scaler, 1.0)
    assert metric(scaler.url, desired, **hpa) > metric(scaler.url, ready, deployment="llm-pool")
    assert metric(scaler.url, "llmslo_sim_autoscaler_lag_active") == 1
    scaler.clear_fault("autoscaler_lag")


def test_the_exporter_is_cluster_wide_and_each_hpa_pairs_with_its_own_deployment(
    scaled: tuple[Fleet, Gateway, Autoscaler], store: Store
) -> None:
    """Beside the gateway's HPA the exporter shows an unrelated one scaling in; read per
    HPA (through the real canonicalizer and the SLO snapshot), the gateway's lag shows and
    the neighbour's numbers stay its own. Summed over the cluster the lag would vanish."""
    _, gw, scaler = scaled
    infos = {
        labels["horizontalpodautoscaler"]: (
            labels["namespace"],
            labels["scaletargetref_kind"],
            labels["scaletargetref_name"],
        )
        for labels, _, _ in scrape(scaler.url)["kube_horizontalpodautoscaler_info"]
    }
    assert infos == {
        "llm-pool": ("serving", "Deployment", "llm-pool"),
        NEIGHBOUR.hpa: (NEIGHBOUR.namespace, "Deployment", NEIGHBOUR.deployment),
    }
    scaler.set_fault("autoscaler_lag", {"lag_s": 3.0})
    _burst_and_watch(gw, scaler, 1.0)
    canonicalizer, now_ms = TargetCanonicalizer("autoscaler"), int(time.time() * 1000)
    _, body = get(f"{scaler.url}/metrics")
    batch = canonicalizer.canonicalize(ExpositionParser().parse(body.decode()), now_ms)
    store.commit_batch({"engine_samples": [batch.table]}, group_id="t", offsets={}, now_ts_ms=0)
    scaler.clear_fault("autoscaler_lag")
    snap = load_snapshot(store.con, now_ms, 60_000)
    paired = snap.autoscalers["autoscaler"].paired
    llm, neighbour = paired["serving/llm-pool"], paired[f"{NEIGHBOUR.namespace}/{NEIGHBOUR.hpa}"]
    assert (llm.deployment, llm.paired_by) == ("serving/llm-pool", "info")
    assert llm.desired.last() > llm.ready.last() == 1
    assert (neighbour.deployment, neighbour.desired.last(), neighbour.ready.last()) == (
        f"{NEIGHBOUR.namespace}/{NEIGHBOUR.deployment}",
        NEIGHBOUR.desired,
        NEIGHBOUR.ready,
    )
    assert llm.desired.last() + NEIGHBOUR.desired <= llm.ready.last() + NEIGHBOUR.ready
