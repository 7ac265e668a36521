"""The silence pass-through against a real Alertmanager on loopback: with the token a
silence is created, listed and expired there; without it Alertmanager is never asked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.service import ApiConfig
from pipeline.store import Store
from tests.alerts.conftest import (
    Alertmanager,
    alertmanager,  # noqa: F401  (starts a real one)
)
from tests.api.conftest import TOKEN, auth


def _silence(**extra: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "matchers": [{"name": "alertname", "value": "ChatTtftBudgetBurn", "isRegex": False}],
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
        "createdBy": "oncall@example.com",
        "comment": "rollout in progress",
        **extra,
    }


def _active(manager: Alertmanager) -> list[dict[str, Any]]:
    silences = httpx.get(f"{manager.url}/api/v2/silences", timeout=5).json()
    return [s for s in silences if s["status"]["state"] == "active"]


@pytest.fixture
def client(store: Store, alertmanager: Alertmanager) -> TestClient:  # noqa: F811
    config = ApiConfig(alertmanager_url=alertmanager.url)
    return TestClient(create_app(store.con.cursor, config, token=TOKEN))


def test_a_silence_is_created_listed_and_expired_in_alertmanager(
    client: TestClient,
    alertmanager: Alertmanager,  # noqa: F811
) -> None:
    made = client.post("/api/v1/silences", json=_silence(), headers=auth())
    assert made.status_code == 200, made.text
    silence_id = made.json()["silenceID"]
    (active,) = _active(alertmanager)
    assert active["id"] == silence_id and active["comment"] == "rollout in progress"
    listed = client.get("/api/v1/silences").json()
    assert silence_id in {s["id"] for s in listed}
    assert client.delete(f"/api/v1/silences/{silence_id}").status_code == 401
    assert client.delete(f"/api/v1/silences/{silence_id}", headers=auth()).status_code == 200
    assert _active(alertmanager) == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer nope"}, 403)],
    ids=["no token", "wrong token"],
)
def test_without_the_token_alertmanager_is_not_asked(
    client: TestClient,
    alertmanager: Alertmanager,  # noqa: F811
    headers: dict[str, str],
    status: int,
) -> None:
    assert client.post("/api/v1/silences", json=_silence(), headers=headers).status_code == status
    assert _active(alertmanager) == []


def test_alertmanager_refusals_come_back_as_its_own_4xx(
    client: TestClient,
    alertmanager: Alertmanager,  # noqa: F811
) -> None:
    no_matchers = client.post("/api/v1/silences", json=_silence(matchers=[]), headers=auth())
    assert 400 <= no_matchers.status_code < 500
    reversed_times = _silence(endsAt="2000-01-01T00:00:00Z")
    assert client.post("/api/v1/silences", json=reversed_times, headers=auth()).status_code == 400
    assert _active(alertmanager) == []


def test_without_a_configured_alertmanager_the_answer_says_so(store: Store) -> None:
    with TestClient(create_app(store.con.cursor, token=TOKEN)) as client:
        answer = client.post("/api/v1/silences", json=_silence(), headers=auth())
    assert answer.status_code == 503 and "alertmanager_url" in answer.json()["error"]


def test_an_unreachable_alertmanager_is_a_502(store: Store) -> None:
    config = ApiConfig(alertmanager_url="http://127.0.0.1:9")
    with TestClient(create_app(store.con.cursor, config, token=TOKEN)) as client:
        answer = client.post("/api/v1/silences", json=_silence(), headers=auth())
    assert answer.status_code == 502
