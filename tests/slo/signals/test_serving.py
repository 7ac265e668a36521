"""Which answers show a pod *not serving* (``slo.signals._serving``), end to end from tap rows.

Only answers that show the pod itself failing count against it: 5xx (503 too), errors
before or after the first token, ``finish_reason=error``, refused or timed-out connections.
A 429 (the pod's full queue, or the tap's own L2 refusal that never reached it), a deadline
or a first-token / read timeout is what an overloaded or slow pod produces: neither served
nor failed, so such a pod is still judged hot or slow. A pod whose tap records show it
serving now stays in the baseline whatever its scrapes or its XID history say.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pipeline.store import Store
from slo.signals import _serving
from slo.signals._serving import SERVING_FAILURE, not_serving, pool_baselines
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import Snapshot, load_snapshot
from tests.slo.factories import insert
from tests.slo.fleet import Fault, FleetTimeline, State

CFG = DetectorConfig()
POOL = "llama-3-8b"


def _answer(
    outcome: str, http_status: int, upstream_status: int | None, kind: str
) -> dict[str, Any]:
    """An attempt that got no token, as the tap records it (collectors/tap/exchange.py)."""
    return {
        "outcome": outcome,
        "http_status": http_status,
        "upstream_status": upstream_status,
        "error_kind": kind,
        **dict.fromkeys(("ttft_s", "tpot_s", "finish_reason", "itl_jitter_s")),
        "completion_tokens": None,
        "token_chunks": 0,
    }


# Neither served nor failed: what an overloaded or slow pod produces.
POD_429 = _answer("rejected", 429, 429, "http_429")
TAP_L2_429 = _answer("rejected", 429, None, "rejected_max_tokens")  # never sent upstream
FIRST_TOKEN_TIMEOUT = _answer("upstream_timeout", 504, 200, "first_token_timeout")
READ_TIMEOUT = _answer("upstream_timeout", 504, None, "upstream_read_timeout")
DEADLINE = _answer("deadline_exceeded", 504, None, "deadline")
REQUEST_400 = _answer("error_before_first_token", 400, 400, "http_400")  # the request's fault
# The pod failing.
CONNECT_REFUSED = _answer("error_before_first_token", 502, None, "connect_failed")
CONNECT_TIMEOUT = _answer("upstream_timeout", 504, None, "connect_timeout")
POD_503 = _answer("rejected", 503, 503, "http_503")
POD_502 = _answer("error_before_first_token", 502, 502, "http_502")


def pod(index: int) -> str:
    return f"10.0.0.{index + 1}:8000"


def on(findings: list[Finding], signal: str) -> list[str]:
    return sorted(f.scope_id for f in findings if f.signal == signal)


def _mostly(answer: dict[str, Any], of: int, out_of: int, **ok: Any) -> Fault:
    """``of`` in ``out_of`` scrapes answer ``answer``; the others are served with ``ok``."""

    def fault(s: State, since: float) -> None:
        s.update(ok)
        s["request"] = dict(answer) if (since // 15) % out_of < of else {}

    return fault


def _snapshot(store: Store, fleet: FleetTimeline) -> Snapshot:
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    return load_snapshot(store.con, fleet.end_ms, int(CFG.lookback_s * 1000))


@pytest.mark.parametrize(
    "refusal",
    [POD_429, TAP_L2_429, REQUEST_400],
    ids=[
        "the pod's own 429s (queue full)",
        "the tap's L2 429s (never sent to the pod)",
        "400s the requests earned",
    ],
)
def test_an_overloaded_hot_pod_answering_two_of_three_with_429_is_still_hot(
    store: Store, refusal: dict[str, Any]
) -> None:
    fleet = FleetTimeline(instances=9, seconds=900)
    fleet.add_fault(4, 0, _mostly(refusal, 2, 3, requests=24))  # 3× traffic
    snap = _snapshot(store, fleet)
    assert not_serving(snap, CFG) == {}
    assert on(detect_all(snap, CFG), "hot_instance") == [pod(4)]


@pytest.mark.parametrize(
    "timeout",
    [FIRST_TOKEN_TIMEOUT, READ_TIMEOUT, DEADLINE],
    ids=["first-token timeouts", "read timeouts", "deadlines passed"],
)
def test_a_slow_pod_whose_attempts_mostly_time_out_is_still_slow_prefill(
    store: Store, timeout: dict[str, Any]
) -> None:
    fleet = FleetTimeline(instances=9, seconds=900)
    fleet.add_fault(3, 0, _mostly(timeout, 3, 5, ttft_s=1.8))  # 6× TTFT, 60 % time out
    snap = _snapshot(store, fleet)
    assert not_serving(snap, CFG) == {}
    assert on(detect_all(snap, CFG), "slow_prefill") == [pod(3)]


def test_a_pool_under_l2_keeps_every_pool_verdict(store: Store) -> None:
    """The tap's L2 429s are recorded against the pod it picked: all pods, most attempts."""
    fleet = FleetTimeline(instances=4, seconds=900)
    for i in range(4):
        fleet.add_fault(i, 0, _mostly(TAP_L2_429, 3, 4, requests=24 if i == 1 else 8))
    snap = _snapshot(store, fleet)
    assert pool_baselines(snap, CFG)[POOL].serving == tuple(pod(i) for i in range(4))
    assert on(detect_all(snap, CFG), "hot_instance") == [pod(1)]


@pytest.mark.parametrize(
    "failure",
    [CONNECT_REFUSED, CONNECT_TIMEOUT, POD_503, POD_502],
    ids=["connection refused", "connect timeouts", "503s", "502s"],
)
def test_a_pod_mostly_failing_on_its_own_is_left_out(store: Store, failure: dict[str, Any]) -> None:
    fleet = FleetTimeline(instances=3, seconds=900)
    fleet.add_fault(2, 0, _mostly(failure, 3, 5))
    assert not_serving(_snapshot(store, fleet), CFG) == {pod(2): SERVING_FAILURE}


def test_one_detector_that_raises_costs_only_its_own_reason(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
        raise ValueError("odd data")

    monkeypatch.setattr(_serving, "_CANNOT_SERVE", (broken, *_serving._CANNOT_SERVE))
    fleet = FleetTimeline(instances=9, seconds=900)
    fleet.add_fault(4, 0, lambda s, _: s.update(requests=24))
    fleet.add_fault(6, 450, lambda s, _: s.update(up=False, requests=0))
    snap = _snapshot(store, fleet)
    with caplog.at_level(logging.ERROR, logger="slo.signals._serving"):
        found = detect_all(snap, CFG)
    assert on(found, "hot_instance") == [pod(4)]
    assert pool_baselines(snap, CFG)[POOL].left_out == {pod(6): "target_down"}
    assert [r.getMessage() for r in caplog.records if "broken" in r.getMessage()] != []


def _scrape_fails(s: State, since: float) -> None:
    """3× the traffic; its /metrics scrape times out for the last 100 s (overloaded)."""
    s["up"], s["requests"] = since < 800, 24


def _xid_then_replaced(s: State, since: float) -> None:
    """XID 79 at the start of the lookback; the pod was replaced and serves since."""
    s["xid"] = 79.0 if since < 15 else 0.0


def test_a_pod_serving_now_stays_in_whatever_its_scrapes_or_history_say(
    store: Store,
) -> None:
    fleet = FleetTimeline(instances=9, seconds=900)
    fleet.add_fault(4, 0, _scrape_fails)
    fleet.add_fault(5, 320, _xid_then_replaced)
    fleet.add_fault(6, 0, lambda s, _: s.update(tokens_per_s=0.0, requests=0, xid=79.0))
    snap = _snapshot(store, fleet)
    found = detect_all(snap, CFG)
    assert (on(found, "target_down"), on(found, "xid_fallen_off_bus")) == (
        [pod(4)],
        [pod(5), pod(6)],
    )
    assert pool_baselines(snap, CFG)[POOL].left_out == {pod(6): "stall"}
    assert on(found, "hot_instance") == [pod(4)]


def test_the_shared_baseline_is_read_only_and_each_finding_holds_its_own_left_out(
    store: Store,
) -> None:
    fleet = FleetTimeline(instances=9, seconds=900)
    fleet.add_fault(4, 0, lambda s, _: s.update(requests=24))
    fleet.add_fault(6, 450, lambda s, _: s.update(up=False, requests=0))
    snap = _snapshot(store, fleet)
    hot = next(f for f in detect_all(snap, CFG) if f.signal == "hot_instance")
    hot.evidence["left_out"].clear()  # a consumer editing its finding's evidence
    baseline = pool_baselines(snap, CFG)[POOL]
    assert baseline.left_out == {pod(6): "target_down"}
    with pytest.raises(TypeError):
        baseline.left_out[pod(0)] = "edited"  # type: ignore[index]
    assert isinstance(baseline.serving, tuple)
