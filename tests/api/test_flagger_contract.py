"""Contract with Flagger webhooks (reference/canary-and-peers.md §1.2).

Flagger POSTs a ``CanaryWebhookPayload`` (metadata values are strings, no custom headers)
and decides on the status alone: ``if r.StatusCode > 202 → error``, so only 200–202 pass;
5xx and 429 are retried and their body is thrown away.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import NOW_S, flagger_payload, verdict_rows


def flagger_passes(status: int) -> bool:
    """Flagger's callWebhook: anything above 202 is a failed check."""
    return status <= 202


def reason_reaches_flagger(status: int) -> bool:
    """Non-retryable statuses keep the body, which Flagger puts in the event."""
    return status < 500 and status != 429


@pytest.mark.parametrize("gate", ["pre-rollout", "rollout", "confirm-promotion"])
@pytest.mark.parametrize(
    ("canary", "n", "verdict", "status"),
    [
        ({}, 400, "pass", 200),
        ({"ttft_factor": 1.3}, 400, "fail", 412),
        ({}, 10, "inconclusive", 409),
    ],
    ids=["healthy", "slow TTFT", "10 requests"],
)
def test_the_status_code_is_the_verdict(client, fill, gate, canary, n, verdict, status) -> None:
    fill(n, canary=canary)
    response = client.post(f"/api/v1/flagger/{gate}", json=flagger_payload())
    assert response.status_code == status
    assert flagger_passes(response.status_code) is (verdict == "pass")
    assert reason_reaches_flagger(response.status_code)
    assert response.status_code != 204
    assert response.json()["verdict"] == verdict
    assert response.json()["reason"]


@pytest.mark.parametrize(
    ("choice", "status"), [("fail", 412), ("pass", 200), ("inconclusive", 409)]
)
def test_on_inconclusive_chooses_the_status_of_an_inconclusive_verdict(
    client, fill, choice, status
) -> None:
    fill(10)
    response = client.post("/api/v1/flagger/rollout", json=flagger_payload(on_inconclusive=choice))
    assert response.status_code == status
    assert response.json()["verdict"] == "inconclusive"


def test_a_retry_with_the_same_checksum_gets_the_stored_verdict(make_app, fill, store) -> None:
    seconds = iter([NOW_S, NOW_S + 5, NOW_S + 60])
    fill(400)
    with TestClient(make_app(clock=lambda: next(seconds))) as client:
        first = client.post("/api/v1/flagger/rollout", json=flagger_payload())
        retry = client.post("/api/v1/flagger/rollout", json=flagger_payload())
        assert retry.json()["id"] == first.json()["id"]
        assert verdict_rows(store) == 1
        later = client.post("/api/v1/flagger/rollout", json=flagger_payload())
        assert later.json()["id"] != first.json()["id"], "a new interval gets a new verdict"
        assert verdict_rows(store) == 2


def test_a_new_checksum_is_a_new_revision_and_a_new_verdict(client, fill, store) -> None:
    fill(400)
    payload = flagger_payload()
    client.post("/api/v1/flagger/rollout", json=payload)
    payload["checksum"] = "0000aaaa11"
    client.post("/api/v1/flagger/rollout", json=payload)
    assert verdict_rows(store) == 2
    sources = {r[0] for r in store.con.execute("SELECT source FROM verdicts").fetchall()}
    assert sources == {"flagger/rollout"}


def test_the_token_may_come_in_metadata_or_as_a_bearer_header(client, fill) -> None:
    fill(400)
    payload = flagger_payload()
    token = payload["metadata"].pop("token")
    assert client.post("/api/v1/flagger/rollout", json=payload).status_code == 401
    headers = {"Authorization": f"Bearer {token}"}
    assert client.post("/api/v1/flagger/rollout", json=payload, headers=headers).status_code == 200


def test_flagger_extra_payload_fields_are_tolerated(client, fill) -> None:
    fill(400)
    payload = flagger_payload()
    payload["newFieldFromAFutureFlagger"] = {"x": 1}
    assert client.post("/api/v1/flagger/pre-rollout", json=payload).status_code == 200


def test_an_unknown_gate_is_refused_without_a_verdict(client, fill, store) -> None:
    fill(400)
    response = client.post("/api/v1/flagger/rollback", json=flagger_payload())
    assert response.status_code == 400
    assert "gate" in response.json()["error"]
    assert verdict_rows(store) == 0


def test_the_slo_gate_fails_the_canary_through_the_webhook(make_app, fill, store) -> None:
    from api.judge import SloGateInput

    seen = []

    def burning(cohort, time_range):
        seen.append((cohort.describe(), time_range.end_ms - time_range.start_ms))
        return SloGateInput(burn_rates={"5m": 30.0}, budget_remaining=0.5)

    fill(400)
    with TestClient(make_app(slo_state_provider=burning)) as client:
        response = client.post("/api/v1/flagger/rollout", json=flagger_payload())
    assert response.status_code == 412
    assert response.json()["reason"] == "slo_gate: burn rate 5m = 30 > 14.4"
    assert seen == [("instances=10.0.9.1:8000", 3_600_000)]
    stored = store.con.execute("SELECT document_json FROM verdicts").fetchone()
    assert stored is not None and '"passed": false' in stored[0]
