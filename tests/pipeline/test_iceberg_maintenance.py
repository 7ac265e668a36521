"""Lake maintenance on real parts (moto's S3 server, SQLite and PostgreSQL catalogs).

While another ingester appends batches with their offsets, a pass drops hours past
retention, compacts closed hours and expires snapshots: the table then holds exactly the
rows produced (none lost, none doubled), every partition resumes at its last offset, and
the data files are fewer. Expiry keeps the offsets; a maintainer that dropped them from
its snapshots is caught by the same check.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pytest
import yaml

from llmslo.cli import main
from llmslo.roles import maintain_lake_until
from llmslo.sections import load_config
from pipeline._offsets import LogIdentity, StoredOffset
from pipeline.codec import conform
from pipeline.config import StoreConfig
from pipeline.iceberg.config import IcebergConfig
from pipeline.iceberg.lake import IcebergLake
from pipeline.iceberg.maintenance import LakeMaintainer, MaintenancePolicy
from pipeline.iceberg.tables import lake_topics, to_lake
from pipeline.schema import ENGINE_SAMPLES
from pipeline.units import DAY_MS, HOUR_MS
from tests.pipeline.lake_servers import BUCKET, S3Server, postgres, s3_server

__all__ = ["postgres", "s3_server"]  # fixtures

TOPIC = "t.engine"
TABLE = "engine_samples"
LOG = LogIdentity("cluster", "topic-id")
T0_MS = 1_750_000_000_000 // HOUR_MS * HOUR_MS  # an hour's start
NOW_MS = T0_MS + 6 * HOUR_MS  # hours 0-4 are closed, hour 6 is open
POLICY = MaintenancePolicy(retention_ms=7 * DAY_MS, keep_ms=HOUR_MS)


def _config(s3: S3Server, catalog_uri: str, tmp_path: Path) -> IcebergConfig:
    return IcebergConfig(
        catalog_uri=catalog_uri,
        warehouse=f"s3://{BUCKET}/warehouse",
        s3_endpoint=s3.endpoint,
        credentials_file=s3.credentials_file(tmp_path / "credentials"),
    )


def _lake(config: IcebergConfig) -> IcebergLake:
    return IcebergLake(config, group_id="g", topics=lake_topics("t."))


def _batch(first: int, count: int, hour_ms: int) -> dict[str, list[pa.Table]]:
    """``count`` samples numbered from ``first`` (their ``value``), in the hour ``hour_ms``."""
    seq = np.arange(first, first + count, dtype=np.int64)
    rows = pa.table(
        {
            "ts_ms": hour_ms + seq % HOUR_MS,
            "instance": pa.array(["pod-0"] * count).dictionary_encode(),
            "metric": pa.array(["vllm:num_requests_running"] * count).dictionary_encode(),
            "signal": pa.array(["running"] * count).dictionary_encode(),
            "kind": pa.array(["gauge"] * count).dictionary_encode(),
            "value": seq.astype(np.float64),
        }
    )
    return {"engine_samples": [conform(ENGINE_SAMPLES, rows)]}


def _values(lake: IcebergLake) -> list[float]:
    table = lake.table("engine_samples")
    table.refresh()
    return sorted(table.scan(selected_fields=("value",)).to_arrow()["value"].to_pylist())


def _data_files(lake: IcebergLake) -> int:
    table = lake.table("engine_samples")
    table.refresh()
    return len(list(table.scan().plan_files()))


class _Ingester:
    """Appends numbered batches to the lake as one partition's owner, counting its offset."""

    def __init__(self, lake: IcebergLake, partition: int, topic: str = TOPIC) -> None:
        self.lake = lake
        self.partition = partition
        self.topic = topic
        self.offset = 0
        self.values: list[float] = []
        self.conflicts = 0

    def append(self, first: int, count: int, hour_ms: int) -> None:
        self.offset += 1
        report = self.lake.append_batch(
            _batch(first, count, hour_ms),
            {(self.topic, self.partition): StoredOffset(self.offset, LOG)},
        )
        self.conflicts += report.conflicts
        self.values += [float(v) for v in range(first, first + count)]


def test_a_pass_beside_a_committing_ingester_keeps_every_row_once_and_every_offset(
    s3_server: S3Server, postgres: str, tmp_path: Path
) -> None:
    # Event time and snapshot time both from the wall clock, as in production: hours 0-4
    # are closed, hour 6 is open (for an hour at least); every snapshot but the head is old
    # enough to expire.
    now_ms = int(time.time() * 1000)
    t0_ms = (now_ms - 6 * HOUR_MS) // HOUR_MS * HOUR_MS
    policy = MaintenancePolicy(retention_ms=7 * DAY_MS, keep_ms=0)
    config = _config(s3_server, postgres, tmp_path)
    seeded = _Ingester(_lake(config), partition=0)
    for n in range(3):  # past retention
        seeded.append(100_000 + n * 10, 10, t0_ms - 10 * DAY_MS)
    expected = []
    for hour in range(4):  # four closed hours, six small files each
        for n in range(6):
            first = (hour * 6 + n) * 10
            seeded.append(first, 10, t0_ms + hour * HOUR_MS)
            expected += [float(v) for v in range(first, first + 10)]
    files_before = _data_files(seeded.lake)
    # The other ingester (its own catalog connection) appends into the closed hours (late
    # batches) and the open one while the maintainer runs pass after pass.
    other = _Ingester(_lake(config), partition=1)
    hours = [0, 1, 2, 3, 4, 6]
    done = threading.Event()

    def ingest() -> None:
        try:
            for n in range(40):
                other.append(10_000 + n * 10, 10, t0_ms + hours[n % 6] * HOUR_MS)
        finally:
            done.set()

    maintainer = LakeMaintainer(_lake(config), policy)
    reports = []
    writer = threading.Thread(target=ingest)
    writer.start()
    while not done.is_set():
        reports.append(maintainer.maintain(TABLE, int(time.time() * 1000)))
    writer.join()
    reports.append(
        maintainer.maintain(TABLE, int(time.time() * 1000))
    )  # and once with the ingester stopped
    expected += other.values
    conflicts = sum(r.conflicts for r in reports) + other.conflicts
    assert conflicts > 0, "the maintainer and the ingester never raced: the test proves nothing"
    assert sum(r.hours_compacted for r in reports) >= 5
    assert sum(r.hours_dropped for r in reports) == 1
    assert sum(r.snapshots_expired for r in reports) > 0
    # Exactly the rows produced within retention: none lost, none doubled.
    assert _values(_lake(config)) == sorted(expected)
    # A partition's next owner (a fresh process) resumes where each ingester stood.
    assert _lake(config).read_offsets() == {
        (TOPIC, 0): StoredOffset(seeded.offset, LOG),
        (TOPIC, 1): StoredOffset(other.offset, LOG),
    }
    # One file per closed hour, the open hour's files as they were.
    open_files = sum(1 for n in range(40) if hours[n % 6] == 6)
    assert _data_files(seeded.lake) == 5 + open_files < files_before


def _referenced(lake: IcebergLake) -> set[str]:
    """``bucket/key`` of every file the table's metadata references, from pyiceberg's own
    metadata tables: metadata files, manifest lists, manifests, live data files."""
    table = lake.table(TABLE)
    table.refresh()
    metadata = table.metadata
    locations = {table.metadata_location, *(e.metadata_file for e in metadata.metadata_log)}
    locations |= {s.manifest_list for s in metadata.snapshots}
    locations |= set(table.inspect.all_manifests()["path"].to_pylist())
    locations |= set(table.inspect.all_files()["file_path"].to_pylist())
    return {urlsplit(location).netloc + urlsplit(location).path for location in locations}


def _stored(s3: S3Server, lake: IcebergLake) -> set[str]:
    """``bucket/key`` of every file under the table's location (not the empty "directory"
    objects pyarrow creates)."""
    prefix = lake.table(TABLE).location().removeprefix("s3://") + "/"
    keys = (f"{BUCKET}/{key}" for key in s3.objects() if not key.endswith("/"))
    return {key for key in keys if key.startswith(prefix)}


def _write_uncommitted(lake: IcebergLake, first: int, count: int, hour_ms: int) -> list[Any]:
    """Data files of a batch written as an ingester writes them before its commit."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    table = lake.table(TABLE)
    rows = to_lake(TABLE, _batch(first, count, hour_ms)[TABLE])
    return list(
        _dataframe_to_data_files(
            table_metadata=table.metadata, df=rows, io=table.io, write_uuid=uuid.uuid4()
        )
    )


def _commit_files(lake: IcebergLake, data_files: list[Any]) -> None:
    """Commit files written earlier, carrying the head's offsets (as ingesters do)."""
    table = lake.table(TABLE)
    table.refresh()
    summary = LakeMaintainer(lake, POLICY).carried_summary(table)
    with (
        table.transaction() as change,
        change.update_snapshot(snapshot_properties=summary).fast_append() as append,
    ):
        for data_file in data_files:
            append.append_data_file(data_file)


def test_files_only_expired_snapshots_held_are_deleted_and_orphans_after_their_grace(
    s3_server: S3Server, postgres: str, tmp_path: Path
) -> None:
    # Hours 0-3 closed (each gets 6 small files, then the other ingester's late ones), the
    # open hour beside them; every snapshot but the head is old enough to expire.
    now_ms = int(time.time() * 1000)
    t0_ms = (now_ms - 6 * HOUR_MS) // HOUR_MS * HOUR_MS
    policy = MaintenancePolicy(retention_ms=7 * DAY_MS, keep_ms=0)  # orphans: 3 days' grace
    config = _config(s3_server, postgres, tmp_path)
    seeded = _Ingester(_lake(config), partition=0)
    for n in range(24):
        seeded.append(n * 10, 10, t0_ms + (n // 6) * HOUR_MS)
    other = _Ingester(_lake(config), partition=1)
    done = threading.Event()

    def ingest() -> None:
        try:
            for n in range(30):
                other.append(10_000 + n * 10, 10, t0_ms + [0, 1, 2, 3, 6][n % 5] * HOUR_MS)
        finally:
            done.set()

    # A writer between writing its files and committing them, all through the passes.
    late = _Ingester(_lake(config), partition=2)
    in_flight = _write_uncommitted(late.lake, 90_000, 10, t0_ms + 6 * HOUR_MS)
    observer = _lake(config)
    maintainer = LakeMaintainer(_lake(config), policy)
    reports = []
    once_referenced = _referenced(observer)
    writer = threading.Thread(target=ingest)
    writer.start()
    while not done.is_set():
        once_referenced |= _referenced(observer)
        reports.append(maintainer.maintain(TABLE, int(time.time() * 1000)))
    writer.join()
    once_referenced |= _referenced(observer)
    reports.append(maintainer.maintain(TABLE, int(time.time() * 1000)))
    assert sum(r.conflicts for r in reports) + other.conflicts > 0, "no race: proves nothing"
    assert sum(r.hours_compacted for r in reports) >= 4
    # What expired snapshots held is gone (the replaced small files, their manifests and
    # manifest lists); what remains unreferenced was never committed, and is within its
    # grace: the writer's files among it, which it now commits.
    referenced = _referenced(observer)
    stored = _stored(s3_server, observer)
    assert referenced <= stored
    leftover = stored - referenced
    assert not leftover & once_referenced
    assert {f.file_path.removeprefix("s3://") for f in in_flight} <= leftover
    assert sum(r.files_deleted for r in reports) > 0
    assert sum(r.orphans_deleted for r in reports) == 0
    _commit_files(late.lake, in_flight)
    # Past the grace (the writers are done now), the orphans go too: the store holds
    # exactly what the metadata references, and every row once.
    orphans = _stored(s3_server, observer) - _referenced(observer)
    sweep = LakeMaintainer(_lake(config), MaintenancePolicy(7 * DAY_MS, 0, orphan_grace_ms=0))
    report = sweep.maintain(TABLE, int(time.time() * 1000))
    assert report.orphans_deleted == len(orphans)
    assert _stored(s3_server, observer) == _referenced(observer)
    expected = sorted(seeded.values + other.values + [float(90_000 + v) for v in range(10)])
    assert _values(_lake(config)) == expected
    assert _lake(config).read_offsets() == {
        (TOPIC, 0): StoredOffset(seeded.offset, LOG),
        (TOPIC, 1): StoredOffset(other.offset, LOG),
    }
    seeded.append(50_000, 10, t0_ms + 6 * HOUR_MS)  # and the lake takes the next batch
    assert _values(_lake(config)) == sorted(expected + seeded.values[-10:])


def test_expiry_keeps_the_offsets_and_a_later_append_carries_them_on(
    s3_server: S3Server, tmp_path: Path
) -> None:
    config = _config(s3_server, f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path)
    ingesters = [_Ingester(_lake(config), partition=p) for p in (0, 1)]
    for n in range(8):
        ingesters[n % 2].append(n * 10, 10, T0_MS)
    lake = _lake(config)
    offsets = lake.read_offsets()
    assert len(lake.table("engine_samples").snapshots()) == 8
    # Keep no snapshot by age (snapshots carry the wall clock's time): all but the head go.
    # Expiry alone: no retention, no compaction.
    expiry_only = MaintenancePolicy(retention_ms=10_000 * DAY_MS, keep_ms=0, min_files=100)
    report = LakeMaintainer(lake, expiry_only).maintain(TABLE, int(time.time() * 1000))
    assert report.snapshots_expired == 7
    assert len(lake.table("engine_samples").snapshots()) == 1
    assert (
        lake.read_offsets()
        == offsets
        == {(TOPIC, 0): StoredOffset(4, LOG), (TOPIC, 1): StoredOffset(4, LOG)}
    )
    ingesters[0].append(1000, 10, T0_MS)  # the other partition's offset is carried on
    assert _lake(config).read_offsets() == {
        (TOPIC, 0): StoredOffset(5, LOG),
        (TOPIC, 1): StoredOffset(4, LOG),
    }
    assert _values(lake) == sorted(ingesters[0].values + ingesters[1].values)


class _ForgetfulMaintainer(LakeMaintainer):
    """A broken maintainer: its snapshots do not carry the offsets."""

    def carried_summary(self, table: Any) -> dict[str, str]:
        return {}


@pytest.mark.parametrize(
    ("maintainer", "keeps_offsets"),
    [(LakeMaintainer, True), (_ForgetfulMaintainer, False)],
    ids=["the maintainer", "a maintainer that drops the offsets"],
)
def test_compaction_carries_the_offsets_and_the_check_catches_one_that_does_not(
    s3_server: S3Server, tmp_path: Path, maintainer: type[LakeMaintainer], keeps_offsets: bool
) -> None:
    config = _config(s3_server, f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path)
    ingester = _Ingester(_lake(config), partition=3)
    for n in range(5):
        ingester.append(n * 10, 10, T0_MS)
    lake = _lake(config)
    report = maintainer(lake, POLICY).maintain(TABLE, NOW_MS)
    assert (report.hours_compacted, report.files_before, report.files_after) == (1, 5, 1)
    assert report.bytes_after < report.bytes_before
    assert _values(lake) == sorted(ingester.values)
    resumed = _lake(config).read_offsets() == {(TOPIC, 3): StoredOffset(5, LOG)}
    assert resumed is keeps_offsets


def test_an_open_hour_and_a_lone_file_are_left_alone(s3_server: S3Server, tmp_path: Path) -> None:
    config = _config(s3_server, f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path)
    ingester = _Ingester(_lake(config), partition=0)
    ingester.append(0, 10, T0_MS)  # a closed hour with one file
    for n in range(1, 4):
        ingester.append(n * 10, 10, NOW_MS)  # the open hour
    report = LakeMaintainer(_lake(config), POLICY).maintain(TABLE, NOW_MS + 10 * 60 * 1000)
    assert (report.hours_compacted, report.files_after) == (0, 4)
    assert report.conflicts == 0


def test_llmslo_lake_maintain_compacts_a_local_lake_and_prints_each_tables_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    iceberg = {
        "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": str(tmp_path / "warehouse"),
        "retry_for_s": 0.001,
        "snapshot_keep_s": 0.001,  # every snapshot but the head expires
    }
    path = tmp_path / "llmslo.yaml"
    path.write_text(yaml.safe_dump({"store": {"lake": "iceberg", "iceberg": iceberg}}))
    lake = IcebergLake(
        IcebergConfig.model_validate(iceberg),
        group_id="llmslo-ingest",
        topics=lake_topics("llmslo."),
    )
    ingester = _Ingester(lake, partition=0, topic="llmslo.engine")
    hour_ms = (int(time.time() * 1000) - 2 * HOUR_MS) // HOUR_MS * HOUR_MS
    for n in range(4):
        ingester.append(n * 10, 10, hour_ms)
    assert main(["lake", "maintain", "-c", str(path), "--table", TABLE]) == 0
    (report,) = json.loads(capsys.readouterr().out)["maintained"]
    assert report["table"] == TABLE
    assert (report["files_before"], report["files_after"], report["hours_compacted"]) == (4, 1, 1)
    assert report["bytes_after"] < report["bytes_before"]
    assert report["snapshots_expired"] == 4
    # The expired snapshots' files are gone from the warehouse: the four small data files,
    # their manifests and manifest lists.
    assert report["files_deleted"] == 12 and report["orphans_deleted"] == 0
    location = Path(urlsplit(lake.table(TABLE).location()).path)
    assert {str(p) for p in location.rglob("*") if p.is_file()} == _referenced(lake)
    assert _values(lake) == sorted(ingester.values)


def test_llmslo_lake_maintain_needs_the_iceberg_lake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "llmslo.yaml"
    path.write_text(yaml.safe_dump({"store": {"lake": "parquet"}}))
    assert main(["lake", "maintain", "-c", str(path)]) == 2
    assert "store.lake: iceberg" in capsys.readouterr().err


def test_the_jobs_roles_schedule_maintains_the_lake_and_stops_when_told(tmp_path: Path) -> None:
    iceberg = {
        "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": str(tmp_path),
        "maintain_interval_s": 0.2,
    }
    config = load_config(None).model_copy(
        update={"store": StoreConfig(lake="iceberg", iceberg=IcebergConfig.model_validate(iceberg))}
    )
    lake = IcebergLake(
        IcebergConfig.model_validate(iceberg), group_id="g", topics=lake_topics("t.")
    )
    ingester = _Ingester(lake, partition=0)
    hour_ms = (int(time.time() * 1000) - 2 * HOUR_MS) // HOUR_MS * HOUR_MS
    for n in range(3):
        ingester.append(n * 10, 10, hour_ms)
    stop = threading.Event()
    schedule = threading.Thread(target=maintain_lake_until, args=(config, "t.", stop))
    schedule.start()
    deadline = time.monotonic() + 60
    while _data_files(lake) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    schedule.join(timeout=60)
    assert not schedule.is_alive()
    assert _data_files(lake) == 1
    assert _values(lake) == sorted(ingester.values)
    assert lake.read_offsets() == {(TOPIC, 0): StoredOffset(3, LOG)}
