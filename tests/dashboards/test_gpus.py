"""GPUs are joined to the engine they serve: dcgm-exporter's ``pod`` label names the engine
instance, so the read API, the HTTP route and the GPUs page name GPUs by engine, and the
page's instance and pool filters show that engine's GPUs only.

The history has two pods per node (4 pods on node-0 and node-1), so an exporter (one per
node) reports the GPUs of two engines: filtering on the exporter would show both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from streamlit.testing.v1 import AppTest

import simulator.history as history
from api.app import create_app
from dashboards import SOURCE_ENV
from pipeline.schema import GPU_SAMPLES
from pipeline.store import Store
from slo import queries
from tests.dashboards.conftest import END_MS, HOUR_MS, POOL

START_MS = END_MS - 2 * HOUR_MS
SERIES: dict[str, Any] = {"start_ms": START_MS, "end_ms": END_MS, "bucket_ms": 10 * 60_000}
#: The engine whose GPU reported an XID (79: fallen off the bus) half an hour before the end.
XID_POD, XID_TS_MS = "pod-3", END_MS - 30 * 60_000


def _xid_sample() -> pa.Table:
    """One DCGM_FI_DEV_XID_ERRORS sample of pod-3's GPU, as node-1's exporter reports it."""
    with_labels = {"err_code": "79", "err_msg": "GPU has fallen off the bus"}
    row = {
        "ts_ms": XID_TS_MS, "instance": "node-1", "hostname": "node-1", "gpu": 1,
        "uuid": "GPU-xid", "device": "nvidia1", "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpu_instance_id": None, "pod": XID_POD, "namespace": "default", "container": "engine",
        "metric": "DCGM_FI_DEV_XID_ERRORS", "signal": "xid",
        "labels_json": json.dumps(with_labels, sort_keys=True), "value": 79.0,
        "address": "10.43.0.2:9400",
    }  # fmt: skip
    return pa.Table.from_pylist([row], schema=GPU_SAMPLES.arrow)


@pytest.fixture(scope="module")
def two_per_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hours of 4 pods, 2 GPUs per node, plus one XID on pod-3's GPU."""
    path = tmp_path_factory.mktemp("gpus") / "two-per-node.duckdb"
    config = history.HistoryConfig(
        days=2 / 24, end_ts_ms=END_MS, pods=4, gpus_per_node=2, incidents_per_day=0, seed=3
    )
    with Store(path) as store:
        for schema, table in history.HistoryGenerator(config).chunks():
            store.commit_batch({schema.table: [table]}, group_id="h", offsets={}, now_ts_ms=0)
        store.commit_batch(
            {GPU_SAMPLES.table: [_xid_sample()]}, group_id="x", offsets={}, now_ts_ms=0
        )
    return path


@pytest.fixture
def con(two_per_node: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """Read-only, and closed after each test: the pages open the file themselves."""
    with duckdb.connect(str(two_per_node), read_only=True) as opened:
        yield opened


def _gpus(table: pa.Table) -> set[tuple[Any, ...]]:
    rows = table.select(["instance", "pool", "exporter", "hostname", "gpu"]).to_pylist()
    return {tuple(row.values()) for row in rows}


def test_gpu_series_names_the_engine_each_gpu_serves(con: duckdb.DuckDBPyConnection) -> None:
    table = queries.gpu_series(con.cursor(), signals=["gpu_util"], **SERIES)
    assert _gpus(table) == {
        ("pod-0", POOL, "node-0", "node-0", 0),
        ("pod-1", POOL, "node-0", "node-0", 1),
        ("pod-2", POOL, "node-1", "node-1", 0),
        ("pod-3", POOL, "node-1", "node-1", 1),
    }
    # The exporter's host:port stays one click away.
    assert set(table["address"].to_pylist()) == {"10.43.0.1:9400", "10.43.0.2:9400"}


def test_the_instance_and_pool_filters_narrow_to_that_engines_gpus(
    con: duckdb.DuckDBPyConnection,
) -> None:
    one = queries.gpu_series(con.cursor(), signals=["gpu_util"], instances=["pod-1"], **SERIES)
    assert _gpus(one) == {("pod-1", POOL, "node-0", "node-0", 1)}
    pool = queries.gpu_series(con.cursor(), signals=["gpu_util"], pool=POOL, **SERIES)
    assert len(_gpus(pool)) == 4
    other = queries.gpu_series(con.cursor(), signals=["gpu_util"], pool="other", **SERIES)
    assert other.num_rows == 0


def test_the_gpu_route_answers_with_the_engine_column(con: duckdb.DuckDBPyConnection) -> None:
    with TestClient(create_app(con.cursor, token="t", read_only=True)) as client:
        answer = client.get(
            "/api/v1/gpus", params={"signals": "xid", "instances": XID_POD, **SERIES}
        )
    assert answer.status_code == 200, answer.text
    rows = answer.json()["data"]
    assert {row["instance"] for row in rows} == {XID_POD}
    assert max(row["value_max"] for row in rows) == 79.0
    assert {row["exporter"] for row in rows} == {"node-1"}


@pytest.fixture
def on_two_per_node(two_per_node: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(SOURCE_ENV, f"db:{two_per_node}")
    return two_per_node


def _gpus_page(**query: str) -> AppTest:
    app = AppTest.from_string(
        "from dashboards.views import PAGES\nPAGES['gpus'][2]()\n", default_timeout=60
    )
    for key, value in query.items():
        app.query_params[key] = value
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def _drawn_gpus(app: AppTest) -> set[str]:
    """The GPU names every chart of the page draws a line for."""
    names: set[str] = set()
    for chart in app.get("vega_lite_chart"):
        for dataset in chart.proto.datasets:
            rows = pa.ipc.open_stream(dataset.data.data).read_all().to_pylist()
            names |= {row["gpu"] for row in rows if "gpu" in row}
    return names


def test_the_gpus_page_filtered_on_one_engine_shows_only_its_gpus(on_two_per_node: Path) -> None:
    frm, to = str(START_MS), str(END_MS)
    everyone = _drawn_gpus(_gpus_page(**{"from": frm, "to": to}))
    assert everyone == {f"pod-{i} · node-{i // 2}/GPU {i % 2}" for i in range(4)}
    assert _drawn_gpus(_gpus_page(**{"from": frm, "to": to, "instance": "pod-1"})) == {
        "pod-1 · node-0/GPU 1"
    }


def test_xid_events_on_the_page_carry_the_engine(on_two_per_node: Path) -> None:
    app = _gpus_page(**{"from": str(START_MS), "to": str(END_MS)})
    xids = [df.value for df in app.dataframe if "last XID code" in df.value.columns]
    assert len(xids) == 1
    table = xids[0]
    assert table["engine"].tolist() == [XID_POD] and table["last XID code"].tolist() == [79.0]
    assert table["address"].tolist() == ["10.43.0.2:9400"]
    # Filtered on another engine of the same node, the XID is not that engine's.
    other = _gpus_page(**{"from": str(START_MS), "to": str(END_MS), "instance": "pod-2"})
    assert "No XID error reported in this range." in [c.value for c in other.caption]
