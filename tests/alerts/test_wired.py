"""Path B wired, without network: a jobs cycle → active alerts (labels, evidence, links) →
one ``alerts`` row per state change, read back with ``slo.queries.alerts``; restarts,
failed cycles and stable links. The real Alertmanager side is ``test_push_e2e.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.active import FlagLevel, active_alerts, deep_link
from alerts.config import AlertmanagerConfig
from alerts.pusher import AlertPusher, restore_state
from alerts.records import table_writer
from llmslo.cli import main
from pipeline.errors import QueryError
from pipeline.store import Store
from pipeline.units import DAY_MS, MINUTE_MS
from slo.jobs import SloJobs
from slo.queries import alerts as recorded_alerts
from slo.signals.detectors import Finding
from tests.alerts.faulted import (
    MODEL,
    POOL,
    firing_windows,
    requests_between,
    store_with_fault,
)
from tests.slo.factories import T0_MS, insert

# -- pure: what a cycle turns into ------------------------------------------------------


def test_flags_from_l2_and_page_or_ticket_findings_become_alerts_with_evidence_and_links() -> None:
    stall = Finding(1000, "stall", "instance", "10.0.0.1:8000", POOL, "page", "engine",
                    {"running": 3, "tokens_per_s": 0.0})  # fmt: skip
    info = Finding(1000, "hot_instance", "instance", "10.0.0.2:8000", POOL, "info", "requests", {})
    flags = [
        FlagLevel("instance", "10.0.0.1:8000", POOL, 3, 400_000),
        FlagLevel("pool", POOL, POOL, 2, 500_000),
        FlagLevel("instance", "10.0.0.3:8000", POOL, 1, 600_000),  # L1: no alert
    ]
    found = active_alerts(1_000_000, (), [stall, info], flags, dashboard_url="http://dash:8501/")
    by_name = {(a.labels["alertname"], a.labels.get("level", "")): a for a in found}
    assert sorted(by_name) == [
        ("LlmDegradationLevel", "L2"),
        ("LlmDegradationLevel", "L3"),
        ("LlmEngineStalled", ""),
    ]
    stalled = by_name[("LlmEngineStalled", "")]
    assert stalled.labels["instance"] == "10.0.0.1:8000"  # the stall inhibition's `equal`
    assert stalled.labels["origin"] == "llmslo"
    assert json.loads(stalled.annotations["evidence"]) == {"running": 3, "tokens_per_s": 0.0}
    assert "py-spy" in stalled.annotations["runbook"]
    assert stalled.generator_url == (
        "http://dash:8501/engines?pool=llama-3-8b&instance=10.0.0.1%3A8000&from=100000"
    )
    l3 = by_name[("LlmDegradationLevel", "L3")]
    assert (l3.labels["severity"], l3.since_s) == ("page", 400.0)
    assert l3.generator_url.startswith("http://dash:8501/flags?pool=llama-3-8b&instance=")
    assert by_name[("LlmDegradationLevel", "L2")].labels["severity"] == "ticket"


def test_deep_links_follow_the_dashboard_contract() -> None:
    assert deep_link("http://d", "slo", slo="chat-ttft", pool="p", from_ms=1, to_ms=2) == (
        "http://d/slo?slo=chat-ttft&pool=p&from=1&to=2"
    )
    assert deep_link(None, "slo", slo="x") == ""


def test_a_burning_slo_pair_carries_the_labels_of_its_generated_rule(tmp_path: Path) -> None:
    with store_with_fault(tmp_path / "db.duckdb") as store:
        result = SloJobs(store.con, MODEL).run_once(T0_MS + 10 * MINUTE_MS - 1)
    assert result is not None
    found = active_alerts(result.now_ms, result.statuses, dashboard_url="http://d")
    page = next(a for a in found if a.labels["window"] == "1h-5m")
    assert dict(page.labels) == {
        "alertname": "TtftBudgetBurn", "slo_id": "chat-ttft", "slo_service": "chat",
        "slo": "ttft", "severity": "page", "window": "1h-5m", "sli_kind": "latency",
        "team": "serving", "pool": POOL, "origin": "llmslo",
    }  # fmt: skip
    assert page.annotations["evidence"].startswith("burn rate 1h 17, 5m 1e+02 (threshold 14.4)")
    assert page.generator_url.startswith("http://d/slo?slo=chat-ttft&pool=llama-3-8b&from=")


# -- the alerts table and its read API ------------------------------------------------------


def test_every_state_change_is_one_row_and_queries_read_active_and_history(
    tmp_path: Path,
) -> None:
    with store_with_fault(tmp_path / "db.duckdb") as store:
        pusher = AlertPusher(AlertmanagerConfig(), table_writer(store.con))
        jobs = SloJobs(store.con, MODEL, on_cycle=pusher.on_cycle)
        jobs.run_once(T0_MS + 10 * MINUTE_MS - 1)
        jobs.run_once(T0_MS + 10 * MINUTE_MS - 1)  # still firing: no new rows
        assert firing_windows(pusher) == {("page", "1h-5m"), ("page", "6h-30m"), ("ticket", "1d-2h"), ("ticket", "3d-6h")}  # fmt: skip
        active = recorded_alerts(store.con)
        assert active.num_rows == 4
        assert recorded_alerts(store.con, severity="page").num_rows == 2
        insert(store, requests_between(T0_MS + 10 * MINUTE_MS, T0_MS + 45 * MINUTE_MS, 0.3))
        jobs.run_once(T0_MS + 45 * MINUTE_MS - 1)
        assert firing_windows(pusher) == {("ticket", "1d-2h"), ("ticket", "3d-6h")}
        history = recorded_alerts(store.con, start_ms=T0_MS, end_ms=T0_MS + DAY_MS)
        assert history.num_rows == 6
        resolved = [r for r in history.to_pylist() if r["state"] == "resolved"]
        assert sorted(json.loads(r["labels_json"])["window"] for r in resolved) == [
            "1h-5m",
            "6h-30m",
        ]
        assert all(r["ends_ts_ms"] == T0_MS + 45 * MINUTE_MS - 1 for r in resolved)
        assert {r["fingerprint"] for r in resolved} <= set(active.column("fingerprint").to_pylist())
        assert recorded_alerts(store.con).column("severity").to_pylist() == ["ticket", "ticket"]
        # as of the fault, the pages were active
        assert recorded_alerts(store.con, at_ms=T0_MS + 10 * MINUTE_MS).num_rows == 4


def test_a_restarted_pusher_resumes_without_new_rows_and_resolves_what_cleared(
    tmp_path: Path,
) -> None:
    with store_with_fault(tmp_path / "db.duckdb") as store:
        first = AlertPusher(AlertmanagerConfig(), table_writer(store.con))
        SloJobs(store.con, MODEL, on_cycle=first.on_cycle).run_once(T0_MS + 10 * MINUTE_MS - 1)
        insert(store, requests_between(T0_MS + 10 * MINUTE_MS, T0_MS + 45 * MINUTE_MS, 0.3))
        again = AlertPusher(
            AlertmanagerConfig(),
            table_writer(store.con),
            state=restore_state(recorded_alerts(store.con)),
        )
        changes = again.push(
            T0_MS + 45 * MINUTE_MS - 1,
            SloJobs(store.con, MODEL).run_once(T0_MS + 45 * MINUTE_MS - 1),  # type: ignore[arg-type]
        )
    assert sorted((c.state, c.alert.labels["window"]) for c in changes) == [
        ("resolved", "1h-5m"),
        ("resolved", "6h-30m"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"start_ms": 1}, "end_ms"),
        ({"at_ms": 5, "start_ms": 1, "end_ms": 2}, "at_ms"),
        ({"state": "firing"}, "state"),
        ({"start_ms": 1, "end_ms": 2, "state": "pending"}, "state"),
        ({"severity": ""}, "severity"),
    ],
    ids=[
        "half a range",
        "at and a range",
        "state without a range",
        "unknown state",
        "empty severity",
    ],
)
def test_bad_alert_query_parameters_name_the_parameter(
    tmp_path: Path, kwargs: dict[str, Any], parameter: str
) -> None:
    with Store(tmp_path / "db.duckdb") as store, pytest.raises(QueryError) as caught:
        recorded_alerts(store.con, **kwargs)
    assert caught.value.parameter == parameter


def test_a_bad_alertmanager_section_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "llmslo.yaml"
    config.write_text(yaml.safe_dump({"alertmanager": {"url": "not a url", "resend_s": 0}}))
    assert main(["config", "validate", str(config)]) == 2
    error = capsys.readouterr().err
    assert "alertmanager.url" in error and "alertmanager.resend_s" in error


def test_a_firing_alerts_link_stays_the_same_so_it_is_not_resent_every_cycle(
    tmp_path: Path,
) -> None:
    wall = [1_000_000.0]
    with store_with_fault(tmp_path / "db.duckdb") as store:
        sent: list[list[dict[str, Any]]] = []
        pusher = AlertPusher(
            AlertmanagerConfig(dashboard_url="http://d", resend_s=60),
            table_writer(store.con),
            client=_Recorder(sent),  # type: ignore[arg-type]
            background=False,
            clock=lambda: wall[0],
        )
        jobs = SloJobs(store.con, MODEL, on_cycle=pusher.on_cycle)
        jobs.run_once(T0_MS + 10 * MINUTE_MS - 5_000)
        wall[0] += 15
        jobs.run_once(T0_MS + 10 * MINUTE_MS - 1)  # 5 s later in event time, same minute
    assert [len(batch) for batch in sent] == [4]
    assert all(
        p["generatorURL"].endswith(f"from={T0_MS + 10 * MINUTE_MS - 5_000 - 15 * MINUTE_MS}")
        for p in sent[0]
    )


class _Recorder:
    """An in-memory stand-in for AlertmanagerClient (submit/flush/close)."""

    def __init__(self, sent: list[list[dict[str, Any]]]) -> None:
        self.sent = sent

    def submit(self, payloads: list[dict[str, Any]]) -> None:
        self.sent.append(payloads)

    def flush(self) -> bool:
        return True

    def close(self) -> None:
        pass


def test_a_cycle_whose_evaluation_failed_resolves_nothing(tmp_path: Path) -> None:
    with store_with_fault(tmp_path / "db.duckdb") as store:
        pusher = AlertPusher(AlertmanagerConfig(), table_writer(store.con))
        result = SloJobs(store.con, MODEL).run_once(T0_MS + 10 * MINUTE_MS - 1)
        assert result is not None
        assert len(pusher.on_cycle(result)) == 4
        broken = SloJobs(store.con, MODEL).run_once(T0_MS + 10 * MINUTE_MS - 1)
        assert broken is not None
        broken.statuses, broken.errors = [], ["evaluate: IO Error: disk full"]
        assert pusher.on_cycle(broken) == []
        assert len(pusher.state.firing) == 4
        assert recorded_alerts(store.con).num_rows == 4
