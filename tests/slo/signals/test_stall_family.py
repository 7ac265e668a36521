"""The stall family: an engine that holds work and produces no token, whether its running
gauge says it is running something (``running_tokens_flat``) or reads 0 while requests wait
(``waiting_nothing_running``, a wedge that keeps answering ``/health`` 200); no stall from a
gauge left stale after load; and the symptoms a stall causes (its queue grows with the KV
free: ``queue_growth`` and the admission signature of ``fragmentation``) reported as the
stall's evidence, not as findings of their own on that instance."""

from __future__ import annotations

import pytest

from pipeline.store import Store
from slo.signals.detectors import DetectorConfig, Finding, detect_all, fold_symptoms
from slo.signals.engine import detect_fragmentation, detect_queue_growth
from slo.signals.snapshot import Snapshot, load_snapshot
from tests.simulator.conftest import EngineScrape, engine_scrapes
from tests.slo.factories import T0_MS, engine_sample, insert
from tests.slo.fleet import Fault, FleetTimeline, State

CFG = DetectorConfig()


def _findings(store: Store, fleet: FleetTimeline, extra: list | None = None) -> list[Finding]:
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine + (extra or []), gpu=gpu, health=health)
    snap = load_snapshot(store.con, fleet.end_ms, int(CFG.lookback_s * 1000))
    return detect_all(snap, CFG)


def wedge(s: State, since: float) -> None:
    """vllm#53868 / the vllm-metal scrape: running 0, waiting grows, KV 0, no token; the tap
    holds the clients' streams open."""
    s["running"], s["kv_usage"], s["tokens_per_s"] = 0.0, 0.0, 0.0
    s["waiting"] = 3 + since / 10
    s["tap_in_flight"] = s["waiting"]
    s["requests"] = 0
    s["gpu_util"], s["engine_active"] = 0.0, 0.0


def demo_stall(s: State, since: float) -> None:
    """The 20-minute demo's stalled pod: running 9, waiting 8 → 1,881, tokens flat."""
    s["running"], s["kv_usage"], s["tokens_per_s"] = 9.0, 0.3, 0.0
    s["waiting"] = 8 + since * 2.4
    s["tap_in_flight"] = 9 + s["waiting"]
    s["requests"] = 0


def stalled_then_restarted(stall: Fault, stall_s: float, drain_per_scrape: float) -> Fault:
    """``stall`` for ``stall_s``, then the group restarted: tokens flow again and the
    backlog drains ``drain_per_scrape`` a scrape (the queue keeps what the stall grew)."""

    def fault(s: State, since: float) -> None:
        if since < stall_s:
            stall(s, since)
            return
        if s["tokens_per_s"] == 0:  # the restart's first scrape already counts tokens
            s["generation_tokens"] += 180.0 * 15
        s["tokens_per_s"], s["kv_usage"], s["requests"] = 180.0, 0.6, 8
        s["waiting"] = max(s["waiting"] - drain_per_scrape, 0.0)
        s["tap_in_flight"] = s["running"] + s["waiting"]

    return fault


def wedge_then_batch(s: State, since: float) -> None:
    """A wedge whose scheduler, after two minutes, admits a batch it never decodes: the
    running gauge turns 5, tokens stay flat, the queue keeps growing."""
    wedge(s, since)
    if since >= 120:
        s["running"] = 5.0
        s["tap_in_flight"] = s["running"] + s["waiting"]


def busy_queue(s: State, since: float) -> None:
    """A healthy pod taking more than it serves: tokens flow, its queue grows 6 a minute."""
    s["waiting"] = 1 + since / 10
    s["tap_in_flight"] = s["running"] + s["waiting"]


def stale_gauge(s: State, _: float) -> None:
    """After the load: nothing in flight at the tap, no token, but the engine's running
    gauge still reads the last batch (sglang#31517)."""
    s["running"], s["waiting"], s["tokens_per_s"] = 3.0, 0.0, 0.0
    s["tap_in_flight"], s["requests"] = 0.0, 0
    s["gpu_util"], s["engine_active"] = 0.0, 0.0


def idle(s: State, _: float) -> None:
    s["running"], s["waiting"], s["tokens_per_s"] = 0.0, 0.0, 0.0
    s["tap_in_flight"], s["requests"] = 0.0, 0


def _on(findings: list[Finding], instance: str) -> dict[str, Finding]:
    return {f.signal: f for f in findings if f.scope_id == instance}


def test_a_wedge_with_nothing_running_is_a_stall_that_says_health_answered(store: Store) -> None:
    fleet = FleetTimeline(instances=4, seconds=900).add_fault(1, 300, wedge)
    findings = _findings(store, fleet)
    stall = _on(findings, fleet.instance(1))["stall"]
    assert stall.basis == "waiting_nothing_running"
    assert stall.evidence["kind"] == "waiting_nothing_running"
    assert stall.evidence["running_max"] == 0.0
    assert stall.evidence["waiting_last"] > stall.evidence["waiting_first"] > 0
    assert stall.evidence["health_ok_while_stalled"] is True
    assert stall.evidence["health_status_last"] == 200
    assert stall.evidence["tap_streams_silent"] is True
    assert {f.scope_id for f in findings} == {fleet.instance(1)}


def test_the_wedge_is_detected_within_stall_for_and_one_scrape(store: Store) -> None:
    scrape_s, start_s = 15, 300
    late = FleetTimeline(seconds=start_s + int(CFG.stall_for_s) + scrape_s)
    assert "stall" in _on(_findings(store, late.add_fault(0, start_s, wedge)), late.instance(0))


def test_a_wedge_shorter_than_stall_for_is_not_a_stall(store: Store) -> None:
    early = FleetTimeline(seconds=300 + int(CFG.stall_for_s) - 15).add_fault(0, 300, wedge)
    assert "stall" not in _on(_findings(store, early), early.instance(0))


def test_the_running_kind_keeps_its_basis_and_names_its_kind(store: Store) -> None:
    fleet = FleetTimeline(instances=3, seconds=900).add_fault(0, 300, demo_stall)
    stall = _on(_findings(store, fleet), fleet.instance(0))["stall"]
    assert stall.basis == "generation_tokens_flat"
    assert stall.evidence["kind"] == "running_tokens_flat"


@pytest.mark.parametrize(
    "fault", [wedge, demo_stall], ids=["wedge, running 0", "demo stall, running 9"]
)
def test_a_stalls_growing_queue_is_its_evidence_not_findings_of_their_own(
    store: Store, fault: object
) -> None:
    """The demo's stalled pod also raised fragmentation (admission signature) and
    queue_growth: both are what the stall does to its queue."""
    fleet = FleetTimeline(instances=3, seconds=1200).add_fault(0, 300, fault)  # type: ignore[arg-type]
    on_pod = _on(_findings(store, fleet), fleet.instance(0))
    assert set(on_pod) == {"stall"}
    explained = on_pod["stall"].evidence["explained"]
    assert set(explained) == {"fragmentation", "queue_growth"}
    assert explained["fragmentation"]["basis"] == "admission_signature"
    assert explained["queue_growth"]["waiting_per_min"] > CFG.queue_growth_per_min


def _raw_symptoms(snap: Snapshot, instance: str) -> set[str]:
    """What the symptom detectors alone (no folding) raise on ``instance``."""
    raw = detect_queue_growth(snap, CFG) + detect_fragmentation(snap, CFG)
    return {f.signal for f in raw if f.scope_id == instance}


@pytest.mark.parametrize(
    ("stall", "drain_per_scrape"),
    [(demo_stall, 40.0), (wedge, 3.0)],
    ids=["demo stall, running 9", "wedge, running 0"],
)
def test_a_stall_is_the_only_finding_on_its_pod_in_every_cycle_from_onset_to_the_hold(
    store: Store, stall: Fault, drain_per_scrape: float
) -> None:
    """Cycle by cycle (one per scrape): before the stall is confirmed (``stall_for_s``), while
    it holds, and for ``stall_hold_s`` after the pod recovers, the queue the stall grew is
    never a finding of its own on the pod; while the stall holds it is the stall's
    evidence. A healthy neighbour's queue growth is still reported every cycle it shows."""
    onset_s, stall_s, scrape_s = 300, 420, 15
    recovered_s = onset_s + stall_s
    end_s = recovered_s + int(CFG.stall_hold_s) + 120
    fleet = FleetTimeline(instances=3, seconds=end_s, scrape_s=scrape_s)
    fleet.add_fault(0, onset_s, stalled_then_restarted(stall, stall_s, drain_per_scrape))
    fleet.add_fault(1, 600, busy_queue)
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    pod, neighbour = fleet.instance(0), fleet.instance(1)
    symptoms_seen = {"pending": 0, "stalled": 0, "cleared": 0}
    neighbour_growth = 0
    for t in range(onset_s, end_s + 1, scrape_s):
        now = fleet.end_ms - (end_s - t) * 1000
        snap = load_snapshot(store.con, now, int(CFG.lookback_s * 1000))
        findings = detect_all(snap, CFG)
        on_pod = _on(findings, pod)
        assert set(on_pod) <= {"stall"}, f"at {t} s: {sorted(on_pod)}"
        raw = _raw_symptoms(snap, pod)
        stalled = onset_s + CFG.stall_for_s <= t < recovered_s
        assert ("stall" in on_pod) == stalled, f"at {t} s"
        if stalled:
            assert set(on_pod["stall"].evidence.get("explained", {})) == raw, f"at {t} s"
        phase = "stalled" if stalled else "pending" if t < recovered_s else "cleared"
        symptoms_seen[phase] += bool(raw)
        if "queue_growth" in _raw_symptoms(snap, neighbour):
            neighbour_growth += 1
            assert "queue_growth" in _on(findings, neighbour), f"at {t} s"
    # the symptoms were there to fold in each phase: before, during and after the stall
    assert all(symptoms_seen.values()), symptoms_seen
    assert neighbour_growth > 0


def test_a_stall_changing_kind_keeps_its_symptoms_folded(store: Store) -> None:
    """While the stall's window holds both kinds (running 0, then running 5, tokens flat
    throughout) neither kind is reported, yet the queue it grows is no finding either."""
    fleet = FleetTimeline(instances=3, seconds=660).add_fault(0, 300, wedge_then_batch)
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    pod, unreported = fleet.instance(0), 0
    for t in range(300, 661, fleet.scrape_s):
        snap = load_snapshot(store.con, fleet.end_ms - (660 - t) * 1000, int(CFG.lookback_s * 1000))
        on_pod = _on(detect_all(snap, CFG), pod)
        assert set(on_pod) <= {"stall"}, f"at {t} s: {sorted(on_pod)}"
        unreported += "stall" not in on_pod and bool(_raw_symptoms(snap, pod))
    assert unreported > 0  # cycles with symptoms and no stall finding to fold them into


def test_a_stale_running_gauge_after_load_raises_nothing_in_any_cycle(store: Store) -> None:
    """sglang#31517's shape: the load ends on every pod at 300 s; one pod's running gauge
    stays at its last batch (3) with nothing waiting and no token, while the tap holds no
    stream. Replayed cycle by cycle to the end, nothing is raised on any pod."""
    fleet = FleetTimeline(instances=3, seconds=900)
    for index in range(3):
        fleet.add_fault(index, 300, stale_gauge if index == 2 else idle)
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    for t in range(300, 901, fleet.scrape_s):
        now = fleet.end_ms - (900 - t) * 1000
        snap = load_snapshot(store.con, now, int(CFG.lookback_s * 1000))
        assert snap.series(fleet.instance(2), "running").last() == 3.0  # type: ignore[union-attr]
        assert detect_all(snap, CFG) == [], f"at {t} s"


def test_an_engine_put_to_sleep_is_no_wedge(store: Store) -> None:
    """vLLM's sleep mode empties the batch on purpose; ``engine_sleep_state`` says so."""
    fleet = FleetTimeline(instances=3, seconds=900).add_fault(1, 300, wedge)
    asleep = [
        engine_sample(
            T0_MS + t * 1000,
            "engine_awake",
            1.0 if t < 300 else 0.0,
            metric="vllm:engine_sleep_state",
            instance=fleet.instance(1),
        )
        for t in range(0, 901, 15)
    ]
    assert "stall" not in _on(_findings(store, fleet, asleep), fleet.instance(1))


def _finding(signal: str, basis: str, instance: str = "pod-0:8000") -> Finding:
    return Finding(0, signal, "instance", instance, "llama", "ticket", basis, {"n": 1})


def test_only_the_symptoms_a_cause_explains_on_its_own_instance_are_folded() -> None:
    stall = _finding("stall", "generation_tokens_flat")
    real = _finding("fragmentation", "block_stats")  # free blocks cut in pieces: a cause
    elsewhere = _finding("queue_growth", "engine_gauges", instance="pod-1:8000")
    symptom = _finding("queue_growth", "engine_gauges")
    out = fold_symptoms([stall, real, elsewhere, symptom])
    assert [(f.signal, f.scope_id) for f in out] == [
        ("stall", "pod-0:8000"),
        ("fragmentation", "pod-0:8000"),
        ("queue_growth", "pod-1:8000"),
    ]
    assert out[0].evidence["explained"] == {"queue_growth": {"basis": "engine_gauges", "n": 1}}
    assert fold_symptoms([real, symptom]) == [real, symptom]  # no cause, nothing folded


def test_a_symptom_where_its_cause_is_only_suspected_is_no_finding() -> None:
    """Before the stall is confirmed or just after it cleared there is no stall finding to
    hold the symptom, and the symptom is not reported on its own either; elsewhere, and a
    cause of its own (block stats), it is."""
    real = _finding("fragmentation", "block_stats")
    elsewhere = _finding("queue_growth", "engine_gauges", instance="pod-1:8000")
    symptom = _finding("queue_growth", "engine_gauges")
    admission = _finding("fragmentation", "admission_signature")
    for state in ("pending", "open", "cleared"):
        suspected = {"stall": {"pod-0:8000": state}}
        out = fold_symptoms([real, elsewhere, symptom, admission], suspected)
        assert out == [real, elsewhere], state
    assert fold_symptoms([symptom], {"ghost_requests": {"pod-0:8000": "x"}}) == [symptom]


#: The drill's compressed windows (llmslo.drill.profile), against which it scores the matrix.
DRILL = DetectorConfig(stall_for_s=20, fragmentation_for_s=40, queue_for_s=40, lookback_s=60)


def _engine_rows(scrape: EngineScrape) -> list[dict]:
    ts_ms = T0_MS + int(scrape.t_s * 1000)
    return [
        engine_sample(ts_ms, "running", scrape.running),
        engine_sample(ts_ms, "waiting", scrape.waiting),
        engine_sample(ts_ms, "kv_usage", scrape.kv_usage),
        engine_sample(ts_ms, "generation_tokens", scrape.tokens, kind="counter"),
        engine_sample(ts_ms, "preemptions", scrape.preemptions, kind="counter"),
    ]


def test_the_simulated_fragmentation_under_load_is_fragmentation_not_a_stall(
    store: Store,
) -> None:
    """The simulator's fault under the drill's load, scraped every 2 s and judged every
    cycle as the jobs do: its queue grows while the batch runs, never a stall."""
    fault_from_s = 20.0
    scrapes = engine_scrapes(
        "fragmentation", rate_per_s=1.5, seconds=70.0, fault_from_s=fault_from_s
    )
    seen: set[str] = set()
    for scrape in scrapes:
        insert(store, engine=_engine_rows(scrape))
        snap = load_snapshot(store.con, T0_MS + int(scrape.t_s * 1000), 60_000)
        signals = {f.signal for f in detect_all(snap, DRILL)}
        assert "stall" not in signals, scrape
        if scrape.t_s >= fault_from_s:
            seen |= signals
    assert {"fragmentation", "queue_growth"} <= seen
