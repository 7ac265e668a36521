"""``/api/v1/latency`` and ``/api/v1/outcomes`` answer for the users' requests by default and
for the synthetic prober's with ``source=probe``; any other value is a 400 naming ``source``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from slo import queries
from tests.slo.test_request_sources import END_MS, ENTRY, HOUR_MS, START_MS, files  # noqa: F401

SERIES = {"start_ms": START_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS}


@pytest.fixture(scope="module")
def con(files: dict[str, Path]) -> Iterator[duckdb.DuckDBPyConnection]:  # noqa: F811
    with duckdb.connect(str(files["mixed-rolled"]), read_only=True) as opened:
        yield opened


@pytest.fixture(scope="module")
def client(con: duckdb.DuckDBPyConnection) -> Iterator[TestClient]:
    with TestClient(create_app(con.cursor, token="t", read_only=True)) as test_client:
        yield test_client


CASES = {
    "outcomes per entry point": ("/api/v1/outcomes", queries.outcome_counts, {"by": "instance"}),
    "TTFT per entry point": (
        "/api/v1/latency",
        queries.latency_percentiles,
        {"metric": "ttft", "by": "instance"},
    ),
    "E2E per pool": ("/api/v1/latency", queries.latency_percentiles, {"metric": "e2e"}),
}


@pytest.mark.parametrize(("path", "function", "extra"), CASES.values(), ids=list(CASES))
def test_source_probe_answers_the_probe_records_and_the_default_the_taps(
    client: TestClient, con: duckdb.DuckDBPyConnection, path: str, function: Any, extra: Any
) -> None:
    args = {**SERIES, **extra}
    probes = client.get(path, params={**args, "source": "probe"})
    assert probes.status_code == 200, probes.text
    expected = function(con.cursor(), **args, source="probe").to_pylist()
    assert probes.json()["data"] == expected and expected
    taps = client.get(path, params=args).json()["data"]
    assert taps == function(con.cursor(), **args).to_pylist() and taps
    if extra.get("by") == "instance":
        assert {row["instance"] for row in expected} == {ENTRY}
        assert ENTRY not in {row["instance"] for row in taps}


@pytest.mark.parametrize("path", ["/api/v1/outcomes", "/api/v1/latency"])
@pytest.mark.parametrize("value", ["probes", "PROBE", "", "engine"])
def test_an_unknown_source_is_a_400_naming_it(client: TestClient, path: str, value: str) -> None:
    params = {**SERIES, "metric": "ttft"} if path.endswith("latency") else dict(SERIES)
    answer = client.get(path, params={**params, "source": value})
    assert answer.status_code == 400
    body = answer.json()
    assert body["parameter"] == "source"
    assert "must be one of tap, probe" in body["error"]


def test_the_entry_point_is_not_listed_as_an_engine_instance(client: TestClient) -> None:
    meta = client.get("/api/v1/meta").json()
    assert meta["instances"] and ENTRY not in {i["instance"] for i in meta["instances"]}
