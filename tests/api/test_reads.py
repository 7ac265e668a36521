"""The read endpoints answer exactly what ``slo.queries`` answers, as JSON or Arrow, and
refuse hostile parameters with a 400 that names the parameter, changing nothing."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.reads import ARROW_STREAM
from pipeline.store import Store
from pipeline.units import HOUR_MS, MINUTE_MS
from slo import queries
from tests.slo.queries.test_queries import END_MS, MODEL, POD, START_MS, built  # noqa: F401

TOKEN = "read-token"
RANGE = {"start_ms": START_MS, "end_ms": END_MS}
SERIES = {**RANGE, "bucket_ms": HOUR_MS}

#: (route, query parameters as sent, the slo.queries call they mean)
ROUTES: list[tuple[str, str, list[tuple[str, Any]], Any, dict[str, Any]]] = [
    ("all SLOs", "/api/v1/slos", [], queries.slo_status, {}),
    ("one SLO", "/api/v1/slos", [("slo_id", "q-avail")], queries.slo_status, {"slo_id": "q-avail"}),
    (
        "findings in a range",
        "/api/v1/findings",
        [("start_ms", START_MS), ("end_ms", END_MS), ("state", "firing")],
        queries.findings,
        {**RANGE, "state": "firing"},
    ),
    ("open findings", "/api/v1/findings/open", [], queries.open_findings, {}),
    (
        "every SLO group's events",
        "/api/v1/slos/series",
        [*SERIES.items(), ("slo_id", "q-ttft")],
        queries.slo_series,
        {**SERIES, "slo_id": "q-ttft"},
    ),
    (
        "every SLO group's alert spans",
        "/api/v1/slos/alert-spans",
        [*SERIES.items(), ("instance", POD)],
        queries.slo_alert_spans,
        {**SERIES, "instance": POD},
    ),
    (
        "flag timeline",
        "/api/v1/flags/timeline",
        [("start_ms", START_MS), ("end_ms", END_MS), ("limit", 1)],
        queries.flag_timeline,
        {**RANGE, "limit": 1},
    ),
    (
        "TTFT percentiles per instance",
        "/api/v1/latency",
        [("metric", "ttft"), *SERIES.items(), ("by", "instance")],
        queries.latency_percentiles,
        {"metric": "ttft", **SERIES, "by": "instance"},
    ),
    (
        "outcomes of one pool",
        "/api/v1/outcomes",
        [*SERIES.items(), ("pool", "tap-pool")],
        queries.outcome_counts,
        {**SERIES, "pool": "tap-pool"},
    ),
    (
        "ghosts with a grace",
        "/api/v1/ghosts",
        [*SERIES.items(), ("ghost_grace_s", "2.5")],
        queries.ghost_counts,
        {**SERIES, "ghost_grace_s": 2.5},
    ),
    (
        "engine signals, repeated",
        "/api/v1/engines",
        [("signals", "kv_usage"), ("signals", "running"), *SERIES.items()],
        queries.engine_series,
        {"signals": ["kv_usage", "running"], **SERIES},
    ),
    (
        "GPU signals of two instances",
        "/api/v1/gpus",
        [("signals", "gpu_util"), *SERIES.items(), ("instances", "a"), ("instances", "b")],
        queries.gpu_series,
        {"signals": ["gpu_util"], **SERIES, "instances": ["a", "b"]},
    ),
]


@pytest.fixture(scope="module")
def store(built: Any) -> Iterator[Store]:  # noqa: F811
    path, _ = built
    with Store(path) as opened:
        yield opened


@pytest.fixture(scope="module")
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(store.con.cursor, token=TOKEN, model=MODEL)) as test_client:
        yield test_client


def _same(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> bool:
    def clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in rows
        ]

    return clean(left) == clean(right)


@pytest.mark.parametrize(
    ("path", "params", "function", "kwargs"),
    [case[1:] for case in ROUTES],
    ids=[case[0] for case in ROUTES],
)
def test_every_route_answers_what_slo_queries_answers_as_json_and_arrow(
    client: TestClient, store: Store, path: str, params: Any, function: Any, kwargs: Any
) -> None:
    expected = function(store.con.cursor(), **kwargs)
    answer = client.get(path, params=params)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["count"] == expected.num_rows == len(body["data"])
    assert _same(body["data"], expected.to_pylist())
    arrow = client.get(path, params=params, headers={"Accept": ARROW_STREAM})
    assert arrow.status_code == 200
    assert arrow.headers["content-type"] == ARROW_STREAM
    table = pa.ipc.open_stream(arrow.content).read_all()
    assert table.schema == expected.schema
    assert table.equals(expected)


def test_the_routes_return_real_rows_not_just_empty_tables(client: TestClient) -> None:
    for path, params in [
        ("/api/v1/slos", {}),
        ("/api/v1/findings", RANGE),
        ("/api/v1/latency", {"metric": "ttft", **SERIES}),
        ("/api/v1/outcomes", SERIES),
        ("/api/v1/slos/alert-spans", SERIES),
    ]:
        assert client.get(path, params=params).json()["count"] > 0, path


def test_budget_takes_the_objective_from_the_spec_and_a_group(
    client: TestClient, store: Store
) -> None:
    expected = queries.budget_series(
        store.con.cursor(),
        slo_id="q-ttft",
        objective=0.995,
        start_ms=END_MS - 6 * HOUR_MS,
        end_ms=END_MS,
        bucket_ms=10 * MINUTE_MS,
        group={"instance": POD},
    )
    params = [
        ("start_ms", END_MS - 6 * HOUR_MS),
        ("end_ms", END_MS),
        ("bucket_ms", 10 * MINUTE_MS),
        ("group", f"instance:{POD}"),
    ]
    answer = client.get("/api/v1/slos/q-ttft/budget", params=params)
    assert answer.status_code == 200, answer.text
    assert expected.num_rows > 0
    assert _same(answer.json()["data"], expected.to_pylist())
    given = client.get("/api/v1/slos/q-ttft/budget", params=[*params, ("objective", "0.5")])
    loose = queries.budget_series(
        store.con.cursor(),
        slo_id="q-ttft",
        objective=0.5,
        start_ms=END_MS - 6 * HOUR_MS,
        end_ms=END_MS,
        bucket_ms=10 * MINUTE_MS,
        group={"instance": POD},
    )
    assert _same(given.json()["data"], loose.to_pylist())


def test_meta_lists_the_range_pools_instances_and_slos(client: TestClient, store: Store) -> None:
    meta = client.get("/api/v1/meta").json()
    row = store.con.execute(
        "SELECT min(received_ts_ms), max(received_ts_ms) FROM requests"
    ).fetchone()
    assert row is not None
    first, last = row
    assert meta["data_start_ms"] <= first and meta["data_end_ms"] >= last
    assert meta["slos"] == ["q-avail", "q-ttft"]
    assert "tap-pool" in meta["pools"]
    by_name = {i["instance"]: i for i in meta["instances"]}
    (address,) = store.con.execute(
        "SELECT any_value(address) FROM requests WHERE instance = ?", [POD]
    ).fetchone() or (None,)
    assert address and address != POD  # named pod-N, its host:port one column away
    assert by_name[POD]["address"] == address and by_name[POD]["pool"] in meta["pools"]


def test_alerts_answer_an_empty_table_until_there_are_alerts(client: TestClient) -> None:
    answer = client.get("/api/v1/alerts")
    assert answer.status_code == 200
    assert answer.json()["count"] == 0


def _counts(store: Store) -> dict[str, int]:
    tables = [
        name
        for (name,) in store.con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        ).fetchall()
    ]
    return {t: len(store.con.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}


HOSTILE = [
    ("reversed range", "/api/v1/findings", {"start_ms": END_MS, "end_ms": START_MS}, "end_ms"),
    (
        "ten-year range",
        "/api/v1/flags/timeline",
        {"start_ms": END_MS - 3650 * 86_400_000, "end_ms": END_MS},
        "end_ms",
    ),
    ("huge limit", "/api/v1/findings", {**RANGE, "limit": 10**12}, "limit"),
    ("a limit beyond int64", "/api/v1/findings", {**RANGE, "limit": "9" * 30}, "limit"),
    ("a float limit", "/api/v1/findings", {**RANGE, "limit": "1e3"}, "limit"),
    ("a time that is not a number", "/api/v1/findings", {**RANGE, "start_ms": "yesterday"}, "start_ms"),
    ("a negative time", "/api/v1/findings/open", {"at_ms": -5}, "at_ms"),
    ("an unknown parameter", "/api/v1/slos", {"slo_id": "x", "drop": "1"}, "drop"),
    ("a missing required parameter", "/api/v1/latency", {**SERIES}, "metric"),
    ("an unknown metric", "/api/v1/latency", {**SERIES, "metric": "ttft; DROP TABLE requests"}, "metric"),
    ("an unknown breakdown", "/api/v1/outcomes", {**SERIES, "by": "1=1"}, "by"),
    ("a sub-second bucket", "/api/v1/latency", {**RANGE, "metric": "ttft", "bucket_ms": 1}, "bucket_ms"),
    ("too many buckets", "/api/v1/outcomes", {**RANGE, "bucket_ms": MINUTE_MS, "end_ms": START_MS + 90 * 86_400_000}, "bucket_ms"),
    ("NaN grace", "/api/v1/ghosts", {**SERIES, "ghost_grace_s": "nan"}, "ghost_grace_s"),
    ("a grace that is not a number", "/api/v1/ghosts", {**SERIES, "ghost_grace_s": "2s"}, "ghost_grace_s"),
    ("an engine query without signals", "/api/v1/engines", {**SERIES}, "signals"),
    ("a 300-character id", "/api/v1/slos", {"slo_id": "x" * 300}, "slo_id"),
    ("a state not in the list", "/api/v1/findings", {**RANGE, "state": "' OR ''='"}, "state"),
    ("a group without a colon", "/api/v1/slos/q-avail/budget", {**SERIES, "group": "pool"}, "group"),
    ("a group on an unknown column", "/api/v1/slos/q-avail/budget", {**SERIES, "group": "1=1 OR pool:x"}, "group"),
    ("an objective of 1", "/api/v1/slos/q-avail/budget", {**SERIES, "objective": "1"}, "objective"),
    ("an unknown SLO without objective", "/api/v1/slos/nope/budget", SERIES, "slo_id"),
    ("meta with parameters", "/api/v1/meta", {"x": "1"}, "x"),
    ("alert spans in second buckets", "/api/v1/slos/alert-spans", {**RANGE, "bucket_ms": 30_000}, "bucket_ms"),
    ("alert spans without a bucket", "/api/v1/slos/alert-spans", RANGE, "bucket_ms"),
    ("alert spans ending before they start", "/api/v1/slos/alert-spans", {**SERIES, "end_ms": START_MS - 1}, "end_ms"),
    ("alert spans of an unknown parameter", "/api/v1/slos/alert-spans", {**SERIES, "objective": "0.9"}, "objective"),
    ("alert spans of a 300-character pool", "/api/v1/slos/alert-spans", {**SERIES, "pool": "p" * 300}, "pool"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "params", "parameter"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_parameters_get_a_400_naming_them_and_change_nothing(
    client: TestClient, store: Store, path: str, params: dict[str, Any], parameter: str
) -> None:
    before = _counts(store)
    answer = client.get(path, params=params)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["parameter"] == parameter
    assert body["error"].startswith(f"{parameter}: ")
    assert _counts(store) == before


def test_a_scalar_parameter_given_twice_is_refused(client: TestClient) -> None:
    answer = client.get("/api/v1/slos", params=[("slo_id", "a"), ("slo_id", "b")])
    assert answer.status_code == 400 and answer.json()["parameter"] == "slo_id"


def test_sql_looking_values_are_only_values(client: TestClient, store: Store) -> None:
    before = _counts(store)
    for hostile in ["' OR 1=1 --", "q-avail'; DROP TABLE slo_minute; --", "%", "*"]:
        assert client.get("/api/v1/slos", params={"slo_id": hostile}).json()["count"] == 0
        answer = client.get("/api/v1/findings", params={**RANGE, "scope_id": hostile})
        assert answer.status_code == 200 and answer.json()["count"] == 0
    assert _counts(store) == before
    assert client.get("/api/v1/slos").json()["count"] > 0


def test_openapi_lists_the_read_routes(client: TestClient) -> None:
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {case[1] for case in ROUTES} | {
        "/api/v1/slos/{slo_id}/budget",
        "/api/v1/meta",
        "/api/v1/flags",
        "/api/v1/alerts",
    } <= paths


#: A valid call of every read route, to which one hostile value is then applied.
VALID: dict[str, dict[str, Any]] = {
    "/api/v1/slos": {},
    "/api/v1/slos/q-avail/budget": {**SERIES, "objective": "0.99", "group": "pool:x"},
    "/api/v1/slos/series": {**SERIES, "slo_id": "q-avail"},
    "/api/v1/slos/alert-spans": {**SERIES, "slo_id": "q-avail", "pool": "p", "instance": POD},
    "/api/v1/findings": {**RANGE, "signal": "stall", "scope_id": POD, "state": "firing", "limit": 5},
    "/api/v1/findings/open": {"at_ms": END_MS},
    "/api/v1/flags": {"scope": "instance"},
    "/api/v1/flags/timeline": {**RANGE, "scope": "instance", "scope_id": POD, "limit": 5},
    "/api/v1/latency": {"metric": "ttft", **SERIES, "by": "pool", "pool": "p", "instance": POD},
    "/api/v1/outcomes": {**SERIES, "by": "instance", "pool": "p", "instance": POD},
    "/api/v1/ghosts": {**SERIES, "ghost_grace_s": "2", "pool": "p", "instance": POD},
    "/api/v1/engines": {"signals": "kv_usage", **SERIES, "instances": POD, "pool": "p"},
    "/api/v1/gpus": {"signals": "gpu_util", **SERIES, "instances": POD, "hostname": "h"},
}  # fmt: skip
HOSTILE_VALUES = ["' OR 1=1 --", "1; DROP TABLE requests", "", "\x00", "-1", "9" * 30, "nan", "1e309", "ü" * 300]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "parameter"),
    [(path, name) for path, params in VALID.items() for name in params],
)
def test_every_parameter_of_every_route_takes_hostile_values_without_harm(
    client: TestClient, store: Store, path: str, parameter: str
) -> None:
    assert client.get(path, params=VALID[path]).status_code == 200
    before = _counts(store)
    for value in HOSTILE_VALUES:
        answer = client.get(path, params={**VALID[path], parameter: value})
        assert answer.status_code in (200, 400), (value, answer.text)
        if answer.status_code == 400:
            named = answer.json()["parameter"]
            # A range check names the end of the range it found wrong.
            assert named == parameter or {named, parameter} <= {"start_ms", "end_ms", "bucket_ms"}
        else:
            assert isinstance(answer.json()["count"], int)
    assert _counts(store) == before
