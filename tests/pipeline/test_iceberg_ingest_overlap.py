"""An ingester's Iceberg appends overlap its DuckDB commits (batch N+1 goes into the lake
while batch N goes into DuckDB), on a real broker and a real (local) Iceberg lake: every
sample lands once in the lake and once in the file, and a failed append lets no later batch
into either, so a restart completes both exactly."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pipeline._offsets import StoredOffset
from pipeline.bus import Bus
from pipeline.config import IngestConfig
from pipeline.iceberg.config import IcebergConfig
from pipeline.iceberg.lake import CommitReport, IcebergLake, LakeError
from pipeline.iceberg.tables import lake_topics
from pipeline.ingest import Ingester
from pipeline.store import Store
from tests.pipeline.ingest_helpers import produce_numbered

TOTAL = 12_000
PER_MESSAGE = 500
BATCH_ROWS = 1_000  # a dozen batches


class _WatchedLake(IcebergLake):
    """The lake, counting the appends begun, and refusing the ``fail_at``-th one."""

    def __init__(self, *args: Any, fail_at: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at = fail_at
        self.begun = 0
        self.changed = threading.Condition()

    def append_batch(
        self,
        rows: Mapping[str, Sequence[pa.Table]],
        offsets: Mapping[tuple[str, int], StoredOffset],
        **kwargs: Any,
    ) -> CommitReport:
        with self.changed:
            self.begun += 1
            self.changed.notify_all()
            if self.begun == self.fail_at:
                self.refused = True
                raise LakeError("Iceberg lake refused the commit (test)")
        return super().append_batch(rows, offsets, **kwargs)

    refused = False


class _LateSecondCommit(Ingester):
    """An ingester whose second DuckDB commit starts only once the lake has refused an
    append (the third batch's, begun meanwhile): the order a loaded host can give."""

    def __init__(self, *args: Any, lake: _WatchedLake, **kwargs: Any) -> None:
        super().__init__(*args, lake=lake, **kwargs)
        self.watched = lake
        self.commits_begun = 0

    def _commit(self, *args: Any) -> float:
        self.commits_begun += 1
        if self.commits_begun == 2:
            with self.watched.changed:
                self.watched.changed.wait_for(lambda: self.watched.refused, timeout=30)
        return super()._commit(*args)


def _lake(tmp_path: Path, bus: Bus, **kwargs: Any) -> _WatchedLake:
    config = IcebergConfig(
        catalog_uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=str(tmp_path / "lake")
    )
    return _WatchedLake(config, group_id=bus.prefix, topics=lake_topics(bus.prefix), **kwargs)


def _ingester(bus: Bus, store: Store, lake: IcebergLake, **kwargs: Any) -> Ingester:
    config = IngestConfig(group_id=bus.prefix, batch_max_rows=BATCH_ROWS, batch_max_ms=60_000)
    return Ingester(bus, store, config, lake=lake, **kwargs)


def _lake_values(lake: IcebergLake) -> list[float]:
    table = lake.table("engine_samples")
    table.refresh()
    return sorted(table.scan(selected_fields=("value",)).to_arrow()["value"].to_pylist())


def _file_values(store: Store) -> list[float]:
    rows = store.con.execute("SELECT value FROM engine_samples ORDER BY value").fetchall()
    return [v for (v,) in rows]


def test_appends_overlap_duckdb_commits_and_each_sample_lands_once(
    bus: Bus, tmp_path: Path
) -> None:
    produce_numbered(bus, total=TOTAL, per_message=PER_MESSAGE)
    lake = _lake(tmp_path, bus)
    overlapped = []

    def after_commit(commits: int) -> None:
        # On the DuckDB thread, batch `commits` just in the file: the next batch's append
        # begins meanwhile (the last batch has none: the wait then ends unmet).
        with lake.changed:
            overlapped.append(lake.changed.wait_for(lambda: lake.begun > commits, timeout=5))

    with Store(tmp_path / "ingest.duckdb") as store:
        stats = _ingester(bus, store, lake, after_commit=after_commit).run(max_idle_s=2.0)
        assert _file_values(store) == [float(v) for v in range(TOTAL)]
    assert stats.commits >= 4 and sum(overlapped) >= stats.commits - 1, overlapped
    assert _lake_values(lake) == [float(v) for v in range(TOTAL)]  # nothing doubled or lost
    assert sum(o.next_offset for o in lake.read_offsets().values()) == TOTAL // PER_MESSAGE


def test_after_a_refused_append_no_later_batch_is_committed_and_a_restart_completes(
    bus: Bus, tmp_path: Path
) -> None:
    produce_numbered(bus, total=TOTAL, per_message=PER_MESSAGE)
    failing = _lake(tmp_path, bus, fail_at=3)
    with Store(tmp_path / "ingest.duckdb") as store:
        with pytest.raises(LakeError, match="refused"):
            _ingester(bus, store, failing).run(max_idle_s=2.0)
        assert failing.begun == 3  # nothing appended past the refused batch…
        in_lake = _lake_values(failing)
        assert 0 < len(in_lake) < TOTAL
        assert _file_values(store) == in_lake  # …nor committed to DuckDB
        lake = _lake(tmp_path, bus)
        _ingester(bus, store, lake).run(max_idle_s=2.0)
        assert _file_values(store) == [float(v) for v in range(TOTAL)]
    assert _lake_values(lake) == [float(v) for v in range(TOTAL)]


def test_a_later_batch_refused_by_the_lake_does_not_stop_an_earlier_batch_in_it(
    bus: Bus, tmp_path: Path
) -> None:
    """Batch 2 is in the lake when batch 3's append is refused: batch 2 still reaches
    DuckDB, the run stops on the lake's error, and the file holds what the lake holds."""
    produce_numbered(bus, total=TOTAL, per_message=PER_MESSAGE)
    failing = _lake(tmp_path, bus, fail_at=3)
    config = IngestConfig(group_id=bus.prefix, batch_max_rows=BATCH_ROWS, batch_max_ms=60_000)
    with Store(tmp_path / "ingest.duckdb") as store:
        with pytest.raises(LakeError, match="refused"):
            _LateSecondCommit(bus, store, config, lake=failing).run(max_idle_s=2.0)
        assert failing.refused
        in_lake = _lake_values(failing)
        assert 0 < len(in_lake) < TOTAL  # batches 1 and 2, not 3
        assert _file_values(store) == in_lake
