"""A request the tap measured while its own loop was late (``itl_uncertain``) is no event of
an ITL SLI and no evidence of an ITL-jitter finding; its other SLIs still count it."""

from __future__ import annotations

from typing import Any

from pipeline.store import Store
from slo.budget import WindowCounts
from slo.evaluate import evaluate
from slo.rollups.counts import Rollup
from slo.signals.detectors import DetectorConfig, detect_all
from slo.signals.snapshot import load_snapshot
from slo.spec import parse_spec
from slo.spec.model import SloModel, build_model
from tests.slo.factories import T0_MS, insert, request
from tests.slo.fleet import FleetTimeline, State

JITTER = {
    "name": "jit",
    "objective": 0.99,
    "sli": {"kind": "latency", "metric": "itl", "statistic": "jitter", "threshold_s": 0.03},
}
ITL_MAX = {
    "name": "itlmax",
    "objective": 0.99,
    "sli": {"kind": "latency", "metric": "itl", "statistic": "max", "threshold_s": 0.1},
}
TTFT = {
    "name": "ttft",
    "objective": 0.99,
    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0},
}


def model(*slos: dict[str, Any]) -> SloModel:
    return build_model(parse_spec({"version": "llmslo/v1", "service": "svc", "slos": list(slos)}))


def periods(store: Store, m: SloModel) -> dict[str, WindowCounts]:
    Rollup(store.con, m, horizon_ms=40 * 86_400_000).update(T0_MS)
    return {s.slo.name: s.period for s in evaluate(store.con, m, T0_MS)}


def test_an_uncertain_request_is_no_event_of_itl_slis_but_counts_elsewhere(
    store: Store,
) -> None:
    stalled = {"itl_jitter_s": 0.2, "itl_max_s": 0.25, "itl_error_s": 0.2}
    insert(
        store,
        requests=[
            request(T0_MS, itl_jitter_s=0.01, itl_error_s=0.001, itl_uncertain=False),  # good
            request(T0_MS, itl_jitter_s=0.06, itl_max_s=0.2, itl_uncertain=False),  # bad
            request(T0_MS, itl_jitter_s=0.02),  # a record from before the flag: counted
            request(T0_MS, **stalled, itl_uncertain=True),  # the tap's stall: no event
            # a failure is the engine's whatever the tap's loop did: still a bad event
            request(T0_MS, outcome="interrupted_after_first_token", **stalled, itl_uncertain=True),
        ],
    )
    got = periods(store, model(JITTER, ITL_MAX, TTFT))
    assert got["jit"] == WindowCounts(4, 2)
    assert got["itlmax"] == WindowCounts(4, 2)
    assert got["ttft"] == WindowCounts(5, 1)  # TTFT does not ask about the gaps


def _uncertain_jitter(s: State, _: float) -> None:
    s["request"] = {"itl_jitter_s": 0.2, "itl_error_s": 0.15, "itl_uncertain": True}


def _certain_jitter(s: State, _: float) -> None:
    s["request"] = {"itl_jitter_s": 0.2, "itl_error_s": 0.001, "itl_uncertain": False}


def _jitter_findings(store: Store, fault: Any) -> list[Any]:
    cfg = DetectorConfig()
    fleet = FleetTimeline(instances=4, seconds=900).add_fault(1, 300, fault)
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    snap = load_snapshot(
        store.con, fleet.end_ms, int(cfg.lookback_s * 1000), int(cfg.ghost_grace_s * 1000)
    )
    return [f for f in detect_all(snap, cfg) if f.signal == "itl_jitter"]


def test_jitter_the_tap_was_too_late_to_vouch_for_raises_no_finding(store: Store) -> None:
    assert _jitter_findings(store, _uncertain_jitter) == []


def test_the_same_jitter_measured_with_a_small_bound_is_a_finding(store: Store) -> None:
    assert len(_jitter_findings(store, _certain_jitter)) == 1
