"""The signal catalog is the one declaration of a signal: detectors emit only its rows, and
the rule file, the pushed alerts, the dashboards and the drills name an event as it does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from alerts.active import RUNBOOKS, SIGNAL_ALERTS, FlagLevel, active_alerts
from alerts.generate import generate_rules
from alerts.load import load_rule_model
from alerts.signatures import signature_groups
from dashboards.views import PAGES
from llmslo.drill.modes import MODES, expected_signals
from pipeline.store import Store
from slo.naming import alert_name
from slo.signals.catalog import FLAG, NOTICES, SIGNALS, Signal, detectors_of, signal
from slo.signals.config import DetectorConfig
from slo.signals.detectors import DETECTORS
from slo.signals.findings import Finding
from slo.signals.snapshot import Snapshot
from slo.signals.xid import XID_CLASSES, XID_CODES, classify_xid
from tests.slo.fleet import FleetTimeline, State
from tests.slo.signals.test_detectors import CASES, run

SPEC = "tests/alerts/specs/engines.yaml"


def _signature_rules(base: str = "docs/runbooks") -> list[dict[str, Any]]:
    (_, alerts) = signature_groups(base)
    return list(alerts["rules"])


def _rule_triples() -> set[tuple[str, str, str]]:
    """(alert name, signal label, severity) of every generated signature rule."""
    return {
        (r["alert"], r["labels"]["signal"], r["labels"]["severity"]) for r in _signature_rules()
    }


@pytest.mark.parametrize(("fault", "emits"), [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_what_a_detector_emits_is_a_catalog_row_and_pushes_like_its_rule(
    store: Store, fault: Callable[[State, float], None], emits: str
) -> None:
    findings = run(store, FleetTimeline(instances=4, seconds=900).add_fault(1, 300, fault))
    assert emits in {f.signal for f in findings}
    for f in findings:
        row = SIGNALS.get(f.signal)
        assert row is not None, f"{f.signal} is emitted but has no catalog row"
        assert f.scope == "pool" or row.scope in ("instance", "entry")
    rules = _rule_triples()
    ruled = {s for _, s, _ in rules}
    pushed = active_alerts(0, findings=findings, include_info=True)
    for alert in pushed:
        labels = alert.labels
        if labels["signal"] in ruled:
            triple = (labels["alertname"], labels["signal"], labels["severity"])
            assert triple in rules, f"pushed {triple}, rules say {sorted(rules)}"


def test_an_engine_restart_is_one_alert_on_both_paths(store: Store) -> None:
    crash = next(c[1] for c in CASES if c[2] == "crash")
    findings = run(store, FleetTimeline(instances=4, seconds=900).add_fault(1, 300, crash))
    (pushed,) = [a for a in active_alerts(0, findings=findings) if a.labels["signal"] == "crash"]
    (rule,) = [r for r in _signature_rules() if r["labels"]["signal"] == "crash"]
    assert pushed.labels["alertname"] == rule["alert"] == "LlmCrash"
    assert pushed.labels["severity"] == rule["labels"]["severity"] == "ticket"
    assert pushed.annotations["runbook_url"] == rule["annotations"]["runbook_url"]


@pytest.mark.parametrize("code", [*sorted(XID_CODES), 999], ids=lambda c: f"XID {c}")
def test_each_xid_code_has_one_rule_with_its_class_and_severity(code: int) -> None:
    row = classify_xid(code)
    hits = [
        r
        for r in _signature_rules()
        if r["labels"]["signal"].startswith("xid_")
        and r["labels"]["signal"] != "xid_other"
        and f"== {code}\n" in r["expr"]
    ]
    if code in XID_CODES:
        (rule,) = hits
        assert rule["labels"]["severity"] == row.severity
    else:  # unknown codes fire the xid_other rule, whose expression excludes the known ones
        (rule,) = [r for r in _signature_rules() if r["labels"]["signal"] == "xid_other"]
        assert rule["labels"]["severity"] == XID_CLASSES["other"].severity
    xid_class = XID_CLASSES[row.xid_class]
    assert rule["labels"]["signal"] == xid_class.signal
    assert rule["alert"] == SIGNALS[xid_class.signal].alert


def test_every_rule_names_a_catalog_signal_with_its_alert_severity_and_runbook() -> None:
    flag = NOTICES[FLAG]
    for rule in _signature_rules("https://runbooks.example/llm"):
        labels, url = rule["labels"], rule["annotations"]["runbook_url"]
        if labels["signal"] == flag.signal:
            assert rule["alert"] == flag.alert
            assert labels["severity"] == flag.severities[labels["level"]]
            assert url == f"https://runbooks.example/llm/{flag.runbook}.md"
            continue
        row = signal(labels["signal"])
        assert rule["alert"] == row.alert
        if not row.name.startswith("xid_"):  # XID rules take the code's severity (above)
            assert labels["severity"] == row.severity
        assert url == f"https://runbooks.example/llm/{row.name}.md"


def test_slo_burn_rules_and_pushes_link_their_sli_kinds_runbook() -> None:
    rules = generate_rules(load_rule_model(SPEC), signatures=False, runbook_base_url="/rb")
    urls = {
        r["labels"]["sli_kind"]: r["annotations"]["runbook_url"]
        for g in rules["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert urls and all(url == f"/rb/slo-{kind}.md" for kind, url in urls.items())


def test_pushed_findings_and_flags_carry_the_configured_runbook_url() -> None:
    finding = Finding(0, "stall", "instance", "pod-0:8000", "llama", "page", "b", {})
    flags = [FlagLevel("instance", "pod-0:8000", "llama", 3, 0)]
    alerts = active_alerts(0, findings=[finding], flags=flags, runbook_base_url="https://rb/")
    by_name = {a.labels["alertname"]: a for a in alerts}
    assert by_name["LlmEngineStalled"].annotations["runbook_url"] == "https://rb/stall.md"
    level = by_name["LlmDegradationLevel"]
    assert level.annotations["runbook_url"] == "https://rb/degradation-level.md"
    assert level.labels["severity"] == "page"
    assert level.annotations["runbook"] == RUNBOOKS["flag:L3"]


def test_pushes_pages_drills_and_detectors_name_only_catalog_rows() -> None:
    assert set(SIGNAL_ALERTS) == set(SIGNALS)
    assert {row.page for row in SIGNALS.values()} | {n.page for n in NOTICES.values()} <= set(PAGES)
    for mode in MODES.values():
        assert mode.expected, f"drill mode {mode.name} expects nothing"
        assert mode.expected <= set(SIGNALS) | {FLAG}
    drilled = {m for row in SIGNALS.values() for m in row.drills} | set(NOTICES[FLAG].drills)
    assert drilled <= set(MODES), f"catalog drills {sorted(drilled - set(MODES))} do not exist"
    assert set(DETECTORS) == {row.detector_key for row in SIGNALS.values()}


def test_signals_that_compare_an_instance_with_its_pool_are_not_rolled_up() -> None:
    unpooled = {name for name, row in SIGNALS.items() if not row.pooled}
    assert unpooled == {"hot_instance", "slow_prefill", "slow_decode", "itl_jitter"}


@pytest.mark.parametrize(
    ("parts", "name"),
    [
        (("llm", "ghost_requests"), "LlmGhostRequests"),
        (("llm", "engine_stalled"), "LlmEngineStalled"),
        (("ttft-p99", "budget_burn"), "TtftP99BudgetBurn"),
        (("fleet.itl_vllm-legacy", "budget_burn"), "FleetItlVllmLegacyBudgetBurn"),
        (
            ("myService", "requests-availability", "slo_burn"),
            "MyServiceRequestsAvailabilitySloBurn",
        ),
    ],
    ids=["a signal", "a stem", "an SLO spec", "dots and underscores", "a Sloth SLO"],
)
def test_one_alert_name_builder_for_signals_and_slos(parts: tuple[str, ...], name: str) -> None:
    assert alert_name(*parts) == name


def _detect_toy(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """A toy signal: any instance of the snapshot's pools."""
    return [
        Finding.on_instance(snap, "toy_overheat", instance, "ticket", "toy", {"n": 1})
        for instance in sorted(snap.pools)
    ]


def test_a_new_signal_is_a_detector_and_one_catalog_row() -> None:
    """Walkthrough: the toy signal touches its detector and its row, nothing else in code;
    its runbook file (docs/runbooks/toy_overheat.md) is the third place."""
    row = Signal(
        "toy_overheat", "instance", _detect_toy, "ticket", "gpus", "cool it", drills=("stall",)
    )
    rows = {**SIGNALS, row.name: row}
    detectors = detectors_of(rows)
    assert list(detectors)[-1] == "toy_overheat"

    snap = Snapshot(0)
    snap.pools.update({"pod-0:8000": "llama", "pod-1:8000": "llama"})
    cfg = DetectorConfig()
    findings = detectors["toy_overheat"](snap, cfg)
    assert [f.scope_id for f in findings] == ["pod-0:8000", "pod-1:8000"]

    pushed = active_alerts(0, findings=findings, runbook_base_url="rb")
    assert {a.labels["alertname"] for a in pushed} == {row.alert} == {"LlmToyOverheat"}
    assert {a.annotations["runbook_url"] for a in pushed} == {"rb/toy_overheat.md"}
    drills = {name for name, r in rows.items() if "stall" in r.drills}
    assert drills == expected_signals("stall") | {"toy_overheat"}
