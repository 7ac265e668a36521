"""Fixtures for the API tests: a real DuckDB file written through ``pipeline.store.Store``
with canary and baseline request records, and the app on it (TestClient)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from api.service import ApiConfig
from pipeline.store import Store
from pipeline.units import HOUR_MS
from tests.slo.factories import T0_MS, insert, request

TOKEN = "s3cret-token"
CANARY = "10.0.9.1:8000"
BASELINE = "10.0.0.1:8000"
#: The app's clock: one hour after the first record.
NOW_S = (T0_MS + 3_600_000) / 1000


def cohort_rows(
    instance: str,
    n: int,
    *,
    seed: int,
    ttft_factor: float = 1.0,
    outcomes: dict[str, int] | None = None,
    start_ms: int = T0_MS,
    span_ms: int = HOUR_MS,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """``n`` requests spread over ``span_ms`` with lognormal latencies (median TTFT ~0.37 s).

    ``outcomes`` turns the first requests into the given bad outcomes (name → count).
    """
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(-1.0, 0.3, n) * ttft_factor
    tpot = rng.lognormal(-3.5, 0.2, n)
    rows = []
    for i in range(n):
        rows.append(
            request(
                start_ms + i * span_ms // n,
                instance=instance,
                ttft_s=float(ttft[i]),
                tpot_s=float(tpot[i]),
                itl_p99_s=float(tpot[i] * 1.5),
                itl_max_s=float(tpot[i] * 2),
                e2e_s=float(ttft[i] + 100 * tpot[i]),
                **overrides,
            )
        )
    index = 0
    for outcome, count in (outcomes or {}).items():
        for _ in range(count):
            rows[index].update(outcome=outcome, http_status=502)
            index += 1
    return rows


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "llmslo.duckdb") as opened:
        yield opened


@pytest.fixture
def fill(store: Store) -> Callable[..., None]:
    """Write canary and baseline records (keyword arguments go to :func:`cohort_rows`)."""

    def _fill(
        n: int = 400, canary: dict[str, Any] | None = None, baseline_n: int | None = None
    ) -> None:
        rows = cohort_rows(BASELINE, baseline_n or n, seed=1)
        rows += cohort_rows(CANARY, n, seed=2, **(canary or {}))
        insert(store, requests=rows)

    return _fill


@pytest.fixture
def make_app(store: Store) -> Callable[..., FastAPI]:
    def _make(config: ApiConfig | None = None, **kwargs: Any) -> FastAPI:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("clock", lambda: NOW_S)
        return create_app(store.con.cursor, config, **kwargs)

    return _make


@pytest.fixture
def client(make_app: Callable[..., FastAPI]) -> Iterator[TestClient]:
    with TestClient(make_app()) as test_client:
        yield test_client


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def argo_params(**extra: str) -> dict[str, str]:
    """What an AnalysisTemplate's ``url`` carries (docs/canary.md)."""
    return {"canary_instances": CANARY, "baseline_instances": BASELINE, "window": "1h", **extra}


def flagger_payload(**metadata: str | None) -> dict[str, Any]:
    """The payload Flagger POSTs (CanaryWebhookPayload; metadata values are strings)."""
    meta = {"token": TOKEN, **argo_params(), **metadata}
    return {
        "name": "llama-70b",
        "namespace": "inference",
        "phase": "Progressing",
        "checksum": "85d557f47b",
        "metadata": {k: v for k, v in meta.items() if v is not None},
    }


def verdict_rows(store: Store) -> int:
    row = store.con.execute("SELECT count(*) FROM verdicts").fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` behind a real uvicorn server on a free loopback port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", backlog=512))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 10 s"
    host, port = sock.getsockname()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
