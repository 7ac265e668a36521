"""``/api/v1/alerts`` expires what no jobs cycle confirms: a stopped pipeline's alerts are not
served as active an hour later (the pushed alerts' TTL, as in Alertmanager and the CLI)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from pipeline.store import Store
from slo.queries import alerts
from tests.alerts.conftest import record_alert

TTL_S = 240.0  # 4 × alertmanager.resend_s (60 s)


def _listed(db: Path, ttl_s: float | None, **query: int) -> list[str]:
    with Store(db) as store, TestClient(create_app(store.con.cursor, alert_ttl_s=ttl_s)) as client:
        answer = client.get("/api/v1/alerts", params=query)
    assert answer.status_code == 200, answer.text
    return [row["alertname"] for row in answer.json()["data"]]


def test_a_stopped_pipelines_alert_is_not_served_as_active(tmp_path: Path) -> None:
    db, hour_ago = tmp_path / "stopped.duckdb", int(time.time() * 1000) - 3_600_000
    record_alert(db, hour_ago, hour_ago)
    assert _listed(db, TTL_S) == []
    assert _listed(db, TTL_S, at_ms=hour_ago + 60_000) == ["LlmEngineStalled"]  # active then
    assert _listed(db, None) == ["LlmEngineStalled"]  # no TTL configured: every firing alert


def test_an_alert_the_running_jobs_still_confirm_is_served_however_old(tmp_path: Path) -> None:
    db, now_ms = tmp_path / "live.duckdb", int(time.time() * 1000)
    record_alert(db, now_ms - 3_600_000, now_ms - 10_000)
    assert _listed(db, TTL_S) == ["LlmEngineStalled"]


def test_the_ttl_is_the_servers_not_a_query_parameter(tmp_path: Path) -> None:
    db, hour_ago = tmp_path / "stopped.duckdb", int(time.time() * 1000) - 3_600_000
    record_alert(db, hour_ago, None)
    with Store(db) as store, TestClient(create_app(store.con.cursor, alert_ttl_s=TTL_S)) as client:
        answer = client.get("/api/v1/alerts", params={"ttl_ms": 10**12})
    assert answer.status_code == 400 and "ttl_ms" in answer.text
    with Store(db) as store:
        assert alerts(store.con, ttl_ms=int(TTL_S * 1000)).num_rows == 0
        assert alerts(store.con, ttl_ms=10**12).num_rows == 1  # no heartbeat: the change counts
