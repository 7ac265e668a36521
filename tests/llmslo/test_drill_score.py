"""Drill scoring rules on hand-made stored rows: what counts as detected, cleared, false positive."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.tap.config import TapConfig
from llmslo.drill.fleet import FleetPlan
from llmslo.drill.fronts import drill_fleet_config
from llmslo.drill.matrix import DrillProfile, plan_fleets, select_modes
from llmslo.drill.modes import FAST_HOLD_S, FLAG, MODES, DrillMode, matches
from llmslo.drill.score import (
    SCRAPE_STAMP_GRACE_MS,
    AlertRow,
    FindingRow,
    FlagRow,
    ModeResult,
    alert_false_positives,
    false_positives,
    score_alerts,
    score_mode,
)
from pipeline.errors import ConfigError
from simulator.config import GatewayConfig
from simulator.faults import validate_fault
from simulator.frontends import validate_front_end_fault
from simulator.gateway import GATEWAY_FAULTS
from simulator.load import LoadConfig

POD, OTHER = "127.0.0.1:9001", "127.0.0.1:9002"
T0 = 1_000_000  # injection, ms
T1 = T0 + 60_000  # removal
END = T1 + 50_000


def _result(mode: str = "stall") -> ModeResult:
    return ModeResult(mode, "fleet0", POD, mode, T0, T1)


def test_the_first_expected_finding_after_injection_detects_and_its_resolution_clears() -> None:
    rows = [
        FindingRow(T0 - 5_000, "firing", "stall", "instance", OTHER),
        FindingRow(T0 + 24_000, "firing", "stall", "instance", POD),
        FindingRow(T0 + 30_000, "firing", "queue_growth", "instance", POD),
        FindingRow(T1 + 7_000, "resolved", "stall", "instance", POD),
    ]
    result = score_mode(_result(), MODES["stall"], rows, [], END)
    assert result.detected and result.detected_by == ["stall"]
    assert result.detect_s == result.first_finding_s == 24.0
    assert result.clear_s == 7.0
    assert result.other_signals == ["queue_growth"]


def test_a_scrape_stamped_just_before_injection_can_show_the_fault() -> None:
    # The NaN burst of the last matrix: the finding's data-clock time was 0.1 s before the
    # injection's wall time (the scrape is stamped at its start, rendered after the fault).
    just_before = FindingRow(T0 - 100, "firing", "numeric_anomaly", "instance", POD)
    result = score_mode(_result("nan_burst"), MODES["nan_burst"], [just_before], [], END)
    assert result.detected and result.detect_s == 0.0
    assert false_positives("f", [just_before], [], {POD: (T0, MODES["nan_burst"])}) == []
    too_early = just_before._replace(ts_ms=T0 - SCRAPE_STAMP_GRACE_MS - 1)
    assert not score_mode(_result("nan_burst"), MODES["nan_burst"], [too_early], [], END).detected
    assert len(false_positives("f", [too_early], [], {POD: (T0, MODES["nan_burst"])})) == 1


def test_a_finding_raised_after_injection_is_the_faults_though_its_data_is_older() -> None:
    # The NaN burst of a 9-pod fleet: requests in flight when the fault hit are stored with
    # the time they were received; the cycle that raised numeric_anomaly ran 1.5 s after the
    # injection at an event time 0.6 s before it. Scored by event time, that was a false
    # positive and a missed mode.
    in_flight = FindingRow(T0 - 600, "firing", "numeric_anomaly", "instance", POD, T0 + 1_500)
    result = score_mode(_result("nan_burst"), MODES["nan_burst"], [in_flight], [], END)
    assert result.detected and result.detect_s == 0.0
    faulted = {POD: (T0, MODES["nan_burst"])}
    assert false_positives("f", [in_flight], [], faulted) == []
    flag = FlagRow(T0 - 600, "instance", POD, 0, 1, T0 + 1_500)
    assert false_positives("f", [], [flag], faulted) == []


def test_a_finding_raised_before_injection_is_a_false_positive_whatever_its_event_time() -> None:
    # A cycle that ended before the fault cannot have seen it, even inside the stamp grace.
    early = FindingRow(T0 - 100, "firing", "numeric_anomaly", "instance", POD, T0 - 50)
    result = score_mode(_result("nan_burst"), MODES["nan_burst"], [early], [], END)
    assert not result.detected
    faulted = {POD: (T0, MODES["nan_burst"])}
    assert [p.name for p in false_positives("f", [early], [], faulted)] == ["numeric_anomaly"]
    flag = FlagRow(T0 - 100, "instance", POD, 0, 1, T0 - 50)
    assert [p.name for p in false_positives("f", [], [flag], faulted)] == ["L1"]


def test_stored_findings_and_flags_carry_the_wall_time_of_the_cycle_that_raised_them(
    tmp_path: Path,
) -> None:
    from llmslo.drill.rows import read_rows
    from pipeline.store import Store
    from slo.sinks import create_output_tables

    with Store(tmp_path / "drill.duckdb") as store:
        con = store.con
        create_output_tables(con)
        con.execute(
            "INSERT INTO jobs_heartbeats (ts_ms, event_ts_ms, jobs_id, interval_s, errors) "
            "VALUES (?, ?, 'j', 2.0, 0), (?, ?, 'j', 2.0, 0)",
            [T0 + 1_500, T0 - 600, T0 + 3_500, T0 - 600],  # two cycles saw no newer data
        )
        con.execute(
            "INSERT INTO slo_findings (ts_ms, state, signal, scope, scope_id) VALUES "
            "(?, 'firing', 'numeric_anomaly', 'instance', ?), "
            "(?, 'firing', 'stall', 'instance', ?)",
            [T0 - 600, POD, T0 + 9_000, POD],  # the second cycle's heartbeat was not stored
        )
        con.execute(
            "INSERT INTO flag_transitions (ts_ms, scope, scope_id, from_level, to_level, reason) "
            "VALUES (?, 'instance', ?, 0, 1, 'kv')",
            [T0 - 600, POD],
        )
        findings, flags = read_rows(con)
    assert [(f.signal, f.ts_ms, f.raised_ts_ms) for f in findings] == [
        ("numeric_anomaly", T0 - 600, T0 + 1_500),  # the first cycle of that event time
        ("stall", T0 + 9_000, None),
    ]
    assert [(r.to_level, r.raised_ts_ms) for r in flags] == [(1, T0 + 1_500)]


def test_a_finding_still_firing_at_the_end_is_not_cleared() -> None:
    rows = [FindingRow(T0 + 24_000, "firing", "stall", "instance", POD)]
    assert score_mode(_result(), MODES["stall"], rows, [], END).clear_s is None


def test_an_unexpected_signal_or_another_pod_does_not_detect() -> None:
    rows = [
        FindingRow(T0 + 10_000, "firing", "queue_growth", "instance", POD),
        FindingRow(T0 + 10_000, "firing", "stall", "instance", OTHER),
        FindingRow(T0 - 1_000, "firing", "stall", "instance", POD),  # before injection
    ]
    result = score_mode(_result(), MODES["stall"], rows, [], END)
    assert not result.detected and result.detect_s is None and result.detected_by == []


def test_flag_levels_count_for_the_kv_leak_with_time_to_each_level() -> None:
    flags = [
        FlagRow(T0 + 20_000, "instance", POD, 0, 1),
        FlagRow(T0 + 26_000, "instance", POD, 1, 2),
        FlagRow(T0 + 26_000, "pool", "llama", 0, 1),
        FlagRow(T0 + 31_000, "instance", POD, 2, 3),
        FlagRow(T1 + 25_000, "instance", POD, 3, 0),
    ]
    result = score_mode(_result("kv_leak"), MODES["kv_leak"], [], flags, END)
    assert result.detected and result.first_flag_s == 20.0
    assert result.flag_level_s == {1: 20.0, 2: 26.0, 3: 31.0}
    assert result.detected_by == ["flag L1", "flag L2", "flag L3"]
    assert result.clear_s == 25.0


def test_a_flag_does_not_detect_a_mode_whose_expectation_has_no_flag() -> None:
    flags = [FlagRow(T0 + 20_000, "instance", POD, 0, 1)]
    result = score_mode(_result(), MODES["stall"], [], flags, END)
    assert not result.detected and result.other_signals == ["flag"]


def test_xid_classes_match_by_prefix() -> None:
    assert matches(frozenset({"xid_*"}), "xid_fallen_off_bus")
    assert not matches(frozenset({"xid_*"}), "oom_risk")
    assert FLAG in MODES["kv_leak"].expected


def test_false_positives_are_healthy_pods_pre_injection_and_unexplained_pool_findings() -> None:
    stall = MODES["stall"]
    rows = [
        FindingRow(T0 + 1_000, "firing", "stall", "instance", POD),  # the fault's doing
        FindingRow(T0 - 1_000, "firing", "queue_growth", "instance", POD),  # before injection
        FindingRow(T0 + 1_000, "firing", "hot_instance", "instance", OTHER),  # healthy pod
        FindingRow(T0 + 2_000, "resolved", "hot_instance", "instance", OTHER),
        FindingRow(T0 + 3_000, "firing", "stall", "pool", "llama"),
    ]
    flags = [FlagRow(T0 + 4_000, "instance", OTHER, 0, 1), FlagRow(T0, "instance", OTHER, -1, 0)]
    fps = false_positives("fleet0", rows, flags, {POD: (T0, stall)})
    assert [(p.kind, p.name, p.scope_id) for p in fps] == [
        ("finding", "queue_growth", POD),
        ("finding", "hot_instance", OTHER),
        ("finding", "stall", "llama"),
        ("flag", "L1", OTHER),
    ]
    pool_mode = DrillMode(
        "retry_storm", "prefill_failure", frozenset({"retry_storm"}), pool_scoped=True
    )
    assert len(false_positives("f", rows[-1:], [], {POD: (T0, pool_mode)})) == 0


def test_in_a_front_end_fleet_pool_findings_after_injection_are_the_faults_doing() -> None:
    lag = MODES["autoscaler_lag"]
    rows = [
        FindingRow(T0 - 1_000, "firing", "retry_storm", "pool", "llama"),  # before: unexplained
        FindingRow(T0 + 9_000, "firing", "retry_storm", "pool", "llama"),  # the tap retrying 429s
        FindingRow(T0 + 9_000, "firing", "hot_instance", "instance", OTHER),  # a pod behind it
    ]
    fps = false_positives("f", rows, [], {POD: (T0, lag)}, pool_faulted_ms=T0)
    assert [(p.name, p.scope_id, p.ts_ms) for p in fps] == [
        ("retry_storm", "llama", T0 - 1_000),
        ("hot_instance", OTHER, T0 + 9_000),
    ]


def test_modes_that_change_load_or_taps_get_their_own_fleet() -> None:
    plan = plan_fleets(list(MODES.values()), per_fleet=5)
    shared = [fleet for fleet in plan if len(fleet) > 1]
    assert all(len(fleet) <= 5 for fleet in plan)
    assert {m.name for fleet in plan for m in fleet} == set(MODES)
    assert all(not m.own_fleet for fleet in shared for m in fleet)


def test_no_shared_fleet_carries_a_fault_that_leaks_to_the_other_pods() -> None:
    """What leaks is fleet-wide: the fleet's load shape, its taps' options, a fault on every
    pod, a gateway or front end in the entry path. Extra load on one pod enters through that
    pod's own tap only, so hot instance and ghosts share (last, in the last shared fleet)."""
    plan = plan_fleets(list(MODES.values()), per_fleet=7)
    names = [[m.name for m in fleet] for fleet in plan]
    assert sorted(n for fleet in names for n in fleet) == sorted(MODES)
    for fleet in plan:
        if len(fleet) > 1:
            for m in fleet:
                assert not (m.load or m.tap or m.pool_scoped or m.needs_gateway or m.front_end)
    assert names[2] == ["model_load_failure", "ghost", "hot_instance"]
    assert len(plan) == 12  # 26 modes; 14 fleets before extra load could share


def test_fast_modes_hold_their_fault_shorter_and_their_fleet_ends_sooner() -> None:
    profile = DrillProfile()
    fast = {n for n, m in MODES.items() if m.hold(profile.hold_s) != profile.hold_s}
    assert fast == {
        "retry_storm",
        "gateway_down",
        "router_down",
        "router_down_llm_d",
        "router_down_dynamo",
        "gateway_down_dynamo",
        "kv_transfer_timeout",
        "stale_kv_index",
    }
    assert all(MODES[n].hold(profile.hold_s) == FAST_HOLD_S for n in fast)
    config = drill_fleet_config("f", 3, 0, 256)
    plan = FleetPlan("f", (MODES["router_down"], MODES["stall"]), config, (31.0, 40.0), 4.5, 1.5)
    assert plan.end_s(profile) == 40.0 + profile.hold_s + profile.clear_s
    alone = FleetPlan("f", (MODES["router_down"],), config, (31.0,), 4.5, 1.5)
    assert alone.end_s(profile) == 31.0 + FAST_HOLD_S + profile.clear_s
    short = DrillProfile(hold_s=20.0)  # a profile compressed below a mode's hold wins
    assert MODES["router_down"].hold(short.hold_s) == 20.0


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown \\['nope'\\]"):
        select_modes("stall,nope")
    assert [m.name for m in select_modes("stall, kv_leak")] == ["stall", "kv_leak"]


@pytest.mark.parametrize("mode", list(MODES.values()), ids=lambda m: m.name)
def test_every_modes_fault_load_and_tap_options_are_valid(mode: DrillMode) -> None:
    if mode.on_gateway:  # set on the fleet's gateway, not on a pod
        assert mode.fault in GATEWAY_FAULTS and not mode.params
    elif mode.fault is not None and mode.front_end is not None:
        validate_front_end_fault(mode.fault, dict(mode.params))
    elif mode.fault is not None:
        validate_fault(mode.fault, dict(mode.params))
    GatewayConfig.model_validate(mode.gateway)
    LoadConfig.model_validate({"targets": ["http://127.0.0.1:1"], **mode.load})
    LoadConfig.model_validate({"targets": ["http://127.0.0.1:1"], **mode.extra_load})
    assert mode.extra_rate_per_s or not mode.extra_load  # options of an extra load that runs
    TapConfig.model_validate({"upstreams": ["http://127.0.0.1:1"], **mode.tap})


def test_the_modes_in_front_of_the_taps_get_a_gateway_fleet_each_and_router_down_fails_closed() -> (
    None
):
    gateway_down, router_down = MODES["gateway_down"], MODES["router_down"]
    assert gateway_down.on_gateway and router_down.on_gateway
    assert gateway_down.expected == {"entry_unavailable"}
    assert router_down.expected == {"router_unavailable", "entry_unavailable"}
    assert router_down.gateway == {"router_down_policy": "fail_close"}
    plan = plan_fleets([MODES["stall"], gateway_down, router_down], per_fleet=5)
    assert [[m.name for m in fleet] for fleet in plan] == [
        ["stall"],
        ["gateway_down"],
        ["router_down"],
    ]
    assert not MODES["stall"].on_gateway


def test_a_gateway_mode_is_scored_on_the_gateway_and_pods_stay_healthy() -> None:
    gateway = "127.0.0.1:9100"
    result = ModeResult("router_down", "fleet0", gateway, "router_down", T0, T1)
    rows = [
        FindingRow(T0 + 3_000, "firing", "router_unavailable", "instance", gateway),
        FindingRow(T0 + 5_000, "firing", "entry_unavailable", "instance", gateway),
        FindingRow(T0 + 5_000, "firing", "target_down", "instance", POD),
        FindingRow(T1 + 9_000, "resolved", "router_unavailable", "instance", gateway),
        FindingRow(T1 + 11_000, "resolved", "entry_unavailable", "instance", gateway),
    ]
    scored = score_mode(result, MODES["router_down"], rows, [], END)
    assert scored.detected and scored.detect_s == 3.0 and scored.clear_s == 11.0
    assert scored.detected_by == ["entry_unavailable", "router_unavailable"]
    (fp,) = false_positives("fleet0", rows, [], {gateway: (T0, MODES["router_down"])})
    assert (fp.name, fp.scope_id) == ("target_down", POD)


def test_the_first_alert_received_about_the_instance_after_injection_times_the_alert() -> None:
    alerts = [
        AlertRow(T0 - 2_000, "LlmEngineStalled", POD, "pool", False, "stall"),  # before
        AlertRow(T0 + 9_000, "LlmEngineStalled", OTHER, "pool", False, "stall"),  # another pod
        AlertRow(T0 + 12_000, "InferenceAvailability", None, "pool", True),  # the pool's SLO
        AlertRow(T0 + 15_000, "LlmQueueGrowth", POD, "pool", False, "queue_growth"),
        AlertRow(T0 + 23_500, "LlmEngineStalled", POD, "pool", False, "stall"),
        AlertRow(T0 + 31_000, "LlmDegradationLevel", POD, "pool", False, "degradation"),
        AlertRow(END + 1_000, "LlmCrash", POD, "pool", False, "crash"),  # after the run
    ]
    result = score_alerts(_result(), MODES["stall"], alerts, END)
    # The queue grew first, but the stall's own alert is what times the detection.
    assert result.first_alert_s == 23.5
    assert result.alerted_by == ["LlmDegradationLevel", "LlmEngineStalled", "LlmQueueGrowth"]
    assert score_alerts(_result(), MODES["stall"], alerts[:4], END).first_alert_s is None
    leak = ModeResult("kv_leak", "fleet0", POD, "kv_leak", T0, T1)
    assert score_alerts(leak, MODES["kv_leak"], alerts, END).first_alert_s == 31.0  # the flag
    pooled = ModeResult("retry_storm", "fleet0", POD, "prefill_failure", T0, T1)
    storm = [*alerts, AlertRow(T0 + 14_000, "LlmRetryStorm", None, "pool", False, "retry_storm")]
    assert score_alerts(pooled, MODES["retry_storm"], storm, END).first_alert_s == 14.0


def test_alerts_nothing_explains_are_false_positives() -> None:
    faulted = {POD: (T0, MODES["stall"])}
    alerts = [
        AlertRow(T0 + 5_000, "LlmEngineStalled", POD, "pool", False),  # the fault's
        AlertRow(T0 - 5_000, "LlmSlowPrefill", POD, "pool", False),  # before injection
        AlertRow(T0 + 5_000, "LlmSlowPrefill", OTHER, "pool", False),  # a healthy pod
        AlertRow(T0 + 8_000, "InferenceAvailability", None, "pool", True),  # burnt by the fault
        AlertRow(T0 - 8_000, "InferenceTtftP99", None, "pool", True),  # before any fault
        AlertRow(T0 + 8_000, "LlmRetryStorm", None, "pool", False),  # a signal on the pool
        AlertRow(T0 + 9_000, "LlmDegradationLevel", None, "pool", False, "degradation"),
    ]
    found = alert_false_positives("fleet0", alerts, faulted)
    assert [(p.kind, p.name, p.scope_id) for p in found] == [
        ("alert", "InferenceTtftP99", "pool"),
        ("alert", "LlmSlowPrefill", POD),
        ("alert", "LlmSlowPrefill", OTHER),
        ("alert", "LlmRetryStorm", "pool"),
    ]
    # The healthy control: every alert counts.
    assert len(alert_false_positives("healthy", alerts, {})) == len(alerts)


def test_alerts_received_in_one_post_score_whatever_their_labels() -> None:
    """One POST carries a pool's SLO alerts and an instance's alert with the same name and
    receipt time (a real drill crashed on sorting them)."""
    alerts = [
        AlertRow(T0 + 4_000, "LlmX", None, "pool", True),
        AlertRow(T0 + 4_000, "LlmX", POD, None, False, "stall"),
    ]
    assert score_alerts(_result(), MODES["stall"], alerts, END).first_alert_s == 4.0
    assert [p.scope_id for p in alert_false_positives("healthy", alerts, {})] == [POD, "pool"]
