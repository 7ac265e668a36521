"""The app behind a real uvicorn server on loopback, and its health and OpenAPI pages."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from api.service import ApiConfig
from tests.api.conftest import argo_params, auth, flagger_payload


@pytest.fixture
def server(make_app, fill) -> Iterator[str]:
    fill(400, canary={"ttft_factor": 1.3})
    config = ApiConfig()
    sock = socket.socket()
    sock.bind((config.host, 0))  # loopback by default
    server = uvicorn.Server(uvicorn.Config(make_app(config), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 10 s"
    host, port = sock.getsockname()
    yield f"http://{host}:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_the_default_bind_address_is_loopback() -> None:
    assert ApiConfig().host == "127.0.0.1"


def test_argo_and_flagger_get_their_answers_over_real_http(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").status_code == 200
        argo = http.get("/api/v1/verdict", params=argo_params(), headers=auth())
        assert argo.status_code == 200
        assert argo.json()["summary"]["verdict"] == "fail"
        flagger = http.post("/api/v1/flagger/rollout", json=flagger_payload())
        assert flagger.status_code == 412
        assert "ttft_s High" in flagger.json()["reason"]
        assert len(http.get("/api/v1/verdicts").json()["verdicts"]) == 2


def test_openapi_documents_the_verdict_endpoints(client) -> None:
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {
        "/api/v1/verdict",
        "/api/v1/flagger/{gate}",
        "/api/v1/verdicts",
        "/healthz",
        "/readyz",
    } <= set(paths)


def test_readyz_says_what_is_missing(tmp_path) -> None:
    import duckdb
    from fastapi.testclient import TestClient

    from api.app import create_app

    con = duckdb.connect(str(tmp_path / "empty.duckdb"))
    with TestClient(create_app(con.cursor, token="t")) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert "requests" in response.json()["error"]
    con.close()
