"""Hostile input on every parameter: a clear 4xx naming the problem, and nothing changed."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import BASELINE, CANARY, argo_params, auth, flagger_payload, verdict_rows

LONG = "x" * 300


@pytest.fixture
def loaded(client, fill, store):
    fill(200)
    return client


def assert_nothing_changed(store) -> None:
    assert verdict_rows(store) == 0
    assert store.count("requests") == 400


@pytest.mark.parametrize(
    ("params", "status", "words"),
    [
        ({"canary_instances": "x' OR 1=1 --"}, 404, "no request record"),
        ({"canary_instances": "'; DROP TABLE requests; --"}, 404, "no request record"),
        (
            {"canary_instances": "", "canary_selector": ""},
            400,
            "canary_instances or canary_selector",
        ),
        (
            {"canary_selector": "pool=x' OR '1'='1", "canary_instances": ""},
            404,
            "no request record",
        ),
        ({"canary_selector": "drop table requests=1"}, 400, "unknown label"),
        # Records carry revision now: an unknown one is an unknown cohort, named in the 404.
        ({"canary_selector": "revision=r2"}, 404, "revision=r2"),
        ({"canary_selector": "no-equals-sign"}, 400, "label=value"),
        ({"canary_instances": LONG}, 400, "1–256 characters"),
        ({"canary_instances": ",".join(f"10.0.{i}" for i in range(1100))}, 400, "canary"),
        ({"baseline_instances": CANARY}, 400, "same requests"),
        ({"window": "5 minutes"}, 400, "window"),
        ({"window": "9999999d"}, 400, "31 days"),
        ({"window": "0s"}, 400, "longer than zero"),
        ({"at": "yesterday"}, 400, "RFC 3339"),
        ({"at": "2026-08-20T10:05:00"}, 400, "time zone"),
        ({"start": "2026-08-20T10:05:00Z", "end": "2026-08-20T10:00:00Z"}, 400, "after start"),
        ({"start": "2016-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, 400, "31 days"),
        ({"min_requests": "-1"}, 400, "min_requests"),
        ({"min_requests": "1e99"}, 400, "min_requests"),
        ({"min_requests": "99999999999999"}, 400, "min_requests"),
        ({"on_inconclusive": "maybe"}, 400, "on_inconclusive"),
        ({"limit": "10"}, 400, "limit"),
        ({"service": LONG}, 400, "service"),
    ],
    ids=lambda value: value if isinstance(value, int | str) else None,
)
def test_bad_verdict_parameters_get_a_clear_4xx_and_change_nothing(
    loaded, store, params, status, words
) -> None:
    query = argo_params(**params)
    for response in (
        loaded.get("/api/v1/verdict", params=query, headers=auth()),
        loaded.post("/api/v1/verdict", json=query, headers=auth()),
        loaded.post("/api/v1/flagger/rollout", json=flagger_payload(**params)),
    ):
        assert response.status_code == status, response.text
        assert words in response.json()["error"]
    assert_nothing_changed(store)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("{not json", "JSON"),
        ("[1, 2, 3]", "dict"),
        (json.dumps({"canary_instances": [1, 2]}), "canary_instances"),
    ],
    ids=["malformed JSON", "an array", "numbers for instances"],
)
def test_malformed_verdict_bodies_are_400(loaded, store, body, words) -> None:
    headers = {**auth(), "Content-Type": "application/json"}
    response = loaded.post("/api/v1/verdict", content=body, headers=headers)
    assert response.status_code == 400
    assert words.lower() in response.json()["error"].lower()
    assert_nothing_changed(store)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p["metadata"].update(window=5),
        lambda p: p.pop("name"),
        lambda p: p.update(metadata="window=5m"),
        lambda p: p.update(checksum="c" * 10_000),
    ],
    ids=["a number in metadata", "no name", "metadata not an object", "huge checksum"],
)
def test_malformed_flagger_payloads_are_400(loaded, store, mutate) -> None:
    payload = flagger_payload()
    mutate(payload)
    response = loaded.post("/api/v1/flagger/rollout", json=payload)
    assert response.status_code == 400
    assert response.json()["error"]
    assert_nothing_changed(store)


def test_malformed_json_to_flagger_is_400(loaded, store) -> None:
    response = loaded.post(
        "/api/v1/flagger/rollout",
        content=b'{"name": ',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert_nothing_changed(store)


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 403), ({"Authorization": "Basic abc"}, 401)],
    ids=["missing token", "wrong token", "not a bearer token"],
)
def test_verdicts_need_the_token(loaded, store, headers, status) -> None:
    assert (
        loaded.get("/api/v1/verdict", params=argo_params(), headers=headers).status_code == status
    )
    assert loaded.post("/api/v1/verdict", json=argo_params(), headers=headers).status_code == status
    payload = flagger_payload(token="wrong" if status == 403 else None)
    if status == 401:
        payload["metadata"].pop("token", None)
    response = loaded.post("/api/v1/flagger/rollout", json=payload)
    assert response.status_code == status
    assert "token" in response.json()["error"]
    assert_nothing_changed(store)


def test_without_a_configured_token_verdicts_are_refused(
    make_app, fill, store, monkeypatch
) -> None:
    monkeypatch.delenv("LLMSLO_API_TOKEN", raising=False)
    fill(200)
    with TestClient(make_app(token=None)) as client:
        response = client.get("/api/v1/verdict", params=argo_params(), headers=auth())
    assert response.status_code == 403
    assert "LLMSLO_API_TOKEN" in response.json()["error"]
    assert_nothing_changed(store)


def test_the_token_is_read_from_the_configured_environment_variable(
    make_app, fill, monkeypatch
) -> None:
    monkeypatch.setenv("LLMSLO_API_TOKEN", "from-env")
    fill(200)
    with TestClient(make_app(token=None)) as client:
        ok = client.get(
            "/api/v1/verdict", params=argo_params(), headers={"Authorization": "Bearer from-env"}
        )
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "1000000000"},
        {"limit": "0"},
        {"limit": "ten"},
        {"verdict": "DROP TABLE"},
        {"service": LONG},
    ],
    ids=["huge limit", "zero limit", "word limit", "unknown verdict", "long service"],
)
def test_history_parameters_are_bounded(loaded, store, params) -> None:
    response = loaded.get("/api/v1/verdicts", params=params)
    assert response.status_code == 400
    assert next(iter(params)) in response.json()["error"]
    assert_nothing_changed(store)


def test_baseline_instances_unknown_is_404_naming_the_cohort(loaded, store) -> None:
    response = loaded.get(
        "/api/v1/verdict", params=argo_params(baseline_instances="10.7.7.7:1"), headers=auth()
    )
    assert response.status_code == 404
    assert "10.7.7.7:1" in response.json()["error"]
    assert BASELINE not in response.json()["error"]
    assert_nothing_changed(store)


def test_a_bad_default_window_in_the_config_is_refused_at_startup() -> None:
    from pydantic import ValidationError

    from api.service import ApiConfig

    with pytest.raises(ValidationError, match="default_window"):
        ApiConfig(default_window="ten minutes")
