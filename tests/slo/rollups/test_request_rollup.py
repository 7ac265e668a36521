"""The request rollups answer the Latency page's questions as the raw records would.

Counts equal the raw ``count``/``count(DISTINCT …)``; percentiles are within the stated 1 %
of numpy's order statistic; recomputing is idempotent; late records are picked up; the SLO
jobs and ``llmslo sim history`` keep the rollups.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator.history as history
from llmslo.cli import main
from pipeline.store import Store
from pipeline.units import HOUR_MS, MINUTE_MS
from slo import queries
from slo.jobs import JobsConfig, SloJobs
from slo.queries.reads import LatencyMetric
from slo.rollups.requests import (
    RELATIVE_ERROR,
    RETRY_LOOKBACK_MS,
    RequestRollup,
    create_request_rollup_tables,
    outcome_minutes_sql,
    read_coverage,
    rollup_history,
)
from slo.spec import parse_spec
from slo.spec.model import build_model
from slo.tables import REQUEST_ROLLUP_TABLES
from tests.slo.factories import insert, request, to_table

END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS
START_MS = END_MS - 86_400_000
DOC = Path(__file__).resolve().parents[3] / "docs" / "tables.md"
METRICS = ("ttft", "tpot", "e2e", "itl")


def _retries_and_gaps() -> list[dict[str, Any]]:
    """What the generator does not make: retried client requests and ITL gaps."""
    t = END_MS - 5 * HOUR_MS + 30 * MINUTE_MS
    rows = [
        # rejected on pod-0 twice in one minute, then served by pod-1: one request per outcome
        request(t, request_id="c1", original_request_id="c1", instance="pod-0", outcome="rejected"),
        request(
            t + 5_000,
            request_id="c1-2",
            original_request_id="c1",
            attempt=2,
            instance="pod-0",
            outcome="rejected",
        ),
        request(
            t + 9_000,
            request_id="c1-3",
            original_request_id="c1",
            attempt=3,
            instance="pod-1",
            outcome="ok",
        ),
        # rejected on pod-0 and pod-2 across a minute boundary (same hour): one pool request
        request(
            t + 50_000,
            request_id="c2",
            original_request_id="c2",
            instance="pod-0",
            outcome="rejected",
        ),
        request(
            t + 75_000,
            request_id="c2-2",
            original_request_id="c2",
            attempt=2,
            instance="pod-2",
            outcome="rejected",
        ),
    ]
    for i in range(40):
        gaps = list(np.random.default_rng(i).lognormal(np.log(0.03), 0.5, 20 + i))
        at = END_MS - 8 * HOUR_MS - 30 * MINUTE_MS + i * 97_000
        rows.append(request(at, instance=f"pod-{i % 3}", itl_gaps_s=gaps))
    for row in rows:
        row["pool"] = row["model"] = "llama-3-8b"
    return rows


def _history(path: Path) -> None:
    config = history.HistoryConfig(days=1, end_ts_ms=END_MS, pods=3, incidents_per_day=1, seed=5)
    with Store(path) as store:
        for schema, table in history.HistoryGenerator(config).chunks():
            store.commit_batch({schema.table: [table]}, group_id="h", offsets={}, now_ts_ms=0)
        insert(store, _retries_and_gaps())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(raw only, raw + rollups) over the same day of history with retries and ITL gaps."""
    folder = tmp_path_factory.mktemp("request-rollup")
    raw, rolled = folder / "raw.duckdb", folder / "rolled.duckdb"
    _history(raw)
    rolled.write_bytes(raw.read_bytes())
    with Store(rolled) as store:
        assert rollup_history(store.con) > 0
    return raw, rolled


@pytest.fixture
def cons(files: tuple[Path, Path]) -> Iterator[tuple[Any, Any]]:
    raw, rolled = (duckdb.connect(str(path), read_only=True) for path in files)
    yield raw, rolled
    raw.close()
    rolled.close()


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


RANGES = {
    "the day in hours": (START_MS, END_MS, HOUR_MS),
    "an unaligned start and end in 10-minute buckets": (
        START_MS + 17_321,
        END_MS - 41_000,
        10 * MINUTE_MS,
    ),
    "three hours in minutes": (END_MS - 9 * HOUR_MS, END_MS - 6 * HOUR_MS, MINUTE_MS),
    "hours with an edge inside an hour": (START_MS + 25 * MINUTE_MS, END_MS, 2 * HOUR_MS),
}
SCOPES = {
    "per pool": {"by": "pool"},
    "per instance": {"by": "instance"},
    "one pool per instance": {"by": "instance", "pool": "llama-3-8b"},
    "one instance per pool": {"by": "pool", "instance": "pod-0"},
}


@pytest.mark.parametrize("scope", SCOPES.values(), ids=list(SCOPES))
@pytest.mark.parametrize("grid", RANGES.values(), ids=list(RANGES))
def test_outcome_counts_from_the_rollups_equal_the_raw_counts(
    cons: tuple[Any, Any], grid: tuple[int, int, int], scope: dict[str, str]
) -> None:
    raw, rolled = cons
    start, end, bucket = grid
    args: dict[str, Any] = {"start_ms": start, "end_ms": end, "bucket_ms": bucket, **scope}
    expected = queries.outcome_counts(raw, **args)
    answer = queries.outcome_counts(rolled, **args)
    assert answer.schema == queries.OUTCOMES_SCHEMA
    assert expected.num_rows > 0
    assert _rows(answer) == _rows(expected)


def test_retried_requests_count_once_per_outcome(cons: tuple[Any, Any]) -> None:
    _, rolled = cons
    t = END_MS - 5 * HOUR_MS
    args: dict[str, Any] = {"start_ms": t, "end_ms": t + HOUR_MS, "bucket_ms": HOUR_MS}
    per_pool = {
        row["outcome"]: (row["attempts"], row["requests"])
        for row in queries.outcome_counts(rolled, **args).to_pylist()
    }
    assert per_pool["rejected"] == (4, 2)  # c1 twice on pod-0, c2 on pod-0 and pod-2
    on_pod_0 = {
        row["outcome"]: (row["attempts"], row["requests"])
        for row in queries.outcome_counts(rolled, **args, by="instance").to_pylist()
        if row["instance"] == "pod-0"
    }
    assert on_pod_0["rejected"] == (3, 2)


def test_a_request_retried_across_buckets_counts_once_in_the_first(cons: tuple[Any, Any]) -> None:
    raw, rolled = cons
    t = END_MS - 5 * HOUR_MS + 30 * MINUTE_MS  # c2: pod-0 at +50 s, pod-2 at +75 s
    args: dict[str, Any] = {"start_ms": t, "end_ms": t + 2 * MINUTE_MS, "bucket_ms": MINUTE_MS}

    def rejected(con: Any) -> list[tuple[int, int]]:
        rows = queries.outcome_counts(con, **args).to_pylist()
        return [(r["attempts"], r["requests"]) for r in rows if r["outcome"] == "rejected"]

    assert rejected(raw) == [(3, 2), (1, 1)]  # distinct per bucket: c2 in both minutes
    assert rejected(rolled) == [(3, 2), (1, 0)]  # the rollup: once, where it first came


@pytest.mark.parametrize("metric", METRICS)
def test_sub_minute_buckets_read_the_raw_records_exactly_where_rollups_reach(
    cons: tuple[Any, Any], metric: LatencyMetric
) -> None:
    raw, rolled = cons
    start = END_MS - 8 * HOUR_MS - 30 * MINUTE_MS  # the ITL requests, every 97 s
    args: dict[str, Any] = {
        "start_ms": start,
        "end_ms": start + 20 * MINUTE_MS,
        "bucket_ms": 15_000,
    }
    answer = queries.latency_percentiles(rolled, metric=metric, **args, by="instance")
    assert read_coverage(rolled) is not None  # the rollups reach this range...
    assert _rows(answer) == _rows(
        queries.latency_percentiles(raw, metric=metric, **args, by="instance")
    )
    buckets = {row["bucket_ts_ms"] for row in answer.to_pylist()}
    assert len(buckets) > 5 and all(b % 15_000 == 0 for b in buckets)
    assert any(b % MINUTE_MS for b in buckets)  # ...yet buckets start inside minutes
    outcomes = queries.outcome_counts(rolled, **args)
    assert _rows(outcomes) == _rows(queries.outcome_counts(raw, **args))
    assert any(row["bucket_ts_ms"] % MINUTE_MS for row in outcomes.to_pylist())


def test_the_datas_first_time_reaches_back_into_the_rollups_once_raw_rows_are_pruned(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    pruned = tmp_path / "pruned.duckdb"
    pruned.write_bytes(files[1].read_bytes())
    with duckdb.connect(str(pruned)) as con:
        first_minute = con.execute("SELECT min(ts_ms) FROM request_minute").fetchone()
        assert first_minute is not None and first_minute[0] < END_MS - 6 * HOUR_MS
        con.execute("DELETE FROM requests WHERE received_ts_ms < ?", [END_MS - 6 * HOUR_MS])
        con.execute("DELETE FROM engine_samples_values WHERE ts_ms < ?", [END_MS - 6 * HOUR_MS])
        con.execute("DELETE FROM request_minute WHERE ts_ms < ?", [END_MS - 12 * HOUR_MS])
        assert queries.meta(con)["data_start_ms"] == first_minute[0] // HOUR_MS * HOUR_MS
        con.execute("DELETE FROM request_hour")  # the minutes alone still reach back
        assert queries.meta(con)["data_start_ms"] == END_MS - 12 * HOUR_MS


def _values(con: Any, metric: str, scope: dict[str, Any], row: dict[str, Any], end: int) -> Any:
    column = "unnest(itl_gaps_s)" if metric == "itl" else f"{metric}_s"
    group = "instance" if scope.get("by") == "instance" else "pool"
    bucket_end = min(row["bucket_ts_ms"] + scope["bucket_ms"], end)
    values = con.execute(
        f"SELECT v FROM (SELECT {column}::DOUBLE AS v, * FROM requests) "
        f"WHERE {group} = ? AND received_ts_ms >= ? AND received_ts_ms < ? AND isfinite(v)",
        [row[group], max(row["bucket_ts_ms"], scope["start_ms"]), bucket_end],
    ).fetchall()
    return np.array([v for (v,) in values])


def _within_bound(estimate: float, values: Any, q: float) -> bool:
    """Within α (relative) of the order statistic of rank ⌊q·(n − 1)⌋ (numpy "lower")."""
    exact = float(np.quantile(values, q, method="lower"))
    return abs(estimate - exact) <= RELATIVE_ERROR * exact * (1 + 1e-9)


@pytest.mark.parametrize("by", ["instance", "pool"])
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("grid", RANGES.values(), ids=list(RANGES))
def test_percentiles_from_the_rollups_are_within_one_percent_of_numpy(
    cons: tuple[Any, Any], metric: str, grid: tuple[int, int, int], by: str
) -> None:
    raw, rolled = cons
    start, end, bucket = grid
    scope = {"start_ms": start, "end_ms": end, "bucket_ms": bucket, "by": by}
    answer = queries.latency_percentiles(rolled, metric=metric, **scope)  # type: ignore[arg-type]
    exact = queries.latency_percentiles(raw, metric=metric, **scope)  # type: ignore[arg-type]
    assert answer.schema == queries.LATENCY_SCHEMA
    assert answer.num_rows == exact.num_rows > 0
    for row, exact_row in zip(answer.to_pylist(), exact.to_pylist(), strict=True):
        values = _values(raw, metric, scope, row, end)
        assert row["samples"] == exact_row["samples"] == len(values)
        assert row["mean_s"] == pytest.approx(values.mean())
        assert row["max_s"] == values.max()
        for name, q in (("p50_s", 0.5), ("p90_s", 0.9), ("p99_s", 0.99)):
            assert _within_bound(row[name], values, q), (name, row[name], values)


def _memory_requests(rows: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    from pipeline.schema import REQUEST_RECORDS

    con = duckdb.connect()
    arrow_rows = to_table(REQUEST_RECORDS, rows)  # noqa: F841 (read by name by DuckDB)
    con.execute("CREATE TABLE requests AS SELECT * FROM arrow_rows")
    return con


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(
        st.floats(min_value=1e-5, max_value=5e3, allow_nan=False), min_size=1, max_size=300
    ),
    minutes=st.lists(st.integers(0, 179), min_size=1, max_size=300),
    q=st.sampled_from([0.5, 0.9, 0.99]),
)
def test_any_values_in_any_minutes_stay_within_the_bound(
    values: list[float], minutes: list[int], q: float
) -> None:
    start = END_MS // (3 * HOUR_MS) * 3 * HOUR_MS  # one bucket of 3 hours
    stamps = [start + minutes[i % len(minutes)] * MINUTE_MS + i for i in range(len(values))]
    con = _memory_requests([request(ts, ttft_s=v) for ts, v in zip(stamps, values, strict=True)])
    RequestRollup(con).recompute(start, start + 3 * HOUR_MS, final=True)
    (row,) = queries.latency_percentiles(
        con, metric="ttft", start_ms=start, end_ms=start + 3 * HOUR_MS, bucket_ms=3 * HOUR_MS
    ).to_pylist()
    assert row["samples"] == len(values) and row["max_s"] == max(values)
    name = {0.5: "p50_s", 0.9: "p90_s", 0.99: "p99_s"}[q]
    assert _within_bound(row[name], np.array(values), q)


def _tables(con: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every rollup row; sums of seconds to 12 digits (summation order may differ)."""

    def row(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in values)

    return {
        name: sorted((row(r) for r in con.execute(f"SELECT * FROM {name}").fetchall()), key=repr)
        for name in REQUEST_ROLLUP_TABLES
    }


def test_recomputing_any_range_gives_the_same_rows(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "again.duckdb"
    copy.write_bytes(files[1].read_bytes())
    with Store(copy) as store:
        before = _tables(store.con)
        rollup = RequestRollup(store.con)
        rollup.recompute(END_MS - 7 * HOUR_MS + 13 * MINUTE_MS, END_MS - 2 * HOUR_MS, final=True)
        rollup.recompute(START_MS, END_MS, final=True)
        assert rollup_history(store.con) > 0
        assert _tables(store.con) == before


def test_late_records_are_read_raw_until_settled_then_rolled_up(store: Store) -> None:
    now = END_MS + 30 * MINUTE_MS
    insert(store, [request(END_MS + m * MINUTE_MS, instance="pod-0") for m in range(30)])
    rollup = RequestRollup(store.con, settle_ms=10 * MINUTE_MS)
    rollup.update(now)
    coverage = read_coverage(store.con)
    assert coverage is not None and coverage.settled_ms == now + MINUTE_MS - 10 * MINUTE_MS
    args: dict[str, Any] = {"start_ms": END_MS, "end_ms": now + MINUTE_MS, "bucket_ms": HOUR_MS}

    def attempts() -> int:
        return sum(queries.outcome_counts(store.con, **args)["attempts"].to_pylist())

    assert attempts() == 30
    late = request(now - 5 * MINUTE_MS, instance="pod-1")  # arrives after its minute was rolled
    insert(store, [late])
    assert attempts() == 31  # the unsettled tail is read raw
    minute = "SELECT sum(attempts) FROM request_minute WHERE ts_ms = ?"
    assert store.con.execute(minute, [now - 5 * MINUTE_MS]).fetchone() == (1,)
    rollup.update(now + 15_000)
    assert store.con.execute(minute, [now - 5 * MINUTE_MS]).fetchone() == (2,)
    assert attempts() == 31
    ttft = queries.latency_percentiles(store.con, metric="ttft", **args)
    assert ttft["samples"].to_pylist() == [31]


def test_the_jobs_cycle_keeps_the_request_rollups(store: Store) -> None:
    insert(store, [request(END_MS + m * MINUTE_MS, instance="pod-0") for m in range(20)])
    model = build_model(
        parse_spec(
            {
                "version": "llmslo/v1",
                "service": "s",
                "slos": [{"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}}],
            }
        )
    )
    result = SloJobs(store.con, model, JobsConfig()).run_once(END_MS + 20 * MINUTE_MS)
    assert result is not None and not result.errors
    assert store.con.execute("SELECT sum(attempts) FROM request_minute").fetchone() == (20,)
    assert store.con.execute("SELECT sum(attempts) FROM request_hour").fetchone() == (20,)


def test_sim_history_files_carry_the_request_rollups(tmp_path: Path) -> None:
    path = tmp_path / "h.duckdb"
    argv = ["sim", "history", "--days", "0.1", "--pods", "2", "--db", str(path), "--no-replay"]
    assert main([*argv, "--end-ts-ms", str(END_MS)]) == 0
    with duckdb.connect(str(path), read_only=True) as con:
        coverage = read_coverage(con)
        (raw,) = con.execute("SELECT count(*) FROM requests").fetchone() or (0,)
        (rolled,) = con.execute("SELECT sum(attempts) FROM request_hour").fetchone() or (0,)
    assert coverage is not None and coverage.settled_ms == coverage.watermark_ms  # all final
    assert raw == rolled > 0


def test_the_request_rollup_tables_are_declared_commented_and_documented(store: Store) -> None:
    create_request_rollup_tables(store.con)
    create_request_rollup_tables(store.con)
    rows = store.con.execute(
        "SELECT table_name, column_name, data_type, is_nullable, comment FROM duckdb_columns() "
        "WHERE database_name = current_database() AND table_name LIKE 'request\\_%' ESCAPE '\\' "
        "ORDER BY table_name, column_index"
    ).fetchall()
    declared = {
        (t.name, name): (type_.split()[0], "NOT NULL" not in type_, meaning)
        for t in REQUEST_ROLLUP_TABLES.values()
        for name, type_, meaning in t.columns
    }
    assert {(table, column) for table, column, *_ in rows} == set(declared)
    doc = DOC.read_text()
    for table, column, data_type, nullable, comment in rows:
        assert (data_type, nullable, comment) == declared[(table, column)]
        assert f"## `{table}`" in doc and f"| `{column}` |" in doc


def test_meta_names_the_same_instances_from_the_rollups(cons: tuple[Any, Any]) -> None:
    raw, rolled = cons
    assert queries.meta(rolled) == queries.meta(raw)
    assert {i["instance"] for i in queries.meta(rolled)["instances"]} == {
        "pod-0",
        "pod-1",
        "pod-2",
    }


def test_rollups_of_another_version_are_rebuilt_not_mixed(store: Store) -> None:
    insert(store, [request(END_MS + m * MINUTE_MS, instance="pod-0") for m in range(5)])
    rollup = RequestRollup(store.con)
    rollup.update(END_MS + 5 * MINUTE_MS)
    old = END_MS - 30 * 86_400_000  # a row only the older layout had
    store.con.execute("INSERT INTO request_hour VALUES (?, 'p', 'old', NULL, 'ok', 7, 7, 7)", [old])
    store.con.execute("UPDATE request_rollup_state SET version = version - 1")
    rollup.update(END_MS + 6 * MINUTE_MS)
    assert store.con.execute("SELECT sum(attempts) FROM request_hour").fetchone() == (5,)


def _told_history() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(rows at first, rows written later, the retry's first attempt): a request every 45 s
    over 80 minutes (an hour boundary inside), then failures 35 minutes late (far past the
    settle window), the retry of a request whose failed first attempt was rolled up before,
    and a fresh record."""
    first = request(END_MS + 20 * MINUTE_MS + 30_000, request_id="c9", original_request_id="c9",
                    instance="pod-0", outcome="rejected", http_status=503)  # fmt: skip
    before = [request(END_MS + i * 45_000, instance=f"pod-{i % 2}") for i in range(80)]
    late = [request(END_MS + 25 * MINUTE_MS + i * 1000, instance="pod-0", outcome="rejected",
                    http_status=503, ttft_s=None, tpot_s=None) for i in range(5)]  # fmt: skip
    retry = request(first["received_ts_ms"] + 2 * MINUTE_MS, request_id="c9-2",
                    original_request_id="c9", attempt=2, instance="pod-1")  # fmt: skip
    fresh = request(END_MS + 60 * MINUTE_MS + 10_000, instance="pod-1")
    return [*before, first], [*late, retry, fresh], first


def test_an_update_told_what_was_written_equals_a_rebuild_from_raw_rows(
    store: Store, tmp_path: Path
) -> None:
    """Told the earliest time of the records written since (as the Iceberg mirror reports
    it), an update recomputes exactly the minutes they change, late ones and a retried
    request's included: the tables equal a build from every raw row at once. (Before, each
    update recomputed the settle window only, and missed the failures 35 minutes late.)"""
    initial, later, _ = _told_history()
    insert(store, initial)
    rollup = RequestRollup(store.con, settle_ms=10 * MINUTE_MS)
    rollup.note_written({"requests": END_MS})
    rollup.update(END_MS + 59 * MINUTE_MS)
    rollup.note_written({})  # nothing new: the open minute is recomputed, nothing else
    rollup.update(END_MS + 60 * MINUTE_MS)
    insert(store, later)
    rollup.note_written({"requests": min(r["received_ts_ms"] for r in later)})
    rollup.update(END_MS + 61 * MINUTE_MS)
    told = _tables(store.con)
    with Store(tmp_path / "rebuilt.duckdb") as rebuilt:
        insert(rebuilt, [*initial, *later])
        RequestRollup(rebuilt.con, settle_ms=10 * MINUTE_MS).update(END_MS + 61 * MINUTE_MS)
        assert told == _tables(rebuilt.con)
    late = "SELECT sum(attempts) FROM request_minute WHERE outcome = 'rejected'"
    assert store.con.execute(late).fetchone() == (6,)


def test_the_jobs_tell_the_request_rollup_what_was_written(store: Store) -> None:
    """``SloJobs.note_written`` (the jobs over the Iceberg lake call it with the mirror's
    report) reaches the request rollup: records 35 minutes late are rolled up."""
    initial, later, _ = _told_history()
    insert(store, initial)
    model = build_model(parse_spec({"version": "llmslo/v1", "service": "s", "slos": [
        {"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}}]}))  # fmt: skip
    jobs = SloJobs(store.con, model, JobsConfig())
    jobs.note_written({"requests": END_MS})
    jobs.run_once(END_MS + 60 * MINUTE_MS)
    insert(store, later)
    jobs.note_written({"requests": min(r["received_ts_ms"] for r in later)})
    result = jobs.run_once(END_MS + 61 * MINUTE_MS)
    assert result is not None and not result.errors
    hour = "SELECT sum(attempts) FROM request_hour"
    assert store.con.execute(hour).fetchone() == (len(initial) + len(later),)


def test_latency_hours_are_summed_once_wholly_settled(store: Store) -> None:
    """The latency hours (the big ones) hold whole settled hours only: reads take the
    unsettled tail raw, so the open hour's bins are summed once, when it settles, not every
    update; the answers are the same before and after. (Before, every update re-summed the
    open hour: the first assertion fails there.)"""
    rows = [request(END_MS + i * 45_000, instance=f"pod-{i % 2}", ttft_s=0.1 + i / 100)
            for i in range(100)]  # fmt: skip
    insert(store, rows)
    rollup = RequestRollup(store.con, settle_ms=10 * MINUTE_MS)
    rollup.update(END_MS + 65 * MINUTE_MS)  # settled to END + 56 min: the first hour open
    latency = "SELECT count(*) FROM {}"
    for table in ("request_latency_hour", "request_latency_pool_hour"):
        assert store.con.execute(latency.format(table)).fetchone() == (0,)
    rolled = sum(1 for r in rows if r["received_ts_ms"] < END_MS + 66 * MINUTE_MS)
    assert store.con.execute("SELECT sum(attempts) FROM request_hour").fetchone() == (rolled,)
    args: dict[str, Any] = {
        "start_ms": END_MS,
        "end_ms": END_MS + 2 * HOUR_MS,
        "bucket_ms": HOUR_MS,
    }
    before = [
        queries.latency_percentiles(store.con, metric="ttft", by=by, **args)
        for by in ("pool", "instance")
    ]
    rollup.update(END_MS + 71 * MINUTE_MS)  # settled to END + 62 min: the first hour whole
    in_hour = sum(1 for r in rows if r["received_ts_ms"] < END_MS + HOUR_MS)
    for table in ("request_latency_hour", "request_latency_pool_hour"):
        samples = f"SELECT ts_ms, sum(samples) FROM {table} WHERE metric = 'ttft' GROUP BY ALL"
        assert store.con.execute(samples).fetchall() == [(END_MS, in_hour)]
    after = [
        queries.latency_percentiles(store.con, metric="ttft", by=by, **args)
        for by in ("pool", "instance")
    ]
    assert [_rows(t) for t in after] == [_rows(t) for t in before]


def _ranked_outcomes(con: duckdb.DuckDBPyConnection, start: int, end: int) -> list[Any]:
    """``request_minute`` rows by the definition: every attempt of the read (the range and
    the retry lookback before it) ranked within its request, instance (pool) and outcome."""
    return sorted(
        con.execute(
            f"""SELECT received_ts_ms // {MINUTE_MS} * {MINUTE_MS}, pool, instance, outcome,
                       count(*), count(*) FILTER (WHERE h), count(*) FILTER (WHERE p)
                FROM (SELECT *, row_number() OVER (PARTITION BY coalesce(original_request_id,
                        request_id), instance, outcome ORDER BY received_ts_ms, request_id) = 1 AS h,
                      row_number() OVER (PARTITION BY coalesce(original_request_id, request_id),
                        pool, outcome ORDER BY received_ts_ms, request_id) = 1 AS p
                      FROM requests WHERE received_ts_ms >= ? AND received_ts_ms < ?)
                WHERE received_ts_ms >= ? GROUP BY ALL""",
            [start - RETRY_LOOKBACK_MS, end, start],
        ).fetchall()
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(
        st.lists(  # one client request: its attempts' (delay s, instance, pool, outcome)
            st.tuples(st.integers(0, 400), st.integers(0, 2), st.integers(0, 1), st.booleans()),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=40,
    ),
    first_s=st.lists(st.integers(0, 1500), min_size=1, max_size=40),
    start_min=st.integers(0, 20),
)
def test_outcome_minutes_rank_only_retried_requests_with_the_same_counts(
    requests: list[list[tuple[int, int, int, bool]]], first_s: list[int], start_min: int
) -> None:
    """Only retried requests are ranked (the others are their own first attempt): the
    counts equal ranking every attempt of the read, for any retries across minutes,
    instances, pools, outcomes and the range's start."""
    rows = []
    for n, attempts in enumerate(requests):
        at = END_MS + first_s[n % len(first_s)] * 1000
        for k, (delay, inst, pool, ok) in enumerate(attempts):
            at += delay * 1000
            rows.append(request(at, request_id=f"c{n}-{k}", original_request_id=f"c{n}",
                                attempt=k + 1, instance=f"pod-{inst}", pool=f"pool-{pool}",
                                outcome="ok" if ok else "rejected"))  # fmt: skip
    con = _memory_requests(rows)
    start, end = END_MS + start_min * MINUTE_MS, END_MS + 40 * MINUTE_MS
    sql, params = outcome_minutes_sql(start, end)
    got = con.execute(
        f"SELECT ts_ms, pool, instance, outcome, attempts, requests, pool_requests FROM ({sql})",
        params,
    ).fetchall()
    assert sorted(got) == _ranked_outcomes(con, start, end)
