"""The SLO jobs over the Iceberg lake: the same answers as over one ingester's file.

Two ingesters append their halves of a fleet's records to Iceberg tables on moto's S3
server, in many small commits as the ingest path does; the jobs' mirror
(:class:`pipeline.iceberg.mirror.IcebergMirror`) loads them into the jobs' own file, and
every SLO status and flag transition of a 15-minute fault equals the single-file run's.
The mirror reads each data file once, across refreshes and restarts, reloads a rewritten
table, and never opens an hour older than its window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline._offsets import LogIdentity, StoredOffset
from pipeline.iceberg.config import IcebergConfig
from pipeline.iceberg.lake import IcebergLake
from pipeline.iceberg.mirror import IcebergMirror
from pipeline.iceberg.tables import lake_topics, to_lake
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, REQUEST_RECORDS, RecordSchema
from pipeline.store import Store
from pipeline.units import DAY_MS, HOUR_MS
from tests.pipeline.lake_servers import BUCKET, S3Server, s3_server
from tests.pipeline.test_lake_jobs import FLEET, _cycles, _rows_of
from tests.slo.factories import T0_MS, insert, to_table

__all__ = ["s3_server"]  # fixture

LOG = LogIdentity("cluster", "topic-id")
SCHEMAS: dict[str, RecordSchema] = {
    "requests": REQUEST_RECORDS,
    "engine_samples": ENGINE_SAMPLES,
    "gpu_samples": GPU_SAMPLES,
}


def _lake(s3: S3Server, tmp_path: Path) -> IcebergLake:
    config = IcebergConfig(
        catalog_uri=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=f"s3://{BUCKET}/warehouse",
        s3_endpoint=s3.endpoint,
        credentials_file=s3.credentials_file(tmp_path / "credentials"),
    )
    return IcebergLake(config, group_id="g", topics=lake_topics("t."))


def _append(
    lake: IcebergLake, table: str, rows: list[dict[str, Any]], partition: int, batches: int
) -> int:
    """``rows`` as ``batches`` commits, each with its partition's next offset; returns the
    data files written (one per commit with rows)."""
    size = max(1, -(-len(rows) // batches))
    topic = next(t for t, name in lake.topics.items() if name == table)
    files = 0
    for n, first in enumerate(range(0, len(rows), size)):
        part = to_table(SCHEMAS[table], rows[first : first + size])
        lake.append_batch({table: [part]}, {(topic, partition): StoredOffset(n + 1, LOG)})
        files += 1
    return files


def _live_files(lake: IcebergLake) -> int:
    """Data files in the current snapshots of the lake's tables."""
    total = 0
    for name in ("requests", "engine_samples", "gpu_samples", "target_health"):
        table = lake.table(name)
        table.refresh()
        total += len(list(table.scan().plan_files()))
    return total


def _count(store: Store, table: str) -> int:
    return store.count(table)


def test_the_jobs_over_the_iceberg_lake_equal_the_jobs_over_one_file(
    s3_server: S3Server, tmp_path: Path
) -> None:
    requests, engine, gpu = FLEET.rows()
    with Store(tmp_path / "single.duckdb") as single:
        insert(single, requests=requests, engine=engine, gpu=gpu)
        expected = _cycles(single.con)
    assert expected[0], "the fault raised flags: the comparison covers transitions"
    # Two ingesters, each owning half of the instances (Kafka partitions are keyed by
    # instance), append to one lake, each in several commits.
    halves = [{FLEET.instance(0), FLEET.instance(2)}, {FLEET.instance(1), FLEET.instance(3)}]
    writers = [_lake(s3_server, tmp_path) for _ in halves]
    files = 0
    for partition, (writer, instances) in enumerate(zip(writers, halves, strict=True)):
        for table, rows in (("requests", requests), ("engine_samples", engine)):
            files += _append(writer, table, _rows_of(rows, instances), partition, batches=3)
    files += _append(writers[1], "gpu_samples", gpu, 0, batches=3)  # the GPU exporters' partition
    assert files >= 2 * 2 * 3, "both ingesters wrote requests and engine samples in 3 commits"
    with Store(tmp_path / "jobs.duckdb") as jobs_store:
        mirror = IcebergMirror(_lake(s3_server, tmp_path), jobs_store, window_ms=30 * DAY_MS)
        report = mirror.refresh(FLEET.end_ms)
        # A commit writes a file per hour its rows span: the mirror read each once.
        assert report.files == _live_files(writers[0]) >= files
        assert report.rows == len(requests) + len(engine) + len(gpu)
        assert _cycles(jobs_store.con) == expected


def test_a_refresh_reads_only_new_files_and_a_restart_reads_none_twice(
    s3_server: S3Server, tmp_path: Path
) -> None:
    _, engine, _ = FLEET.rows()
    half = len(engine) // 2
    writer = _lake(s3_server, tmp_path)
    _append(writer, "engine_samples", engine[:half], 0, batches=2)
    path = tmp_path / "jobs.duckdb"
    with Store(path) as store:
        mirror = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=30 * DAY_MS)
        first = mirror.refresh(FLEET.end_ms)
        assert (first.files, first.rows) == (2, half)
        assert mirror.refresh(FLEET.end_ms).files == 0  # nothing new: nothing read
        _append(writer, "engine_samples", engine[half:], 0, batches=1)
        second = mirror.refresh(FLEET.end_ms)
        assert (second.files, second.rows) == (1, len(engine) - half)
        assert _count(store, "engine_samples") == len(engine)
    with Store(path) as store:  # the jobs restarted: their file remembers what it read
        again = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=30 * DAY_MS)
        assert again.refresh(FLEET.end_ms).files == 0
        assert _count(store, "engine_samples") == len(engine)


def _rows(store: Store, table: str) -> list[tuple[Any, ...]]:
    return store.con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def test_an_incremental_refresh_loads_what_a_full_load_does(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """Refreshes between commits read only the snapshots added since (no plan of the whole
    table), late rows of an older hour included, and end with the rows a mirror that
    planned the table whole loads; each reports the earliest event time it loaded."""
    requests, engine, _ = FLEET.rows()
    writer = _lake(s3_server, tmp_path)
    third = len(engine) // 3
    _append(writer, "engine_samples", engine[:third], 0, batches=2)
    _append(writer, "requests", requests[: len(requests) // 2], 1, batches=1)
    with Store(tmp_path / "incremental.duckdb") as store:
        mirror = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=30 * DAY_MS)
        assert sorted(mirror.refresh(FLEET.end_ms).planned) == ["engine_samples", "requests"]
        # Three commits of engine samples, the last of rows an hour late, and one of requests.
        late = [{**row, "ts_ms": row["ts_ms"] - HOUR_MS} for row in engine[third : 2 * third]]
        _append(writer, "engine_samples", engine[2 * third :], 0, batches=2)
        _append(writer, "engine_samples", late, 0, batches=1)
        _append(writer, "requests", requests[len(requests) // 2 :], 1, batches=1)
        report = mirror.refresh(FLEET.end_ms)
        assert report.planned == []
        assert report.changed_from_ms == {
            "engine_samples": min(row["ts_ms"] for row in late),
            "requests": min(row["received_ts_ms"] for row in requests[len(requests) // 2 :]),
        }
        assert report.rows == len(engine) - third + len(requests) - len(requests) // 2
        nothing = mirror.refresh(FLEET.end_ms)  # no commit since: no manifest read
        assert (nothing.files, nothing.planned, nothing.changed_from_ms) == (0, [], {})
        with Store(tmp_path / "full.duckdb") as full:
            whole = IcebergMirror(_lake(s3_server, tmp_path), full, window_ms=30 * DAY_MS)
            assert len(whole.refresh(FLEET.end_ms).planned) == 2
            for table in ("engine_samples", "requests"):
                assert _rows(store, table) == _rows(full, table)
            assert store.count("engine_samples") == len(engine)


def test_a_rewritten_table_is_reloaded_whole(s3_server: S3Server, tmp_path: Path) -> None:
    _, engine, _ = FLEET.rows()
    writer = _lake(s3_server, tmp_path)
    _append(writer, "engine_samples", engine, 0, batches=4)
    with Store(tmp_path / "jobs.duckdb") as store:
        mirror = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=30 * DAY_MS)
        mirror.refresh(FLEET.end_ms)
        # A compaction: the four files become one holding the same rows, minus one instance
        # (so the reload is visible in the counts).
        kept = [row for row in engine if row["instance"] != FLEET.instance(3)]
        table = writer.table("engine_samples")
        table.refresh()
        table.overwrite(to_lake("engine_samples", [to_table(ENGINE_SAMPLES, kept)]))
        report = mirror.refresh(FLEET.end_ms)
        assert report.reloaded == ["engine_samples"]
        assert report.files == 1
        assert _count(store, "engine_samples") == len(kept)


def test_hours_older_than_the_window_are_never_read(s3_server: S3Server, tmp_path: Path) -> None:
    _, engine, _ = FLEET.rows()
    old = [{**row, "ts_ms": row["ts_ms"] - 3 * DAY_MS} for row in engine]
    writer = _lake(s3_server, tmp_path)
    _append(writer, "engine_samples", old, 0, batches=1)
    _append(writer, "engine_samples", engine, 0, batches=1)
    with Store(tmp_path / "jobs.duckdb") as store:
        mirror = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=DAY_MS)
        report = mirror.refresh(FLEET.end_ms + HOUR_MS)
        assert (report.files, report.rows) == (1, len(engine))
        ((oldest,),) = store.con.execute("SELECT min(ts_ms) FROM engine_samples").fetchall()
        assert oldest >= T0_MS


def test_a_fetch_between_cycles_deletes_the_rows_that_left_the_window(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """The hourly prune of rows older than the window runs in a fetch (between cycles) when
    one is due, not only in a refresh (a cycle)."""
    _, engine, _ = FLEET.rows()
    _append(_lake(s3_server, tmp_path), "engine_samples", engine, 0, batches=1)
    with Store(tmp_path / "jobs.duckdb") as store:
        IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=DAY_MS).refresh(FLEET.end_ms)
        assert store.count("engine_samples") == len(engine)
        # Two days on, a restarted process following the lake: its first fetch prunes.
        later = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=DAY_MS)
        later.fetch(FLEET.end_ms + 2 * DAY_MS)
        assert store.count("engine_samples") == 0


def test_a_table_of_an_older_release_gains_the_columns_appended_since(
    s3_server: S3Server, tmp_path: Path
) -> None:
    import pyarrow as pa

    from pipeline.iceberg.tables import lake_arrow_schema

    _, engine, _ = FLEET.rows()
    lake = _lake(s3_server, tmp_path)
    table = lake.table("engine_samples")
    with table.update_schema() as update:  # as an older release created it: no `dialect`
        update.delete_column("dialect")
    old = lake_arrow_schema("engine_samples")
    old = pa.schema([f for f in old if f.name != "dialect"])
    rows = to_lake("engine_samples", [to_table(ENGINE_SAMPLES, engine[:10])]).select(old.names)
    table.refresh()
    table.append(rows)
    # This release opens it (an ingester starting), appends with the column, reads both.
    newer = _lake(s3_server, tmp_path)
    assert "dialect" in {f.name for f in newer.table("engine_samples").schema().fields}
    _append(newer, "engine_samples", engine[10:20], 0, batches=1)
    with Store(tmp_path / "jobs.duckdb") as store:
        IcebergMirror(newer, store, window_ms=30 * DAY_MS).refresh(FLEET.end_ms)
        dialects = store.con.execute(
            "SELECT dialect IS NULL, count(*) FROM engine_samples GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    assert dialects == [(False, 10), (True, 10)]


def test_rows_fetched_ahead_are_stored_then_reported_by_the_next_refresh_as_one_refresh_would(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """Fetches between commits (the jobs following the lake between cycles) load each new
    commit once, stored at once; the refresh after them loads only the last commit, the
    file then holds what a mirror that fetched nothing ahead holds, and the refresh reports
    what that mirror's refresh reports (rows, files, the earliest event time of everything
    stored since the last refresh); a rewrite seen by a fetch still reloads the table whole."""
    requests, engine, _ = FLEET.rows()
    writer = _lake(s3_server, tmp_path)
    third = len(engine) // 3
    _append(writer, "engine_samples", engine[:third], 0, batches=1)
    with (
        Store(tmp_path / "ahead.duckdb") as store,
        Store(tmp_path / "plain.duckdb") as plain_store,
    ):
        mirror = IcebergMirror(_lake(s3_server, tmp_path), store, window_ms=30 * DAY_MS)
        plain = IcebergMirror(_lake(s3_server, tmp_path), plain_store, window_ms=30 * DAY_MS)
        mirror.refresh(FLEET.end_ms), plain.refresh(FLEET.end_ms)
        late = [{**row, "ts_ms": row["ts_ms"] - HOUR_MS} for row in engine[third : 2 * third]]
        _append(writer, "engine_samples", late, 0, batches=1)
        fetched = mirror.fetch(FLEET.end_ms)
        assert (fetched.files, fetched.rows) == (1, len(late))
        assert mirror.fetch(FLEET.end_ms).files == 0  # fetched once
        assert store.count("engine_samples") == third + len(late)  # stored by the fetch
        _append(writer, "requests", requests, 1, batches=1)
        assert mirror.fetch(FLEET.end_ms).rows == len(requests)
        _append(writer, "engine_samples", engine[2 * third :], 0, batches=1)
        report, whole = mirror.refresh(FLEET.end_ms), plain.refresh(FLEET.end_ms)
        assert report.rows == whole.rows == len(late) + len(requests) + len(engine) - 2 * third
        assert (report.files, report.planned) == (whole.files, whole.planned)
        assert (
            report.changed_from_ms
            == whole.changed_from_ms
            == {
                "engine_samples": min(row["ts_ms"] for row in late),
                "requests": min(row["received_ts_ms"] for row in requests),
            }
        )
        for table in ("engine_samples", "requests"):
            assert _rows(store, table) == _rows(plain_store, table)
        # A compaction fetched ahead: the refresh reloads the table whole.
        table = writer.table("engine_samples")
        table.refresh()
        table.overwrite(to_lake("engine_samples", [to_table(ENGINE_SAMPLES, engine)]))
        mirror.fetch(FLEET.end_ms)
        reload = mirror.refresh(FLEET.end_ms)
        assert (reload.reloaded, reload.changed_from_ms) == (
            ["engine_samples"],
            {"engine_samples": None},
        )
        assert store.count("engine_samples") == len(engine)
