"""The read API over a day of generated history with an incident, on both kinds of connection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import simulator.history as history
from pipeline.errors import LlmsloError, QueryError
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from pipeline.units import HOUR_MS, MINUTE_MS
from slo import queries
from slo.evaluate import evaluate
from slo.flags import FlagTransition
from slo.jobs import JobsConfig, SloJobs
from slo.rollups.counts import Rollup
from slo.signals.findings import Finding
from slo.sinks import StoreTransitionSink, create_output_tables, write_findings, write_status
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.slo.factories import engine_sample, insert

END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS
START_MS = END_MS - 86_400_000
POD = "pod-0"  # the history simulator names its pods (host:port in address)
MODEL = build_model(
    parse_spec(
        {
            "version": "llmslo/v1",
            "service": "q",
            "slos": [
                {"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}},
                {
                    "name": "ttft",
                    "objective": 0.995,
                    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.5},
                    "group_by": ["instance"],
                },
            ],
        }
    )
)


def _tap_rows() -> pa.Table:
    """Requests the generator does not make: ITL gaps, a ghost, a NaN, hostile text."""
    rows: list[dict[str, Any]] = [
        {
            "request_id": "itl-1",
            "received_ts_ms": END_MS - 30 * MINUTE_MS,
            "itl_gaps_s": [0.01, 0.02, 0.03],
        },
        {"request_id": "itl-2", "received_ts_ms": END_MS - 29 * MINUTE_MS, "itl_gaps_s": [0.05]},
        {
            "request_id": "ghost-1",
            "received_ts_ms": END_MS - 20 * MINUTE_MS,
            "outcome": "client_cancelled",
            "client_disconnected": True,
            "disconnect_ts_ms": END_MS - 20 * MINUTE_MS + 1_000,
            "upstream_closed_ts_ms": END_MS - 20 * MINUTE_MS + 9_000,  # 8 s after: a ghost
            "tokens_after_disconnect": 40,
        },
        {
            "request_id": "quick-close",
            "received_ts_ms": END_MS - 20 * MINUTE_MS,
            "outcome": "client_cancelled",
            "client_disconnected": True,
            "disconnect_ts_ms": END_MS - 20 * MINUTE_MS + 1_000,
            "upstream_closed_ts_ms": END_MS - 20 * MINUTE_MS + 1_100,
        },
        {"request_id": "nan", "received_ts_ms": END_MS - 10 * MINUTE_MS, "ttft_s": float("nan")},
    ]
    defaults = {"attempt": 1, "instance": POD, "pool": "tap-pool", "outcome": "ok"}
    full = [{**defaults, **row} for row in rows]
    return pa.Table.from_pylist(
        [{f.name: row.get(f.name) for f in REQUEST_RECORDS.arrow} for row in full],
        schema=REQUEST_RECORDS.arrow,
    )


def _finding(ts_ms: int, scope_id: str, **evidence: Any) -> Finding:
    return Finding(
        ts_ms, "stall", "instance", scope_id, "llama-3-8b", "page", "signature", evidence
    )


def _transition(ts_ms: int, scope_id: str, before: int, after: int) -> FlagTransition:
    return FlagTransition(
        ts_ms, "instance", scope_id, "llama-3-8b", before, after, 0.04, "kv", {"kv": 0.96}
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    path = tmp_path_factory.mktemp("queries") / "q.duckdb"
    config = history.HistoryConfig(days=1, end_ts_ms=END_MS, pods=3, incidents_per_day=1, seed=5)
    generator = history.HistoryGenerator(config)
    with Store(path) as store:
        for schema, table in generator.chunks():
            store.commit_batch({schema.table: [table]}, group_id="h", offsets={}, now_ts_ms=0)
        store.commit_batch({"requests": [_tap_rows()]}, group_id="h", offsets={}, now_ts_ms=0)
        Rollup(store.con, MODEL).update(END_MS)
        create_output_tables(store.con)
        write_status(store.con, evaluate(store.con, MODEL, END_MS))
        write_findings(
            store.con, END_MS - 3 * HOUR_MS, "firing", [_finding(END_MS - 3 * HOUR_MS, POD, x=1)]
        )
        write_findings(
            store.con, END_MS - 2 * HOUR_MS, "resolved", [_finding(END_MS - 2 * HOUR_MS, POD)]
        )
        write_findings(
            store.con, END_MS - HOUR_MS, "firing", [_finding(END_MS - HOUR_MS, "pod-b", y="it's")]
        )
        StoreTransitionSink(store.con).write(
            [
                _transition(END_MS - 5 * HOUR_MS, POD, 0, 2),
                _transition(END_MS - 4 * HOUR_MS, POD, 2, 1),
            ]
        )
    return path, generator.incidents


@pytest.fixture(params=["cursor of the writer", "read-only file"])
def con(request: pytest.FixtureRequest, built: Any) -> Iterator[duckdb.DuckDBPyConnection]:
    path, _ = built
    if request.param == "read-only file":
        connection = duckdb.connect(str(path), read_only=True)
        yield connection
        connection.close()
    else:
        with Store(path) as store:
            yield store.con.cursor()


def test_status_has_one_row_per_slo_group_with_budget_and_alerting(con: Any) -> None:
    status = queries.slo_status(con)
    assert status.schema == queries.STATUS_SCHEMA
    assert set(status["slo_id"].to_pylist()) == {"q-avail", "q-ttft"}
    ttft_groups = [
        json.loads(g) for g in queries.slo_status(con, slo_id="q-ttft")["group_json"].to_pylist()
    ]
    assert len(ttft_groups) == 3 and all("instance" in g for g in ttft_groups)
    row = queries.slo_status(con, slo_id="q-avail").to_pylist()[0]
    stored = json.loads(row["status_json"])
    assert row["budget_remaining"] == pytest.approx(stored["budget_remaining"])
    assert row["events"] == stored["events"] > 500 and row["objective"] == 0.99
    assert row["alerting"] == any(p["alerting"] for p in stored["pairs"])


def test_budget_series_adds_up_to_the_rollups_and_the_incident_burns(con: Any, built: Any) -> None:
    _, (incident,) = built
    series = queries.budget_series(
        con, slo_id="q-avail", objective=0.99, start_ms=START_MS, end_ms=END_MS, bucket_ms=HOUR_MS
    )
    assert series.schema == queries.BUDGET_SCHEMA
    rows = series.to_pylist()
    # Every record but the client's own doing (a cancel, a 4xx other than 429) is an event.
    (raw_total,) = con.execute(
        "SELECT count(*) FROM requests WHERE received_ts_ms >= ? "
        "AND outcome <> 'client_cancelled' AND NOT (outcome <> 'ok' "
        "AND coalesce(http_status BETWEEN 400 AND 499 AND http_status <> 429, false))",
        [START_MS],
    ).fetchone()
    assert sum(r["total"] for r in rows) == raw_total
    for r in rows:
        assert r["burn_rate"] == pytest.approx(r["bad"] / r["total"] / 0.01)
    last = rows[-1]
    bad, total = sum(r["bad"] for r in rows), sum(r["total"] for r in rows)
    assert last["budget_remaining"] == pytest.approx(1 - bad / (0.01 * total))
    during = [r for r in rows if incident - HOUR_MS < r["bucket_ts_ms"] <= incident + HOUR_MS]
    quiet = [r for r in rows if abs(r["bucket_ts_ms"] - incident) > 3 * HOUR_MS]
    assert max(r["burn_rate"] for r in during) > 3 * np.median([r["burn_rate"] for r in quiet])
    # Minute buckets over the same hours agree with hour buckets, and a group narrows them.
    minutes = queries.budget_series(
        con, slo_id="q-ttft", objective=0.995, start_ms=END_MS - 6 * HOUR_MS, end_ms=END_MS,
        bucket_ms=10 * MINUTE_MS,
    )  # fmt: skip
    one_pod = queries.budget_series(
        con, slo_id="q-ttft", objective=0.995, start_ms=END_MS - 6 * HOUR_MS, end_ms=END_MS,
        bucket_ms=10 * MINUTE_MS, group={"instance": POD},
    )  # fmt: skip
    assert 0 < pa.compute.sum(one_pod["total"]).as_py() < pa.compute.sum(minutes["total"]).as_py()


def test_findings_newest_first_with_evidence_and_open_ones(con: Any) -> None:
    listed = queries.findings(con, start_ms=START_MS, end_ms=END_MS).to_pylist()
    assert [(f["state"], f["scope_id"]) for f in listed] == [
        ("firing", "pod-b"),
        ("resolved", POD),
        ("firing", POD),
    ]
    assert json.loads(listed[0]["evidence_json"]) == {"y": "it's"}
    assert (
        queries.findings(con, start_ms=START_MS, end_ms=END_MS, state="resolved", limit=1).num_rows
        == 1
    )
    assert queries.open_findings(con)["scope_id"].to_pylist() == ["pod-b"]
    assert queries.open_findings(con, at_ms=END_MS - 150 * MINUTE_MS)["scope_id"].to_pylist() == [
        POD
    ]


def test_flag_timeline_and_current_flags(con: Any) -> None:
    timeline = queries.flag_timeline(con, start_ms=START_MS, end_ms=END_MS, scope_id=POD)
    assert [(r["from_level"], r["to_level"]) for r in timeline.to_pylist()] == [(0, 2), (2, 1)]
    latest_only = queries.flag_timeline(con, start_ms=START_MS, end_ms=END_MS, limit=1)
    assert latest_only["to_level"].to_pylist() == [1]
    assert queries.current_flags(con)["to_level"].to_pylist() == [1]
    assert queries.current_flags(con, at_ms=END_MS - 270 * MINUTE_MS)["to_level"].to_pylist() == [2]
    assert queries.current_flags(con, at_ms=START_MS).num_rows == 0


@pytest.mark.parametrize("metric", ["ttft", "tpot", "e2e"])
def test_latency_percentiles_match_numpy_on_the_raw_rows(con: Any, metric: Any) -> None:
    start = END_MS - 2 * HOUR_MS
    table = queries.latency_percentiles(
        con, metric=metric, start_ms=start, end_ms=END_MS, bucket_ms=HOUR_MS, by="instance"
    )
    assert table.schema == queries.LATENCY_SCHEMA
    for row in table.to_pylist():
        values = np.array(
            [
                v
                for (v,) in con.execute(
                    f"SELECT {metric}_s FROM requests WHERE instance = ? AND received_ts_ms >= ? "
                    f"AND received_ts_ms < ? AND isfinite({metric}_s)",
                    [row["instance"], row["bucket_ts_ms"], row["bucket_ts_ms"] + HOUR_MS],
                ).fetchall()
            ]
        )
        assert row["samples"] == len(values)
        assert row["p99_s"] == pytest.approx(np.quantile(values, 0.99))
        assert row["p50_s"] == pytest.approx(np.quantile(values, 0.5))
        assert row["max_s"] == pytest.approx(values.max())
    pools = queries.latency_percentiles(
        con, metric=metric, start_ms=start, end_ms=END_MS, bucket_ms=HOUR_MS
    )
    assert set(pools["pool"].to_pylist()) == {"llama-3-8b"}  # the extra tap rows have no values
    assert pools["instance"].null_count == pools.num_rows


def test_itl_is_weighted_by_chunk_gaps(con: Any) -> None:
    table = queries.latency_percentiles(
        con,
        metric="itl",
        start_ms=END_MS - HOUR_MS,
        end_ms=END_MS,
        bucket_ms=HOUR_MS,
        pool="tap-pool",
    )
    (row,) = table.to_pylist()
    assert row["samples"] == 4 and row["max_s"] == pytest.approx(0.05)
    assert row["mean_s"] == pytest.approx((0.01 + 0.02 + 0.03 + 0.05) / 4)


def test_outcome_counts_cover_every_request(con: Any) -> None:
    table = queries.outcome_counts(
        con, start_ms=START_MS, end_ms=END_MS, bucket_ms=HOUR_MS, by="instance"
    )
    (raw,) = con.execute(
        "SELECT count(*) FROM requests WHERE received_ts_ms >= ?", [START_MS]
    ).fetchone()
    assert pa.compute.sum(table["attempts"]).as_py() == raw
    assert {"ok", "error_before_first_token", "client_cancelled"} <= set(
        table["outcome"].to_pylist()
    )


def test_ghost_counts_use_the_grace(con: Any) -> None:
    args: dict[str, Any] = {
        "start_ms": END_MS - HOUR_MS,
        "end_ms": END_MS,
        "bucket_ms": HOUR_MS,
        "instance": POD,
    }
    (row,) = queries.ghost_counts(con, **args).to_pylist()
    assert row["ghosts"] == 1 and row["tokens_after_disconnect"] == 40 and row["disconnects"] >= 2
    (lenient,) = queries.ghost_counts(con, ghost_grace_s=10, **args).to_pylist()
    assert lenient["ghosts"] == 0


def test_engine_series_gauges_average_and_counters_become_rates(con: Any) -> None:
    table = queries.engine_series(
        con, signals=["kv_usage", "generation_tokens"], start_ms=END_MS - HOUR_MS, end_ms=END_MS,
        bucket_ms=10 * MINUTE_MS, instances=[POD],
    )  # fmt: skip
    rows = table.to_pylist()
    assert {r["signal"] for r in rows} == {"kv_usage", "generation_tokens"}
    assert {r["instance"] for r in rows} == {POD}
    gauges = [r for r in rows if r["kind"] == "gauge"]
    counters = [r for r in rows if r["kind"] == "counter"]
    assert all(0 <= r["value"] <= r["value_max"] <= 1 for r in gauges)
    assert counters and all(r["value"] > 0 and r["value_max"] is None for r in counters)
    assert len({r["bucket_ts_ms"] for r in rows}) == 6


def test_gpu_series_per_gpu(con: Any) -> None:
    table = queries.gpu_series(
        con, signals=["gpu_util"], start_ms=END_MS - HOUR_MS, end_ms=END_MS, bucket_ms=HOUR_MS
    )
    assert table.num_rows > 0 and set(table["signal"].to_pylist()) == {"gpu_util"}
    assert all(r["value"] <= r["value_max"] for r in table.to_pylist())


def test_a_file_without_the_slo_tables_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "raw-only.duckdb"
    with Store(path):
        pass
    with duckdb.connect(str(path), read_only=True) as read_only:
        assert queries.slo_status(read_only).schema == queries.STATUS_SCHEMA
        assert queries.slo_status(read_only).num_rows == 0
        assert queries.findings(read_only, start_ms=0, end_ms=1).num_rows == 0


HOSTILE = [
    ("end before start", queries.findings, {"start_ms": END_MS, "end_ms": START_MS}, "end_ms"),
    ("a year-long range", queries.findings, {"start_ms": 0, "end_ms": 365 * 86_400_000}, "end_ms"),
    ("negative time", queries.flag_timeline, {"start_ms": -5, "end_ms": 10}, "start_ms"),
    ("a string for a time", queries.findings, {"start_ms": "0", "end_ms": 10}, "start_ms"),
    ("a bool for a time", queries.findings, {"start_ms": True, "end_ms": 10}, "start_ms"),
    ("a huge limit", queries.findings, {"start_ms": 0, "end_ms": 10, "limit": 10**9}, "limit"),
    ("a zero limit", queries.flag_timeline, {"start_ms": 0, "end_ms": 10, "limit": 0}, "limit"),
    (
        "SQL in a state",
        queries.findings,
        {"start_ms": 0, "end_ms": 10, "state": "x' OR 1=1"},
        "state",
    ),
    ("a NUL in an id", queries.slo_status, {"slo_id": "a\x00b"}, "slo_id"),
    ("an endless id", queries.slo_status, {"slo_id": "x" * 10_000}, "slo_id"),
    ("an unknown scope", queries.current_flags, {"scope": "cluster"}, "scope"),
    (
        "second buckets of a series read from minute rollups",
        queries.budget_series,
        {
            "slo_id": "q-avail",
            "objective": 0.99,
            "start_ms": 0,
            "end_ms": HOUR_MS,
            "bucket_ms": 5_000,
        },
        "bucket_ms",
    ),
    (
        "buckets of a second and a half",
        queries.outcome_counts,
        {"start_ms": 0, "end_ms": HOUR_MS, "bucket_ms": 1_500},
        "bucket_ms",
    ),
    (
        "too many buckets",
        queries.outcome_counts,
        {"start_ms": START_MS - 60 * 86_400_000, "end_ms": END_MS, "bucket_ms": MINUTE_MS},
        "bucket_ms",
    ),
    (
        "a column name as breakdown",
        queries.outcome_counts,
        {
            "start_ms": 0,
            "end_ms": HOUR_MS,
            "bucket_ms": MINUTE_MS,
            "by": "pool; DROP TABLE requests",
        },
        "by",
    ),
    (
        "an unknown metric",
        queries.latency_percentiles,
        {"metric": "ttft_s", "start_ms": 0, "end_ms": HOUR_MS, "bucket_ms": MINUTE_MS},
        "metric",
    ),
    (
        "an objective of 1",
        queries.budget_series,
        {
            "slo_id": "q-avail",
            "objective": 1.0,
            "start_ms": 0,
            "end_ms": HOUR_MS,
            "bucket_ms": HOUR_MS,
        },
        "objective",
    ),
    (
        "a NaN objective",
        queries.budget_series,
        {
            "slo_id": "q-avail",
            "objective": float("nan"),
            "start_ms": 0,
            "end_ms": HOUR_MS,
            "bucket_ms": HOUR_MS,
        },
        "objective",
    ),
    (
        "a group by an unknown column",
        queries.budget_series,
        {
            "slo_id": "q-avail",
            "objective": 0.99,
            "start_ms": 0,
            "end_ms": HOUR_MS,
            "bucket_ms": HOUR_MS,
            "group": {"1=1 OR pool": "x"},
        },
        "group",
    ),
    (
        "a bare string as signal list",
        queries.engine_series,
        {"signals": "kv_usage", "start_ms": 0, "end_ms": HOUR_MS, "bucket_ms": MINUTE_MS},
        "signals",
    ),
    (
        "no signals",
        queries.gpu_series,
        {"signals": [], "start_ms": 0, "end_ms": HOUR_MS, "bucket_ms": MINUTE_MS},
        "signals",
    ),
    (
        "a negative ghost grace",
        queries.ghost_counts,
        {"start_ms": 0, "end_ms": HOUR_MS, "bucket_ms": MINUTE_MS, "ghost_grace_s": -1},
        "ghost_grace_s",
    ),
]


@pytest.mark.parametrize(
    ("function", "kwargs", "parameter"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_parameters_are_refused_naming_the_parameter(
    con: Any, function: Any, kwargs: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(QueryError) as caught:
        function(con, **kwargs)
    assert caught.value.parameter == parameter
    assert str(caught.value).startswith(f"{parameter}: ")
    assert isinstance(caught.value, LlmsloError)
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] > 0


def test_values_that_look_like_sql_are_just_values(con: Any) -> None:
    for hostile in ["' OR 1=1 --", "q-avail'; DROP TABLE slo_minute; --", "%", "*"]:
        assert queries.slo_status(con, slo_id=hostile).num_rows == 0
        assert (
            queries.findings(con, start_ms=START_MS, end_ms=END_MS, scope_id=hostile).num_rows == 0
        )
    assert queries.slo_status(con).num_rows > 0


def test_the_jobs_tables_answer_through_a_cursor_while_the_jobs_write(
    tmp_path: Path, built: Any
) -> None:
    path, _ = built
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(path.read_bytes())
    with Store(copy) as store:
        jobs = SloJobs(store.con, MODEL, JobsConfig())
        reader = store.con.cursor()
        before = queries.slo_status(reader).num_rows
        jobs.run_once()
        assert queries.slo_status(reader).num_rows == before > 0


def test_present_tables_lists_tables_and_views_of_this_database_only(tmp_path: Path) -> None:
    with Store(tmp_path / "present.duckdb") as store:
        store.con.execute(f"ATTACH '{tmp_path / 'other.duckdb'}' AS other")
        store.con.execute("CREATE TABLE other.only_elsewhere (x INTEGER)")
        present = queries.present_tables(store.con.cursor())
    # engine_samples is a view over engine_samples_values; both count as present.
    assert {"engine_samples", "engine_samples_values", "requests"} <= present
    assert "only_elsewhere" not in present


@pytest.mark.parametrize("bucket_ms", [5_000, 15_000, MINUTE_MS], ids=["5 s", "15 s", "1 min"])
def test_a_counter_reads_its_rate_in_buckets_narrower_than_the_scrape_interval(
    tmp_path: Path, bucket_ms: int
) -> None:
    """10 tokens/s scraped every 7 s: each bucket's rate is 10/s, never 14 or 0."""
    start = END_MS
    samples = [
        engine_sample(start + i * 7_000, "generation_tokens", 70.0 * i, kind="counter")
        for i in range(40)
    ]
    with Store(tmp_path / "c.duckdb") as store:
        insert(store, engine=samples)
        table = queries.engine_series(
            store.con,
            signals=["generation_tokens"],
            start_ms=start + 7_000,
            end_ms=start + 39 * 7_000,
            bucket_ms=bucket_ms,
        )
    rates = [row["value"] for row in table.to_pylist()]
    scraped = {s["ts_ms"] // bucket_ms for s in samples[1:39]}  # buckets a scrape ends in
    assert len(rates) == len(scraped)
    assert rates == pytest.approx([10.0] * len(rates))
