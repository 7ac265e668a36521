"""Path B against real processes: the SLO jobs push a fault into a real Alertmanager
(visible in ``/api/v2/alerts`` and ``amtool``, inhibited, resolved, restored after a
restart, drops counted through an outage), ``llmslo jobs --once`` and ``llmslo alerts``,
and ``llmslo run`` with the alert changes travelling through Kafka into the table."""

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

from alerts.config import AlertmanagerConfig
from alerts.pusher import AlertPusher
from alerts.records import fingerprint, table_writer
from llmslo.cli import main
from pipeline.bus import Bus
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from pipeline.units import DAY_MS, MINUTE_MS
from slo.jobs import SloJobs
from slo.queries import alerts as recorded_alerts
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.alerts.conftest import Alertmanager, eventually
from tests.alerts.faulted import (
    MODEL,
    SPEC,
    requests_between,
    store_with_fault,
)
from tests.conftest import require_tool
from tests.slo.factories import T0_MS, insert, to_table
from tests.slo.fleet import FleetTimeline, State

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
    with store_with_fault(tmp_path / "db.duckdb") as store:
        pusher = AlertPusher(config, table_writer(store.con), background=False, registry=registry)
        jobs = SloJobs(store.con, MODEL, on_cycle=pusher.on_cycle)
        jobs.run_once(T0_MS + 10 * MINUTE_MS - 1)

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
            result = jobs.run_once(T0_MS + 10 * MINUTE_MS - 1)
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
        jobs.run_once(T0_MS + 10 * MINUTE_MS - 1)
        assert eventually(lambda: len(alertmanager.alerts()) == 4)
        assert eventually(inhibited)

        # The fault clears: the pages resolve and the tickets, no longer inhibited, stay.
        insert(store, requests_between(T0_MS + 10 * MINUTE_MS, T0_MS + 45 * MINUTE_MS, 0.3))
        jobs.run_once(T0_MS + 45 * MINUTE_MS - 1)

        def pages_gone() -> dict[str, str] | None:
            states = _by_window(alertmanager)
            return states if "1h-5m" not in states and "6h-30m" not in states else None

        assert eventually(pages_gone) == {"1d-2h": "active", "3d-6h": "active"}
        pusher.close()


def test_llmslo_jobs_once_pushes_and_llmslo_alerts_lists_them(
    tmp_path: Path, alertmanager: Alertmanager, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.duckdb"
    store_with_fault(db).close()
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
    now = int(time.time() * 1000) // MINUTE_MS * MINUTE_MS
    producer = bus.producer()
    faulty = requests_between(now - 130 * MINUTE_MS, now - 10 * MINUTE_MS, 0.3) + requests_between(
        now - 10 * MINUTE_MS, now, 5.0
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
            [sys.executable, "-m", "llmslo", "run", "-c", str(tmp_path / "llmslo.yaml")],
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
    try:
        assert eventually(lambda: len(alertmanager.alerts()) == 4, 120), (
            tmp_path / "run.log"
        ).read_text()[-2000:]
        healthy = requests_between(now, now + 35 * MINUTE_MS, 0.3)
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
        history = recorded_alerts(store.con, start_ms=now - DAY_MS, end_ms=now + DAY_MS)
        active = recorded_alerts(store.con)
    assert sorted((r["state"], json.loads(r["labels_json"])["window"]) for r in history.to_pylist()) == [
        ("firing", "1d-2h"), ("firing", "1h-5m"), ("firing", "3d-6h"), ("firing", "6h-30m"),
        ("resolved", "1h-5m"), ("resolved", "6h-30m"),
    ]  # fmt: skip
    assert active.column("severity").to_pylist() == ["ticket", "ticket"]


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

    spec: dict[str, Any] = dict(SPEC)
    model = build_model(
        parse_spec({**spec, "slos": [{**spec["slos"][0], "group_by": ["instance"]}]})
    )
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
