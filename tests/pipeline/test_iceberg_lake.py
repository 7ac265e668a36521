"""The Iceberg lake's commits on real parts: moto's S3 server and a PostgreSQL catalog.

Offsets ride in the same commit as the rows; concurrent writers conflict and retry without
losing or doubling; a wrong key is refused with the bucket and key named, nothing written.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline._offsets import LogIdentity, StoredOffset
from pipeline.codec import conform
from pipeline.iceberg.config import IcebergConfig
from pipeline.iceberg.lake import IcebergLake, LakeError
from pipeline.iceberg.tables import lake_topics
from pipeline.schema import ENGINE_SAMPLES
from tests.pipeline.ingest_helpers import numbered_samples
from tests.pipeline.lake_servers import BUCKET, S3Server, postgres, s3_server

__all__ = ["postgres", "s3_server"]  # fixtures

TOPIC = "t.engine"
LOG = LogIdentity("cluster", "topic-id")


def _config(s3: S3Server, catalog_uri: str, credentials: Path) -> IcebergConfig:
    return IcebergConfig(
        catalog_uri=catalog_uri,
        warehouse=f"s3://{BUCKET}/warehouse",
        s3_endpoint=s3.endpoint,
        credentials_file=credentials,
    )


def _lake(config: IcebergConfig) -> IcebergLake:
    return IcebergLake(config, group_id="g", topics=lake_topics("t."))


def _batch(first: int, count: int) -> dict[str, list[pa.Table]]:
    return {"engine_samples": [conform(ENGINE_SAMPLES, numbered_samples(first, count, "pod-0"))]}


def _values(lake: IcebergLake) -> list[float]:
    table = lake.table("engine_samples")
    table.refresh()
    return sorted(table.scan(selected_fields=("value",)).to_arrow()["value"].to_pylist())


def test_rows_and_their_offsets_land_in_one_commit_on_s3_with_a_postgres_catalog(
    s3_server: S3Server, postgres: str, tmp_path: Path
) -> None:
    lake = _lake(_config(s3_server, postgres, s3_server.credentials_file(tmp_path / "creds")))
    lake.append_batch(_batch(0, 100), {(TOPIC, 0): StoredOffset(10, LOG)})
    lake.append_batch(_batch(100, 50), {(TOPIC, 1): StoredOffset(7, LOG)})
    # A second process (another ingester) sees both partitions' offsets in the table.
    other = _lake(_config(s3_server, postgres, s3_server.credentials_file(tmp_path / "c2")))
    assert other.read_offsets() == {
        (TOPIC, 0): StoredOffset(10, LOG),
        (TOPIC, 1): StoredOffset(7, LOG),
    }
    assert _values(other) == [float(v) for v in range(150)]
    # Hourly partitions, data files on the S3 server.
    table = other.table("engine_samples")
    assert [f.name for f in table.spec().fields] == ["hour_ms"]
    assert any(key.endswith(".parquet") for key in s3_server.objects())


def test_concurrent_writers_conflict_retry_and_store_every_row_once(
    s3_server: S3Server, postgres: str, tmp_path: Path
) -> None:
    config = _config(s3_server, postgres, s3_server.credentials_file(tmp_path / "creds"))
    writers = [_lake(config) for _ in range(3)]
    conflicts = [0] * len(writers)

    def write(i: int) -> None:
        for n in range(6):  # writer i owns partition i
            first = (i * 6 + n) * 10
            report = writers[i].append_batch(
                _batch(first, 10), {(TOPIC, i): StoredOffset(n + 1, LOG)}
            )
            conflicts[i] += report.conflicts

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(conflicts) > 0, "three writers at once never conflicted: the test proves nothing"
    assert _values(writers[0]) == [float(v) for v in range(180)]
    assert writers[0].read_offsets() == {(TOPIC, i): StoredOffset(6, LOG) for i in range(3)}


def _data_keys(s3: S3Server) -> set[str]:
    return {key for key in s3.objects() if "/data/" in key and key.endswith(".parquet")}


def _live_keys(lake: IcebergLake) -> set[str]:
    table = lake.table("engine_samples")
    table.refresh()
    prefix = f"s3://{BUCKET}/"
    return {task.file.file_path.removeprefix(prefix) for task in table.scan().plan_files()}


def test_a_commit_that_lost_the_race_appends_the_files_it_wrote_and_leaves_none_behind(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """The loser of a commit race retries on the refreshed table with the data files it
    already wrote: every data file in the bucket is in the table, each row once."""
    config = _config(
        s3_server,
        f"sqlite:///{tmp_path / 'catalog.db'}",
        s3_server.credentials_file(tmp_path / "c"),
    )
    slow, fast = _lake(config), _lake(config)
    fast.append_batch(_batch(0, 10), {(TOPIC, 1): StoredOffset(1, LOG)})  # slow's view is old
    report = slow.append_batch(_batch(10, 10), {(TOPIC, 0): StoredOffset(1, LOG)})
    assert report.conflicts == 1
    assert _data_keys(s3_server) == _live_keys(fast)
    assert len(_live_keys(fast)) == 2
    assert _values(fast) == [float(v) for v in range(20)]
    assert fast.read_offsets() == {(TOPIC, i): StoredOffset(1, LOG) for i in range(2)}


def test_a_batch_across_an_hour_is_a_file_per_hour_read_back_as_the_lake_types(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """The batch keeps its dictionaries on the way in (two parts, two dictionaries each);
    readers see strings and ``int`` columns, and each hour's rows in that hour's file."""
    config = _config(
        s3_server,
        f"sqlite:///{tmp_path / 'catalog.db'}",
        s3_server.credentials_file(tmp_path / "c"),
    )
    lake = _lake(config)
    hour_ms = 1_790_002_800_000
    parts = [
        conform(ENGINE_SAMPLES, numbered_samples(hour_ms - 30, 20, "pod-0")),
        conform(ENGINE_SAMPLES, numbered_samples(hour_ms - 10, 40, "pod-1")),
    ]
    lake.append_batch({"engine_samples": parts}, {(TOPIC, 0): StoredOffset(2, LOG)})
    table = lake.table("engine_samples")
    files = sorted((t.file for t in table.scan().plan_files()), key=lambda f: f.partition[0])
    assert [(f.partition[0], f.record_count) for f in files] == [
        (hour_ms - 3_600_000, 30),
        (hour_ms, 30),
    ]
    rows = table.scan(row_filter=f"ts_ms >= {hour_ms}").to_arrow().sort_by("ts_ms")
    assert rows["ts_ms"].to_pylist() == list(range(hour_ms, hour_ms + 30))
    assert set(rows["instance"].to_pylist()) == {"pod-1"}
    assert pa.types.is_string(rows.schema.field("instance").type) or pa.types.is_large_string(
        rows.schema.field("instance").type
    )
    assert {f.name: f.type for f in rows.schema}["metric"] in (pa.string(), pa.large_string())
    assert _data_keys(s3_server) == _live_keys(lake)


def test_a_column_of_distinct_values_stops_its_parquet_dictionary_at_128_kib(
    tmp_path: Path,
) -> None:
    """100,000 distinct random sample values (800 kB of doubles): the data file's dictionary
    for them stops near 128 KiB (the writer looks at its size after each 20,000 values,
    ``write.parquet.page-row-limit``), the rest is plain-encoded; Iceberg's default would
    hold them all in a dictionary larger than the values."""
    import numpy as np
    import pyarrow.parquet as pq

    config = IcebergConfig(
        catalog_uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=str(tmp_path / "warehouse")
    )
    lake = _lake(config)
    samples = numbered_samples(0, 100_000, "pod-0")
    values = np.random.default_rng(1).random(100_000)
    samples = samples.set_column(samples.schema.get_field_index("value"), "value", [values])
    lake.append_batch(
        {"engine_samples": [conform(ENGINE_SAMPLES, samples)]}, {(TOPIC, 0): StoredOffset(1, LOG)}
    )
    (task,) = lake.table("engine_samples").scan().plan_files()
    metadata = pq.read_metadata(task.file.file_path.removeprefix("file://"))
    columns = [metadata.row_group(0).column(i) for i in range(metadata.num_columns)]
    (value,) = [c for c in columns if c.path_in_schema == "value"]
    dictionary_bytes = value.data_page_offset - value.dictionary_page_offset
    assert 0 < dictionary_bytes < 256 * 1024  # ~128 KiB, overshot by < 20,000 values
    assert sorted(_values(lake)) == sorted(values.tolist())


def test_a_wrong_secret_is_refused_naming_bucket_and_key_and_writes_nothing(
    s3_server: S3Server, tmp_path: Path
) -> None:
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    good = _lake(_config(s3_server, catalog, s3_server.credentials_file(tmp_path / "good")))
    before = set(s3_server.objects())
    bad_file = s3_server.credentials_file(tmp_path / "bad", secret="not-the-secret")
    with pytest.raises(LakeError) as refused:  # an ingester stops at start, before consuming
        _lake(_config(s3_server, catalog, bad_file))
    message = str(refused.value)
    assert f"bucket {BUCKET!r}" in message
    assert "key 'warehouse/llmslo/engine_samples/metadata/" in message
    assert "not-the-secret" not in message
    assert set(s3_server.objects()) == before
    assert good.read_offsets() == {}
    assert _values(good) == []


def _open_together(config: IcebergConfig, processes: int) -> list[BaseException]:
    """What ``processes`` ingesters opening the lake at the same instant die of."""
    start, failures = threading.Barrier(processes), list[BaseException]()

    def open_lake() -> None:
        start.wait()
        try:
            _lake(config)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_lake) for _ in range(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def test_ingesters_starting_together_on_a_new_catalog_all_open_the_lake(tmp_path: Path) -> None:
    """They all find the catalog's tables and the namespace missing and all create them: the
    catalog refuses the later inserts (integrity errors, not pyiceberg's "already exists"),
    which must not stop an ingester."""
    for attempt in range(6):
        root = tmp_path / str(attempt)
        root.mkdir()
        config = IcebergConfig(
            catalog_uri=f"sqlite:///{root / 'catalog.db'}", warehouse=str(root / "warehouse")
        )
        assert _open_together(config, 4) == []


def test_a_retry_line_names_the_failed_part_for_the_sql_and_rest_catalogs(tmp_path: Path) -> None:
    """The one-line retry log says which part is down: the catalog (an SQL driver's error, a
    REST catalog's refusal or its HTTP client's) or the object store (pyarrow's OSError)."""
    import requests
    import sqlalchemy.exc
    from pyiceberg.exceptions import ServiceUnavailableError

    config = IcebergConfig(
        catalog_uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=str(tmp_path / "warehouse")
    )
    lake = _lake(config)
    catalog = [
        sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused")),
        ServiceUnavailableError("503: the REST catalog is restarting"),
        requests.ConnectionError("Max retries exceeded with url: /v1/config"),
    ]
    for exc in catalog:
        said = lake._unreachable(exc)
        assert said.startswith("Iceberg catalog unreachable (sqlite:///"), said
        assert "\n" not in said
    said = lake._unreachable(OSError("When reading information for key 'x': timed out"))
    assert said.startswith("Iceberg object store unreachable"), said
