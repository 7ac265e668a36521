"""The synthetic prober against real simulated pods on loopback: what a user sees in front."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from collectors.probe import PROBE_SOURCE, ProbeConfig, Prober
from llmslo.cli import main
from pipeline.schema import REQUEST_RECORDS, RecordSchema
from pipeline.store import Store
from simulator import Fleet, FleetConfig, PodConfig


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(FleetConfig(pods=[PodConfig(name="p0"), PodConfig(name="p1")])) as running:
        yield running


def _probe(url: str, **overrides: Any) -> dict[str, Any]:
    tables: list[pa.Table] = []

    def sink(schema: RecordSchema, table: pa.Table) -> None:
        assert schema is REQUEST_RECORDS
        tables.append(table)

    prober = Prober(ProbeConfig(url=url, interval_s=0.1, max_tokens=6, **overrides), sink)
    asyncio.run(prober.run(rounds=1))
    (table,) = tables
    assert table.schema == REQUEST_RECORDS.storage_arrow
    (row,) = table.to_pylist()
    return row


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_healthy_endpoint_gives_an_ok_probe_record_with_ttft_and_tpot(fleet: Fleet) -> None:
    row = _probe(fleet.pods[0].url)
    assert row["source"] == PROBE_SOURCE and row["outcome"] == "ok" and row["error_kind"] is None
    assert row["http_status"] == 200 and row["completion_tokens"] == 6
    assert 0 < row["ttft_s"] <= row["e2e_s"] and row["tpot_s"] > 0
    assert row["instance"] == fleet.pods[0].instance and row["route"] == "/v1/chat/completions"


def test_nothing_listening_is_a_refused_connection_not_an_exception() -> None:
    row = _probe(f"http://127.0.0.1:{_closed_port()}")
    assert (row["outcome"], row["error_kind"], row["http_status"]) == (
        "error_before_first_token",
        "connect_refused",
        None,
    )
    assert row["ttft_s"] is None


def test_an_endpoint_that_is_not_ready_is_a_rejection_with_its_status(fleet: Fleet) -> None:
    fleet.set_fault("p1", "not_ready")
    try:
        row = _probe(fleet.pods[1].url)
    finally:
        fleet.clear_fault("p1", "not_ready")
    assert (row["outcome"], row["error_kind"], row["http_status"]) == ("rejected", "http_503", 503)
    assert _probe(fleet.pods[1].url)["outcome"] == "ok"  # and nothing when the fault is off


def test_a_stream_cut_after_the_first_token_is_interrupted(fleet: Fleet) -> None:
    fleet.set_fault("p1", "failure_after_first_token", fraction=1.0, after_tokens=2)
    try:
        row = _probe(fleet.pods[1].url)
    finally:
        fleet.clear_fault("p1", "failure_after_first_token")
    assert (row["outcome"], row["error_kind"]) == ("interrupted_after_first_token", "stream_cut")
    assert row["ttft_s"] is not None and row["tpot_s"] is None


def test_a_silent_endpoint_times_out(fleet: Fleet) -> None:
    fleet.set_fault("p1", "stall")
    try:
        row = _probe(fleet.pods[1].url, timeout_s=1.0)
    finally:
        fleet.clear_fault("p1", "stall")
    assert row["outcome"] == "upstream_timeout" and row["error_kind"] in (
        "read_timeout",
        "connect_timeout",
    )
    assert 0.9 <= row["e2e_s"] < 5


def test_probe_records_are_stored_with_their_source_next_to_tap_records(
    tmp_path: Any, fleet: Fleet
) -> None:
    row = _probe(fleet.pods[0].url)
    tap_row = dict(row, request_id="tap-1", original_request_id="tap-1", source=None)
    with Store(tmp_path / "s.duckdb") as store:
        rows = pa.Table.from_pylist([row, tap_row], schema=REQUEST_RECORDS.storage_arrow)
        store.con.register("probe_rows", rows)
        store.con.execute("INSERT INTO requests BY NAME SELECT * FROM probe_rows")
        stored = store.con.execute(
            "SELECT request_id, source FROM requests ORDER BY request_id"
        ).fetchall()
    assert stored == [(row["request_id"], "probe"), ("tap-1", None)]


def test_llmslo_probe_publishes_its_records_through_the_bounded_publisher(
    fleet: Fleet, broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["probe", "--url", fleet.pods[0].url, "--rounds", "2", "--interval", "0.1"]
    assert main([*args, "--bootstrap-servers", broker.bootstrap_servers]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {
        "dropped_rows": 0,
        "probe": "stopped",
        "probes": 2,
        "ok": 2,
        "failed": {},
        "last_error": None,
        "published_rows": 2,
    }


def test_llmslo_probe_of_a_dead_url_exits_non_zero_and_says_why(
    broker: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    args = ["probe", "--url", url, "--rounds", "2", "--interval", "0.1"]
    assert main([*args, "--bootstrap-servers", broker.bootstrap_servers]) == 1
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["probes"], summary["ok"], summary["failed"]) == (2, 0, {"connect_refused": 2})
    assert f"every probe of {url} failed" in err
    assert f"cannot connect to {url}/v1/chat/completions: connection refused" in err
    assert "ssl:default" not in err


def test_a_nonsense_probe_interval_is_refused_by_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--url", "http://127.0.0.1:1", "--interval", "0"]) == 2
    assert "interval_s" in capsys.readouterr().err
