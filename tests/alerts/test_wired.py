"""Path B wired: the SLO jobs' cycles become alerts in a real Alertmanager and rows of the
``alerts`` table (read back with ``slo.queries.alerts`` and ``llmslo alerts``).

The fault is a real burst of slow requests in a real DuckDB file, evaluated by the real jobs
at event times (one request every 10 s): 2 h healthy, 10 min with TTFT 5 s (every window
pair of the 30-day catalog burns), then healthy again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from alerts.active import FlagLevel, active_alerts, deep_link
from alerts.config import AlertmanagerConfig
from alerts.pusher import AlertPusher, restore_state
from alerts.records import fingerprint, table_writer
from app.cli import main
from pipeline.bus import Bus
from pipeline.errors import QueryError
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from slo.detectors import Finding
from slo.jobs import SloJobs
from slo.model import build_model
from slo.queries import alerts as recorded_alerts
from slo.spec import parse_spec
from tests.alerts.conftest import Alertmanager, eventually
from tests.conftest import require_tool
from tests.slo.factories import T0_MS, insert, request, to_table
from tests.slo.fleet import FleetTimeline, State

MINUTE = 60_000
SPEC = {
    "version": "llmslo/v1",
    "service": "chat",
    "labels": {"team": "serving"},
    "slos": [
        {
            "name": "ttft",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0, "source": "tap"},
            "group_by": ["pool"],
        }
    ],
}
MODEL = build_model(parse_spec(SPEC))
POOL = "llama-3-8b"


def _requests(start_ms: int, end_ms: int, ttft_s: float) -> list[dict[str, Any]]:
    return [request(ts, ttft_s=ttft_s) for ts in range(start_ms, end_ms, 10_000)]


def _store_with_fault(path: Path) -> Store:
    store = Store(path)
    insert(
        store,
        _requests(T0_MS - 120 * MINUTE, T0_MS, 0.3) + _requests(T0_MS, T0_MS + 10 * MINUTE, 5.0),
    )
    return store


def _firing(pusher: AlertPusher) -> set[tuple[str, str]]:
    return {(a.labels["severity"], a.labels["window"]) for a in pusher.state.firing}


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
    with _store_with_fault(tmp_path / "db.duckdb") as store:
        result = SloJobs(store.con, MODEL).run_once(T0_MS + 10 * MINUTE - 1)
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
    with _store_with_fault(tmp_path / "db.duckdb") as store:
        pusher = AlertPusher(AlertmanagerConfig(), table_writer(store.con))
        jobs = SloJobs(store.con, MODEL, on_cycle=pusher.on_cycle)
        jobs.run_once(T0_MS + 10 * MINUTE - 1)
        jobs.run_once(T0_MS + 10 * MINUTE - 1)  # still firing: no new rows
        assert _firing(pusher) == {("page", "1h-5m"), ("page", "6h-30m"), ("ticket", "1d-2h"), ("ticket", "3d-6h")}  # fmt: skip
        active = recorded_alerts(store.con)
        assert active.num_rows == 4
        assert recorded_alerts(store.con, severity="page").num_rows == 2
        insert(store, _requests(T0_MS + 10 * MINUTE, T0_MS + 45 * MINUTE, 0.3))
        jobs.run_once(T0_MS + 45 * MINUTE - 1)
        assert _firing(pusher) == {("ticket", "1d-2h"), ("ticket", "3d-6h")}
        history = recorded_alerts(store.con, start_ms=T0_MS, end_ms=T0_MS + DAY)
        assert history.num_rows == 6
        resolved = [r for r in history.to_pylist() if r["state"] == "resolved"]
        assert sorted(json.loads(r["labels_json"])["window"] for r in resolved) == [
            "1h-5m",
            "6h-30m",
        ]
        assert all(r["ends_ts_ms"] == T0_MS + 45 * MINUTE - 1 for r in resolved)
        assert {r["fingerprint"] for r in resolved} <= set(active.column("fingerprint").to_pylist())
        assert recorded_alerts(store.con).column("severity").to_pylist() == ["ticket", "ticket"]
        # as of the fault, the pages were active
        assert recorded_alerts(store.con, at_ms=T0_MS + 10 * MINUTE).num_rows == 4


DAY = 86_400_000


def test_a_restarted_pusher_resumes_without_new_rows_and_resolves_what_cleared(
    tmp_path: Path,
) -> None:
    with _store_with_fault(tmp_path / "db.duckdb") as store:
        first = AlertPusher(AlertmanagerConfig(), table_writer(store.con))
        SloJobs(store.con, MODEL, on_cycle=first.on_cycle).run_once(T0_MS + 10 * MINUTE - 1)
        insert(store, _requests(T0_MS + 10 * MINUTE, T0_MS + 45 * MINUTE, 0.3))
        again = AlertPusher(
            AlertmanagerConfig(),
            table_writer(store.con),
            state=restore_state(recorded_alerts(store.con)),
        )
        changes = again.push(
            T0_MS + 45 * MINUTE - 1,
            SloJobs(store.con, MODEL).run_once(T0_MS + 45 * MINUTE - 1),  # type: ignore[arg-type]
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


# -- a real Alertmanager ------------------------------------------------------------------


def _by_window(manager: Alertmanager) -> dict[str, str]:
    return {a["labels"]["window"]: a["status"]["state"] for a in manager.alerts()}


def test_the_jobs_push_a_fault_inhibit_resolve_and_survive_an_alertmanager_restart(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    amtool = require_tool("amtool")
    registry = CollectorRegistry()
    config = AlertmanagerConfig(url=alertmanager.url, dashboard_url="http://127.0.0.1:8501",
                                resend_s=0.5, retries=0, max_queue=6)  # fmt: skip
    with _store_with_fault(tmp_path / "db.duckdb") as store:
        pusher = AlertPusher(config, table_writer(store.con), background=False, registry=registry)
        jobs = SloJobs(store.con, MODEL, on_cycle=pusher.on_cycle)
        jobs.run_once(T0_MS + 10 * MINUTE - 1)

        # Pushed, visible, and the page inhibits the tickets of the same SLO.
        def inhibited() -> dict[str, str] | None:
            states = _by_window(alertmanager)
            return states if states.get("1d-2h") == "suppressed" else None

        assert eventually(inhibited) == {
            "1h-5m": "active", "6h-30m": "active", "1d-2h": "suppressed", "3d-6h": "suppressed",
        }  # fmt: skip
        page = next(a for a in alertmanager.alerts() if a["labels"]["window"] == "1h-5m")
        assert page["generatorURL"].startswith("http://127.0.0.1:8501/slo?slo=chat-ttft&pool=")
        assert page["annotations"]["runbook"]
        query = subprocess.run(
            [amtool, "alert", "query", "-o", "json", f"--alertmanager.url={alertmanager.url}",
             "alertname=TtftBudgetBurn"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert sorted(a["labels"]["window"] for a in json.loads(query.stdout)) == [
            "1h-5m",
            "6h-30m",
        ]

        # Outage: the re-sends queue (bounded at 6, the oldest dropped and counted), nothing
        # raises into the jobs.
        alertmanager.stop()
        for _ in range(2):
            time.sleep(0.6)
            result = jobs.run_once(T0_MS + 10 * MINUTE - 1)
            assert result is not None and result.errors == []
        dropped = registry.get_sample_value(
            "llmslo_dropped_total",
            {"component": "alertmanager", "reason": "alertmanager_queue_full"},
        )
        assert dropped == 2
        assert pusher.client is not None and pusher.client.pending == 6

        # Restart: Alertmanager forgot everything; the queued re-sends restore all four.
        alertmanager.start()
        time.sleep(0.6)
        jobs.run_once(T0_MS + 10 * MINUTE - 1)
        assert eventually(lambda: len(alertmanager.alerts()) == 4)
        assert eventually(inhibited)

        # The fault clears: the pages resolve and the tickets, no longer inhibited, stay.
        insert(store, _requests(T0_MS + 10 * MINUTE, T0_MS + 45 * MINUTE, 0.3))
        jobs.run_once(T0_MS + 45 * MINUTE - 1)

        def pages_gone() -> dict[str, str] | None:
            states = _by_window(alertmanager)
            return states if "1h-5m" not in states and "6h-30m" not in states else None

        assert eventually(pages_gone) == {"1d-2h": "active", "3d-6h": "active"}
        pusher.close()


def test_llmslo_jobs_once_pushes_and_llmslo_alerts_lists_them(
    tmp_path: Path, alertmanager: Alertmanager, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.duckdb"
    _store_with_fault(db).close()
    spec, config = tmp_path / "slo.yaml", tmp_path / "llmslo.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    config.write_text(yaml.safe_dump({"alertmanager": {"url": alertmanager.url}}))
    assert main(["jobs", "-c", str(config), "--spec", str(spec), "--db", str(db), "--once"]) == 0
    assert eventually(lambda: len(alertmanager.alerts()) == 4)
    capsys.readouterr()
    assert main(["alerts", "--db", str(db), "--severity", "page", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["count"] == 2
    assert {a["labels"]["window"] for a in listed["alerts"]} == {"1h-5m", "6h-30m"}
    assert main(["alerts", "--alertmanager", alertmanager.url]) == 0
    text = capsys.readouterr().out
    assert text.count("TtftBudgetBurn") == 4 and "suppressed" in text
    fingerprints = {fingerprint(a["labels"]) for a in listed["alerts"]}
    assert len(fingerprints) == 2


@pytest.mark.slow
def test_llmslo_run_pushes_records_through_kafka_and_resolves_after_the_fault(
    bus: Bus, tmp_path: Path, alertmanager: Alertmanager
) -> None:
    """The whole process: tap records over Kafka → ingest → jobs → Alertmanager, and the
    alert changes back over the ``alerts`` topic into the table."""
    now = int(time.time() * 1000) // MINUTE * MINUTE
    producer = bus.producer()
    faulty = _requests(now - 130 * MINUTE, now - 10 * MINUTE, 0.3) + _requests(
        now - 10 * MINUTE, now, 5.0
    )
    producer.publish(REQUEST_RECORDS, to_table(REQUEST_RECORDS, faulty))
    producer.flush()
    (tmp_path / "slo.yaml").write_text(yaml.safe_dump(SPEC))
    config = {
        "bus": {"bootstrap_servers": bus.bootstrap_servers, "topic_prefix": bus.prefix,
                "partitions": bus.config.partitions},
        "store": {"path": str(tmp_path / "run.duckdb")},
        "ingest": {"group_id": f"run-{bus.prefix}", "batch_max_ms": 100},
        "slo": {"spec": str(tmp_path / "slo.yaml"), "interval_s": 1},
        "alertmanager": {"url": alertmanager.url, "resend_s": 5},
    }  # fmt: skip
    (tmp_path / "llmslo.yaml").write_text(yaml.safe_dump(config))
    with (tmp_path / "run.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "run", "-c", str(tmp_path / "llmslo.yaml")],
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
    try:
        assert eventually(lambda: len(alertmanager.alerts()) == 4, 120), (
            tmp_path / "run.log"
        ).read_text()[-2000:]
        healthy = _requests(now, now + 35 * MINUTE, 0.3)
        producer.publish(REQUEST_RECORDS, to_table(REQUEST_RECORDS, healthy))
        producer.flush()
        windows = eventually(
            lambda: (
                sorted(_by_window(alertmanager)) == ["1d-2h", "3d-6h"] and _by_window(alertmanager)
            ),
            120,
        )
        assert windows == {"1d-2h": "active", "3d-6h": "active"}, _by_window(alertmanager)
        time.sleep(3)  # the resolved rows travel through Kafka and the ingester
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        producer.close()
    assert process.returncode == 0, (tmp_path / "run.log").read_text()[-2000:]
    with Store(tmp_path / "run.duckdb", read_only=True) as store:
        history = recorded_alerts(store.con, start_ms=now - DAY, end_ms=now + DAY)
        active = recorded_alerts(store.con)
    assert sorted((r["state"], json.loads(r["labels_json"])["window"]) for r in history.to_pylist()) == [
        ("firing", "1d-2h"), ("firing", "1h-5m"), ("firing", "3d-6h"), ("firing", "6h-30m"),
        ("resolved", "1h-5m"), ("resolved", "6h-30m"),
    ]  # fmt: skip
    assert active.column("severity").to_pylist() == ["ticket", "ticket"]


def test_a_firing_alerts_link_stays_the_same_so_it_is_not_resent_every_cycle(
    tmp_path: Path,
) -> None:
    wall = [1_000_000.0]
    with _store_with_fault(tmp_path / "db.duckdb") as store:
        sent: list[list[dict[str, Any]]] = []
        pusher = AlertPusher(
            AlertmanagerConfig(dashboard_url="http://d", resend_s=60),
            table_writer(store.con),
            client=_Recorder(sent),  # type: ignore[arg-type]
            background=False,
            clock=lambda: wall[0],
        )
        jobs = SloJobs(store.con, MODEL, on_cycle=pusher.on_cycle)
        jobs.run_once(T0_MS + 10 * MINUTE - 5_000)
        wall[0] += 15
        jobs.run_once(T0_MS + 10 * MINUTE - 1)  # 5 s later in event time, same minute
    assert [len(batch) for batch in sent] == [4]
    assert all(
        p["generatorURL"].endswith(f"from={T0_MS + 10 * MINUTE - 5_000 - 15 * MINUTE}")
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
    with _store_with_fault(tmp_path / "db.duckdb") as store:
        pusher = AlertPusher(AlertmanagerConfig(), table_writer(store.con))
        result = SloJobs(store.con, MODEL).run_once(T0_MS + 10 * MINUTE - 1)
        assert result is not None
        assert len(pusher.on_cycle(result)) == 4
        broken = SloJobs(store.con, MODEL).run_once(T0_MS + 10 * MINUTE - 1)
        assert broken is not None
        broken.statuses, broken.errors = [], ["evaluate: IO Error: disk full"]
        assert pusher.on_cycle(broken) == []
        assert len(pusher.state.firing) == 4
        assert recorded_alerts(store.con).num_rows == 4


def test_a_stall_inhibits_the_latency_burn_of_its_instance_and_flags_page_at_l3(
    tmp_path: Path, alertmanager: Alertmanager
) -> None:
    """Signals, flags and SLO pairs pushed together: Alertmanager applies the generated
    inhibitions to them (stall → latency burn of the same instance)."""

    def stall_with_slow_streams(s: State, _: float) -> None:
        s["tokens_per_s"] = 0.0  # running > 0, no tokens: the NCCL-hang signature
        s["gpu_util"], s["engine_active"] = 100.0, 1.0
        s["request"] = {"ttft_s": 30.0}

    def kv_leak(s: State, since: float) -> None:
        s["kv_usage"] = min(1.0, 0.5 + since / 600)

    model = build_model(
        parse_spec({**SPEC, "slos": [{**SPEC["slos"][0], "group_by": ["instance"]}]})
    )  # type: ignore[dict-item]
    fleet = FleetTimeline(instances=2, seconds=900)
    fleet.add_fault(0, 300, stall_with_slow_streams).add_fault(1, 300, kv_leak)
    requests, engine, gpu = fleet.rows()
    with Store(tmp_path / "db.duckdb") as store:
        insert(store, requests=requests, engine=engine, gpu=gpu)
        pusher = AlertPusher(
            AlertmanagerConfig(url=alertmanager.url), table_writer(store.con), background=False
        )
        result = SloJobs(store.con, model, on_cycle=pusher.on_cycle).run_once(fleet.end_ms)
        assert result is not None and result.errors == []
    stalled, leaking = fleet.instance(0), fleet.instance(1)

    def states() -> dict[tuple[str, str, str], str] | None:
        shown = {
            (a["labels"]["alertname"], a["labels"].get("instance", ""),
             a["labels"].get("window", a["labels"].get("level", ""))): a["status"]["state"]
            for a in alertmanager.alerts()
        }  # fmt: skip
        wanted = ("TtftBudgetBurn", stalled, "1h-5m")
        return shown if shown.get(wanted) == "suppressed" else None

    shown = eventually(states)
    assert shown, alertmanager.alerts()
    assert shown[("LlmEngineStalled", stalled, "")] == "active"
    assert shown[("LlmDegradationLevel", leaking, "L3")] == "active"
    burns = {k: v for k, v in shown.items() if k[0] == "TtftBudgetBurn"}
    assert burns and set(burns.values()) == {"suppressed"}  # pages by the stall, tickets too
    assert {k[1] for k in burns} == {stalled}
