"""Hourly Parquet export: complete hours only, once each, readable as one lake."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pipeline.codec import conform
from pipeline.errors import ConfigError
from pipeline.lake import export_hours, lake_view_sql
from pipeline.schema import ENGINE_SAMPLES
from pipeline.store import Store
from pipeline.units import HOUR_MS
from tests.pipeline.ingest_helpers import numbered_samples

T0 = 1_764_403_200_000  # 2025-11-29 08:00:00 UTC, an hour boundary


def _store_hours(store: Store, hours: int, per_hour: int) -> None:
    for hour in range(hours):
        table = numbered_samples(hour * per_hour, per_hour, f"pod-{hour}")
        table = table.set_column(0, "ts_ms", [[T0 + hour * HOUR_MS + i for i in range(per_hour)]])
        store.commit_batch(
            {"engine_samples": [conform(ENGINE_SAMPLES, table)]},
            group_id="g",
            offsets={},
            now_ts_ms=0,
        )


def test_complete_hours_are_exported_once_and_read_back_equal(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with Store(tmp_path / "a.duckdb") as store:
        _store_hours(store, hours=3, per_hour=100)
        # At 10:30 the hours 08 and 09 are complete; 10 is still being written.
        first = export_hours(store, lake, "ingest-a", now_ts_ms=T0 + 2 * HOUR_MS + HOUR_MS // 2)
        again = export_hours(store, lake, "ingest-a", now_ts_ms=T0 + 2 * HOUR_MS + HOUR_MS // 2)
        # Hour 10 ended at 11:00; within the 15-minute grace for late rows it stays open.
        in_grace = export_hours(store, lake, "ingest-a", now_ts_ms=T0 + 3 * HOUR_MS + 5 * 60_000)
        later = export_hours(store, lake, "ingest-a", now_ts_ms=T0 + 3 * HOUR_MS + 20 * 60_000)
    assert [(w.table, w.rows) for w in first] == [("engine_samples", 100), ("engine_samples", 100)]
    assert again == [] and in_grace == []
    assert [w.rows for w in later] == [100]
    assert (lake / "engine_samples" / "date=2025-11-29" / "hour=08" / "ingest-a.parquet").exists()

    con = duckdb.connect()
    values = con.execute(
        f"SELECT value, instance FROM ({lake_view_sql(lake, 'engine_samples')}) ORDER BY value"
    ).fetchall()
    assert [v for v, _ in values] == list(range(300))
    assert {instance for _, instance in values} == {"pod-0", "pod-1", "pod-2"}


def test_an_ingester_id_that_cannot_name_a_file_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path / "a.duckdb") as store, pytest.raises(ConfigError, match="ingester id"):
        export_hours(store, tmp_path / "lake", "a'b/../c", now_ts_ms=T0)
