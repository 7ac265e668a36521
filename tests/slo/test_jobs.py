"""The jobs runner on fleet data: flags per level, Kafka publication, /metrics, restarts."""

from __future__ import annotations

import urllib.request
from typing import Any

import numpy as np
import pytest
from prometheus_client import start_http_server

from pipeline.bus import Bus
from pipeline.codec import decode_message
from pipeline.publisher import Publisher
from pipeline.schema import FLAG_TRANSITIONS
from pipeline.store import Store
from slo.flags import FlagPolicy, FlagTransition
from slo.jobs import JobsConfig, SloJobs
from slo.metrics import JobMetrics
from slo.signals._series import Series
from slo.signals.snapshot import Snapshot
from slo.sinks import BusTransitionSink, ListTransitionSink, StoreTransitionSink
from slo.spec import parse_spec
from slo.spec.model import SloModel, build_model
from tests.slo.factories import T0_MS, insert
from tests.slo.fleet import FleetTimeline, State

MODEL: SloModel = build_model(
    parse_spec(
        {
            "version": "llmslo/v1",
            "service": "svc",
            "slos": [
                {
                    "name": "avail",
                    "objective": 0.99,
                    "sli": {"kind": "availability"},
                    "group_by": ["pool"],
                },
                {
                    "name": "ttft",
                    "objective": 0.99,
                    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0},
                },
            ],
        }
    )
)
CONFIG = JobsConfig(flags=FlagPolicy(dwell_s=60))
#: The pool's level from the mean KV free ratio of its instances (not the default).
MEAN_KV_POOL = JobsConfig(flags=FlagPolicy(dwell_s=60), pool_level="kv", pool_kv="mean")


def kv_leak(s: State, since: float) -> None:
    s["kv_usage"] = min(
        1.0, 0.5 + since / 600
    )  # +0.1 per minute: L1 at 0.90, L2 at 0.95, L3 at 0.99


def replay(
    store: Store,
    fleet: FleetTimeline,
    sink: Any,
    metrics: JobMetrics | None = None,
    step_s: int = 0,
    start_s: int = 0,
    config: JobsConfig = CONFIG,
) -> SloJobs:
    """Insert the fleet's rows, then run one cycle per ``step_s`` (default: every scrape)."""
    requests, engine, gpu, health = fleet.all_rows()
    insert(store, requests=requests, engine=engine, gpu=gpu, health=health)
    jobs = SloJobs(store.con, MODEL, config, sink=sink, metrics=metrics)
    for t in range(start_s, fleet.seconds + 1, step_s or fleet.scrape_s):
        result = jobs.run_once(T0_MS + t * 1000)
        assert result is not None and result.errors == []
    return jobs


def test_a_healthy_run_changes_no_flag(store: Store) -> None:
    sink = ListTransitionSink()
    replay(store, FleetTimeline(instances=3, seconds=1200), sink, step_s=30)
    assert sink.transitions == []
    assert store.count("flag_transitions") == 0


def test_kv_leak_raises_l1_l2_l3_within_two_scrapes_of_each_crossing(store: Store) -> None:
    sink = ListTransitionSink()
    fleet = FleetTimeline(instances=3, seconds=900).add_fault(1, 300, kv_leak)
    replay(store, fleet, sink, start_s=480, config=MEAN_KV_POOL)
    mine = [t for t in sink.transitions if t.scope == "instance"]
    assert [(t.from_level, t.to_level) for t in mine] == [(0, 1), (1, 2), (2, 3)]
    assert all(t.scope_id == fleet.instance(1) for t in mine)
    crossings_s = {1: 300 + 240, 2: 300 + 270, 3: 300 + 294}  # usage 0.90, 0.95, 0.99
    for t in mine:
        delay_s = (t.ts_ms - T0_MS) / 1000 - crossings_s[t.to_level]
        assert 0 <= delay_s <= 2 * fleet.scrape_s, t
        assert t.evidence["kv_usage"] == pytest.approx(1 - t.kv_free_ratio)  # type: ignore[operator]
    # the pool's mean free ratio (two healthy instances) stays well above 10 %: no pool flag
    assert not [t for t in sink.transitions if t.scope == "pool"]


def test_a_gpu_fallen_off_the_bus_sends_the_instance_to_l3_as_gpu_lost(store: Store) -> None:
    """XID 79 takes the GPU out: the instance is pinned at L3 (route away), but it is no
    memory pressure (not every XID is OOM risk), and the pool stays."""

    def xid(s: State, _: float) -> None:
        s["xid"] = 79.0

    sink = ListTransitionSink()
    replay(store, FleetTimeline(instances=2, seconds=400).add_fault(0, 300, xid), sink, start_s=240)
    (t,) = sink.transitions
    assert (t.scope, t.to_level, t.reason) == ("instance", 3, "xid_gpu_lost")
    assert t.evidence["xid_gpu_lost"]["xid"] == [79]
    assert "oom_risk" not in t.evidence or t.evidence["oom_risk"] is True


@pytest.mark.parametrize("code", [13, 31, 43, 74, 94])
def test_an_xid_that_leaves_the_gpu_serving_changes_no_flag(store: Store, code: int) -> None:
    sink = ListTransitionSink()
    fleet = FleetTimeline(instances=2, seconds=400).add_fault(
        0, 300, lambda s, _: s.update(xid=code)
    )
    replay(store, fleet, sink, start_s=240)
    assert sink.transitions == []


def test_recovery_leaves_slowly_and_every_transition_is_stored(store: Store) -> None:
    def blip(s: State, since: float) -> None:
        s["kv_usage"] = 0.93 if since < 60 else 0.4

    fleet = FleetTimeline(instances=1, seconds=700).add_fault(0, 300, blip)
    replay(store, fleet, StoreTransitionSink(store.con), start_s=240)
    rows = store.con.execute(
        "SELECT scope, from_level, to_level, reason, ts_ms FROM flag_transitions "
        "WHERE scope = 'instance' ORDER BY ts_ms"
    ).fetchall()
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (0, 1, "kv_free_below_l1"),
        (1, 0, "recovered_dwell_elapsed"),
    ]
    assert rows[1][4] - rows[0][4] >= 60_000


def test_a_restart_resumes_the_stored_level_instead_of_re_announcing(store: Store) -> None:
    fleet = FleetTimeline(instances=1, seconds=600).add_fault(
        0, 0, lambda s, _: s.update(kv_usage=0.93)
    )
    replay(store, fleet, StoreTransitionSink(store.con), step_s=60)
    before = store.count("flag_transitions")
    again = SloJobs(store.con, MODEL, CONFIG, sink=StoreTransitionSink(store.con))
    again.run_once(fleet.end_ms)
    assert store.count("flag_transitions") == before


def test_transitions_are_published_to_the_flags_topic(store: Store, bus: Bus) -> None:
    sink = BusTransitionSink(Publisher(bus.producer, component="slo-jobs"))
    fleet = FleetTimeline(instances=2, seconds=700).add_fault(0, 300, kv_leak)
    replay(store, fleet, sink, start_s=480, config=MEAN_KV_POOL)
    sink.close()
    consumer = bus.consumer(None)
    consumer.subscribe([bus.prefix + FLAG_TRANSITIONS.topic])
    rows: list[dict[str, Any]] = []
    beats: list[dict[str, Any]] = []
    for _ in range(60):
        for records in consumer.poll(timeout_ms=1000).values():
            for record in records:
                decoded = decode_message(record.value, record.headers)
                kept = rows if decoded.schema is FLAG_TRANSITIONS else beats
                kept += decoded.table.to_pylist()
        if len(rows) >= 3 and beats:
            break
    consumer.close()
    assert [(r["scope_id"], r["to_level"]) for r in rows] == [
        (fleet.instance(0), level) for level in (1, 2, 3)
    ]
    # Each cycle also sends its heartbeat on the topic: one per cycle, at its event time.
    assert beats and len({b["event_ts_ms"] for b in beats}) == len(beats)
    assert all('"thresholds"' in r["evidence_json"] for r in rows)


def test_findings_start_and_resolve_once(store: Store) -> None:
    def stall(s: State, since: float) -> None:
        if since < 120:
            s["tokens_per_s"], s["requests"] = 0.0, 0
        else:
            s["tokens_per_s"], s["requests"] = 180.0, 8

    fleet = FleetTimeline(instances=2, seconds=900).add_fault(0, 300, stall)
    replay(store, fleet, ListTransitionSink(), step_s=30)
    rows = store.con.execute("SELECT state, signal FROM slo_findings ORDER BY ts_ms").fetchall()
    assert rows == [("firing", "stall"), ("resolved", "stall")]


def test_metrics_endpoint_serves_burn_rates_budgets_flags_and_durations(store: Store) -> None:
    metrics = JobMetrics()
    server, _ = start_http_server(0, "127.0.0.1", registry=metrics.registry)
    try:
        fleet = FleetTimeline(instances=2, seconds=660).add_fault(0, 300, kv_leak)
        replay(store, fleet, ListTransitionSink(), metrics, step_s=30, start_s=480)
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=30)
            .read()
            .decode()
        )
    finally:
        server.shutdown()
    assert 'llmslo_slo_burn_rate{group="pool=llama-3-8b",slo="svc-avail",window="1h"} 0.0' in body
    assert 'llmslo_slo_error_budget_remaining_ratio{group="",slo="svc-ttft"} 1.0' in body
    assert (
        f'llmslo_degradation_level{{pool="",scope="instance",scope_id="{fleet.instance(0)}"}} 3.0'
        in body
    )
    assert 'llmslo_job_duration_seconds_count{job="evaluate"}' in body
    assert (
        'llmslo_slo_alert_active{group="",pair="page-1h-5m",severity="page",slo="svc-ttft"} 0.0'
        in body
    )


def test_a_run_without_data_does_nothing(store: Store) -> None:
    assert SloJobs(store.con, MODEL, CONFIG).run_once() is None


def _levels(transitions: list[FlagTransition]) -> list[int]:
    return [t.to_level for t in transitions]


def test_the_slo_config_section_is_validated_by_field_path(tmp_path: Any) -> None:
    from llmslo.sections import load_config
    from pipeline.errors import ConfigError

    path = tmp_path / "llmslo.yaml"
    path.write_text(
        "slo:\n  interval_s: 0\n  flags: {l1_free: 0.01, l2_free: 0.05}\n"
        "  detectors: {stall_for_s: -1}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "slo.interval_s: Input should be greater than 0" in message
    assert "slo.flags: Value error, thresholds must satisfy l3_free < l2_free < l1_free" in message
    assert "slo.detectors.stall_for_s: Input should be greater than 0" in message


def test_the_loop_runs_every_interval_until_stopped(store: Store) -> None:
    requests, engine, gpu = FleetTimeline(instances=1, seconds=60).rows()
    insert(store, requests=requests, engine=engine, gpu=gpu)
    metrics = JobMetrics()
    jobs = SloJobs(
        store.con, MODEL, CONFIG.model_copy(update={"interval_s": 0.01}), metrics=metrics
    )
    assert jobs.run(max_cycles=3) == 3
    runs = metrics.registry.get_sample_value(
        "llmslo_job_duration_seconds_count", {"job": "evaluate"}
    )
    assert runs == 3
    assert (
        metrics.registry.get_sample_value("llmslo_job_last_evaluation_timestamp_seconds")
        == (T0_MS + 60_000) / 1000
    )


def test_raw_rows_are_pruned_hourly_but_never_inside_the_settle_window(store: Store) -> None:
    from tests.slo.factories import request

    insert(store, requests=[request(T0_MS + m * 60_000) for m in range(0, 180, 5)])
    config = CONFIG.model_copy(update={"prune_raw": True})
    jobs = SloJobs(store.con, MODEL, config, raw_pruner=store.prune, raw_retention_ms=60_000)
    jobs.run_once(T0_MS + 180 * 60_000)
    oldest = store.con.execute("SELECT min(received_ts_ms) FROM requests").fetchone()
    assert oldest is not None
    # retention 1 min is raised to settle (10 min) + 2 min: rows from 168 min on are kept
    assert oldest[0] == T0_MS + 170 * 60_000
    status = next(s for s in jobs.run_once(T0_MS + 181 * 60_000).statuses if s.slo.name == "avail")  # type: ignore[union-attr]
    assert status.period.total == 36  # the rollups still hold the pruned minutes


def test_a_pool_takes_the_worst_level_one_instance_held_for_the_dwell_time(store: Store) -> None:
    """Default pool level: one instance of three at L2 for dwell_s puts the pool at L2 (a
    mean of the three free ratios would have hidden it)."""

    def tight(s: State, _: float) -> None:
        s["kv_usage"] = 0.96  # L2 (free 4 %)

    sink = ListTransitionSink()
    fleet = FleetTimeline(instances=3, seconds=600).add_fault(1, 300, tight)
    replay(store, fleet, sink, start_s=240)
    pool = [t for t in sink.transitions if t.scope == "pool"]
    assert [(t.from_level, t.to_level) for t in pool] == [(0, 2)]
    assert pool[0].evidence["worst_instance"] == fleet.instance(1)
    entered = (pool[0].ts_ms - T0_MS) / 1000
    assert 300 + 60 <= entered <= 300 + 60 + fleet.scrape_s


def test_a_spike_shorter_than_the_dwell_time_leaves_the_pool_alone(store: Store) -> None:
    def spike(s: State, since: float) -> None:
        if since < 30:
            s["kv_usage"] = 0.96

    sink = ListTransitionSink()
    fleet = FleetTimeline(instances=3, seconds=600).add_fault(1, 300, spike)
    replay(store, fleet, sink, start_s=240)
    assert [t for t in sink.transitions if t.scope == "instance"]
    assert not [t for t in sink.transitions if t.scope == "pool"]


def test_a_crashed_instance_is_unknown_not_its_last_level(store: Store) -> None:
    """At L2, the pod crashes (scrapes fail): its flag turns unknown (−1), never stays L2;
    back up, it takes the level its fresh data calls for."""

    def tight_then_crash(s: State, since: float) -> None:
        s["kv_usage"] = 0.96
        if 120 <= since < 240:
            s["up"], s["requests"] = False, 0
        elif since >= 240:
            s["up"], s["requests"] = True, 8
            s["kv_usage"] = 0.4  # the new process starts with an empty cache
            if s["process_start_s"] < 2e9:
                s["process_start_s"], s["resets_now"] = 2e9, 1

    fleet = FleetTimeline(instances=2, seconds=900).add_fault(0, 300, tight_then_crash)
    replay(store, fleet, StoreTransitionSink(store.con), start_s=240)
    rows = store.con.execute(
        "SELECT from_level, to_level, reason FROM flag_transitions "
        "WHERE scope = 'instance' ORDER BY ts_ms"
    ).fetchall()
    assert rows == [(0, 2, "kv_free_below_l2"), (2, -1, "target_down"), (-1, 0, "observed_again")]
    from slo.queries import current_flags

    at_down = T0_MS + (300 + 200) * 1000
    (row,) = current_flags(store.con, scope="instance", at_ms=at_down).to_pylist()
    assert (row["to_level"], row["reason"]) == (-1, "target_down")


def test_a_target_never_seen_up_gets_no_flag_at_all(store: Store) -> None:
    """A down dcgm exporter or an engine never scraped successfully had no level to lose."""
    sink = ListTransitionSink()
    fleet = FleetTimeline(instances=2, seconds=600).add_fault(1, 0, lambda s, _: s.update(up=False))
    replay(store, fleet, sink, start_s=240)
    assert [t for t in sink.transitions if t.scope == "instance"] == []


def test_a_pool_level_with_no_scrape_inside_the_dwell_holds_the_last_value() -> None:
    # The dwell (20 s) is shorter than the time since the last fresh scrape (25 s): the window
    # holds no sample. The instance has held its last value since then; the jobs' flag step
    # raised "zero-size array" on every cycle here, in a drill with a 20-s dwell.
    now = T0_MS + 600_000
    kv = Series(np.array([now - 60_000, now - 25_000]), np.array([0.5, 0.96]))
    snap = Snapshot(now_ms=now, engine={"pod-0": {"kv_usage": kv}})
    jobs = SloJobs(
        Store(":memory:").con,
        MODEL,
        JobsConfig(flags=FlagPolicy(dwell_s=20), pool_level="worst_held"),
    )
    assert jobs._pool_input(snap, "pod-0", free=1 - 0.96) == pytest.approx(0.04)


def test_a_pool_whose_every_instance_is_down_is_unknown_not_its_last_level(store: Store) -> None:
    """Both pods of the pool at L2 crash together: nothing observes the pool any more, so its
    flag turns unknown (−1) instead of telling gateways the pool is still at L2; back up, it
    takes the level its instances' fresh data calls for."""

    def tight_then_crash(s: State, since: float) -> None:
        s["kv_usage"] = 0.96
        if 120 <= since < 240:
            s["up"], s["requests"] = False, 0
        elif since >= 240:
            s["up"], s["requests"] = True, 8
            s["kv_usage"] = 0.4

    fleet = FleetTimeline(instances=2, seconds=900)
    for instance in range(2):
        fleet.add_fault(instance, 300, tight_then_crash)
    sink = ListTransitionSink()
    replay(store, fleet, sink, start_s=240)
    pool = [(t.from_level, t.to_level, t.reason) for t in sink.transitions if t.scope == "pool"]
    assert pool[:2] == [(0, 2, "kv_free_below_l2"), (2, -1, "no_instance_observed")]
    assert pool[2][:2] == (-1, 0)


def test_a_pod_that_left_the_fleet_is_forgotten_not_held_unknown_forever(store: Store) -> None:
    """A pod at L2 is deleted (its rows stop: no target, no samples). It turns unknown; once it
    has been unknown for ``forget_after_s`` and the data no longer names it, the jobs drop it:
    no level, no ``llmslo_degradation_level`` series, nothing for the alert pusher to map."""

    def tight(s: State, _: float) -> None:
        s["kv_usage"] = 0.96

    fleet = FleetTimeline(instances=2, seconds=1_800).add_fault(1, 0, tight)
    gone, gone_ms = fleet.instance(1), T0_MS + 300_000
    kept = [
        [row for row in rows if row.get("instance") != gone or row.get("ts_ms", 0) < gone_ms]
        for rows in fleet.all_rows()[1:]
    ]
    insert(store, engine=kept[0], gpu=kept[1], health=kept[2])
    config = JobsConfig(flags=FlagPolicy(dwell_s=60), forget_after_s=300)
    metrics = JobMetrics()
    jobs = SloJobs(store.con, MODEL, config, sink=ListTransitionSink(), metrics=metrics)
    seen: dict[int, int | None] = {}
    for t in range(240, fleet.seconds + 1, fleet.scrape_s):
        jobs.run_once(T0_MS + t * 1000)
        state = jobs.board.states.get(("instance", gone))
        seen[t] = None if state is None else state.level
        shown = metrics.registry.get_sample_value(
            "llmslo_degradation_level", {"scope": "instance", "scope_id": gone, "pool": ""}
        )
        assert shown == seen[t]

    def at(t: int) -> int | None:
        return seen[max(k for k in seen if k <= t)]

    assert at(299) == 2 and at(600) == -1  # L2, then unknown once its KV is stale
    assert at(fleet.seconds) is None  # forgotten: 600 s lookback + 300 s unknown later
