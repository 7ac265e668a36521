"""SLO jobs over the lake: two ingesters' exports give the answers of one ingester's file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from pipeline.lake import create_lake_views, export_hours
from pipeline.store import Store
from pipeline.units import HOUR_MS
from slo.jobs import SloJobs
from slo.sinks import ListTransitionSink
from tests.slo.factories import T0_MS, insert
from tests.slo.fleet import FleetTimeline
from tests.slo.test_jobs import CONFIG, MODEL, kv_leak

FLEET = FleetTimeline(instances=4, seconds=900).add_fault(1, 300, kv_leak)


def _cycles(con: duckdb.DuckDBPyConnection) -> tuple[list[Any], list[Any]]:
    """Transitions and every SLO status of one cycle per 30 s over the fleet's timeline."""
    sink = ListTransitionSink()
    jobs = SloJobs(con, MODEL, CONFIG, sink=sink)
    statuses = []
    for t in range(480, FLEET.seconds + 1, 30):
        result = jobs.run_once(T0_MS + t * 1000)
        assert result is not None and result.errors == []
        statuses += [
            (s.slo.name, sorted(s.group.items()), s.ts_ms, sorted(s.windows.items()))
            for s in result.statuses
        ]
    transitions = [
        (t.scope, t.scope_id, t.from_level, t.to_level, t.reason, t.ts_ms) for t in sink.transitions
    ]
    return transitions, sorted(statuses, key=repr)


def _rows_of(rows: list[dict[str, Any]], instances: set[str]) -> list[dict[str, Any]]:
    return [row for row in rows if row["instance"] in instances]


def test_the_jobs_over_two_ingesters_lake_equal_the_jobs_over_one_file(tmp_path: Path) -> None:
    requests, engine, gpu = FLEET.rows()
    with Store(tmp_path / "single.duckdb") as single:
        insert(single, requests=requests, engine=engine, gpu=gpu)
        expected = _cycles(single.con)
    # Two ingesters, each owning half of the instances (Kafka partitions are keyed by
    # instance), export to one lake; the open hour too, as the jobs role needs.
    lake = tmp_path / "lake"
    halves = [{FLEET.instance(0), FLEET.instance(2)}, {FLEET.instance(1), FLEET.instance(3)}]
    for name, instances in zip(["ingest-a", "ingest-b"], halves, strict=True):
        with Store(tmp_path / f"{name}.duckdb") as store:
            insert(
                store,
                requests=_rows_of(requests, instances),
                engine=_rows_of(engine, instances),
                gpu=_rows_of(gpu, instances),
            )
            written = export_hours(
                store, lake, name, now_ts_ms=FLEET.end_ms + HOUR_MS, include_open=True
            )
            assert written
    with duckdb.connect(str(tmp_path / "jobs.duckdb")) as jobs_con:
        create_lake_views(jobs_con, lake)
        assert _cycles(jobs_con) == expected
    assert expected[0], "the fault raised flags: the comparison covers transitions"


def test_an_empty_lake_gives_typed_empty_views(tmp_path: Path) -> None:
    with duckdb.connect() as con:
        create_lake_views(con, tmp_path / "lake")
        assert con.execute("SELECT count(*) FROM engine_samples").fetchall() == [(0,)]
        types = dict(con.execute("DESCRIBE requests").fetchall()[i][:2] for i in range(3))
        assert types  # columns exist with their types


def test_hours_exported_before_a_column_was_added_read_it_as_null(tmp_path: Path) -> None:
    # An older release's export has no `dialect` column (nullable, added later).
    part = tmp_path / "lake" / "engine_samples" / "date=2025-11-29" / "hour=08"
    part.mkdir(parents=True)
    with duckdb.connect() as con:
        con.execute(
            f"COPY (SELECT 1000::BIGINT AS ts_ms, 'pod-0' AS instance, 'vllm:x' AS metric, "
            f"'running' AS signal, 'gauge' AS kind, 1.5 AS value) TO '{part / 'old.parquet'}'"
        )
        create_lake_views(con, tmp_path / "lake")
        rows = con.execute("SELECT instance, dialect, value FROM engine_samples").fetchall()
    assert rows == [("pod-0", None, 1.5)]
