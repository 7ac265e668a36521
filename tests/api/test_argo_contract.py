"""Contract with Argo Rollouts' ``web`` metric provider (reference/canary-and-peers.md §1.1).

Argo takes ``result`` from ``jsonPath: "{$.summary}"``, evaluates ``successCondition`` and
``failureCondition`` and classifies the measurement; any non-2xx is an Error (abort). The
small evaluator below implements exactly the two conditions docs/canary.md uses.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from api.judge import DEFAULT_METRICS
from tests.api.conftest import BASELINE, CANARY, argo_params, auth, verdict_rows

SUCCESS = 'result.verdict == "pass"'
FAILURE = 'result.verdict == "fail"'
_CONDITION = re.compile(r'^result\.(\w+) == "([^"]*)"$')


def _holds(condition: str, result: dict[str, Any]) -> bool:
    match = _CONDITION.match(condition)
    assert match, f"the test evaluator does not know {condition!r}"
    field, value = match.groups()
    if field not in result:
        raise KeyError(field)  # Argo: an expression error → Error
    return result[field] == value


def argo_phase(status: int, body: Any, success: str | None, failure: str | None) -> str:
    """Measurement phase per Argo's webmetric.go + evaluate.go."""
    if not 200 <= status <= 299:
        return "Error"
    if not isinstance(body, dict) or "summary" not in body:
        return "Error"  # jsonPath {$.summary} not found
    result = body["summary"]
    try:
        succeeded = _holds(success, result) if success else None
        failed = _holds(failure, result) if failure else None
    except KeyError:
        return "Error"
    if success and failure:
        return "Failed" if failed else "Successful" if succeeded else "Inconclusive"
    if success:
        return "Successful" if succeeded else "Failed"
    if failure:
        return "Failed" if failed else "Successful"
    return "Successful"


@pytest.mark.parametrize(
    ("canary", "n", "verdict", "phase"),
    [
        ({}, 400, "pass", "Successful"),
        ({"ttft_factor": 1.3}, 400, "fail", "Failed"),
        ({}, 10, "inconclusive", "Inconclusive"),
    ],
    ids=["healthy canary is Successful", "slow TTFT is Failed", "10 requests is Inconclusive"],
)
def test_every_computed_verdict_is_200_and_argo_reads_the_phase_from_both_conditions(
    client, fill, canary, n, verdict, phase
) -> None:
    fill(n, canary=canary)
    response = client.get("/api/v1/verdict", params=argo_params(), headers=auth())
    assert response.status_code == 200
    body = response.json()
    assert body["summary"]["verdict"] == verdict
    assert body["summary"]["pass"] is (verdict == "pass")
    assert body["summary"]["fail"] is (verdict == "fail")
    assert argo_phase(response.status_code, body, SUCCESS, FAILURE) == phase


def test_with_only_a_success_condition_inconclusive_would_abort_which_is_why_docs_use_both(
    client, fill
) -> None:
    fill(10)
    response = client.get("/api/v1/verdict", params=argo_params(), headers=auth())
    assert argo_phase(200, response.json(), SUCCESS, None) == "Failed"
    assert argo_phase(200, response.json(), SUCCESS, FAILURE) == "Inconclusive"


def test_the_summary_is_small_numeric_and_the_document_holds_the_evidence(client, fill) -> None:
    fill(400, canary={"ttft_factor": 1.3})
    response = client.post("/api/v1/verdict", json=argo_params(), headers=auth())
    body = response.json()
    summary = body["summary"]
    assert len(response.text.split('"subject"')[0]) < 1200
    assert isinstance(summary["score"], float) and isinstance(summary["canaryRequests"], int)
    assert summary["canaryRequests"] == 400 and summary["baselineRequests"] == 400
    ttft = next(m for m in body["metrics"] if m["name"] == "ttft_s")
    assert ttft["classification"] == "High"
    assert ttft["shift_lower"] > 0 and ttft["ratio"] > 1.2
    assert body["window"]["seconds"] == 3600


def test_every_verdict_is_stored_and_listed_newest_first(make_app, fill, store) -> None:
    from itertools import count

    from fastapi.testclient import TestClient

    from tests.api.conftest import NOW_S

    ticks = count()
    fill(400)
    with TestClient(make_app(clock=lambda: NOW_S + next(ticks))) as client:
        for window in ("1h", "30m"):
            params = argo_params(window=window, service="llama")
            assert client.get("/api/v1/verdict", params=params, headers=auth()).status_code == 200
        assert verdict_rows(store) == 2
        history = client.get("/api/v1/verdicts", params={"service": "llama"}).json()["verdicts"]
        assert [v["window"]["seconds"] for v in history] == [1800, 3600]
        # Each stored verdict keeps every metric the judge scored, not a summary of them.
        assert all({m["name"] for m in v["metrics"]} == set(DEFAULT_METRICS) for v in history)
        assert client.get("/api/v1/verdicts", params={"verdict": "fail"}).json()["verdicts"] == []
        assert client.get("/api/v1/verdicts", params={"service": "other"}).json()["verdicts"] == []


def test_a_stored_verdict_can_be_read_back_by_id(client, fill) -> None:
    fill(400)
    made = client.get("/api/v1/verdict", params=argo_params(), headers=auth()).json()
    again = client.get(f"/api/v1/verdicts/{made['id']}")
    assert again.status_code == 200
    assert again.json() == made
    assert client.get("/api/v1/verdicts/nope").status_code == 404


def test_instance_lists_may_repeat_in_the_query_string(client, fill, store) -> None:
    fill(400)
    query = [
        ("canary_instances", CANARY),
        ("canary_instances", "10.0.9.99:8000"),
        ("baseline_instances", BASELINE),
        ("window", "1h"),
    ]
    body = client.get("/api/v1/verdict", params=query, headers=auth()).json()
    assert body["subject"]["canary"] == f"instances={CANARY},10.0.9.99:8000"
    twice = client.get("/api/v1/verdict", params=[*query, ("window", "5m")], headers=auth())
    assert twice.status_code == 400
    assert "window: given more than once" in twice.json()["error"]
    assert verdict_rows(store) == 1
