"""Hourly Parquet export: how several ingesters' DuckDB files become one queryable lake.

Each ingester owns its DuckDB file (DuckDB has one writer per file). Completed hours are
exported as Hive-partitioned Parquet::

    <lake>/<table>/date=2026-11-29/hour=14/<ingester>.parquet

so that SLO jobs and dashboards read every ingester's rows with one DuckDB query
(:func:`lake_view_sql`). The ``lake_exports`` table records what was exported; running
the export again writes only hours not exported before, and rewrites nothing.
Ingesters in one group own disjoint partitions, so their files never hold the same row.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from pipeline.errors import ConfigError, StoreError
from pipeline.schema import iter_schemas
from pipeline.store import Store, duckdb_type
from pipeline.units import HOUR_MS, MINUTE_MS

__all__ = ["LAKE_TABLES", "ExportedHour", "create_lake_views", "export_hours", "lake_view_sql"]

log = logging.getLogger(__name__)

#: How long after an hour ends before it is exported (late rows still land in it).
DEFAULT_GRACE_MS = 15 * MINUTE_MS
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
#: Exported tables and their event-time column.
LAKE_TABLES = {
    "engine_samples": "ts_ms",
    "gpu_samples": "ts_ms",
    "requests": "received_ts_ms",
    "flag_transitions": "ts_ms",  # the jobs resume flag levels from it
    "target_health": "ts_ms",  # crash, down and not-ready detectors read it
}


@dataclass(frozen=True)
class ExportedHour:
    """One Parquet file written."""

    table: str
    hour_start_ms: int
    rows: int
    path: Path


def _ensure_ledger(store: Store) -> None:
    store.con.execute(  # lake_exports: what was written, so nothing is exported twice
        "CREATE TABLE IF NOT EXISTS lake_exports (table_name VARCHAR NOT NULL, hour_start_ms BIGINT NOT NULL, "
        "rows BIGINT NOT NULL, path VARCHAR NOT NULL, PRIMARY KEY (table_name, hour_start_ms))"
    )


def export_hours(
    store: Store,
    lake_dir: Path,
    ingester_id: str,
    *,
    now_ts_ms: int,
    grace_ms: int = DEFAULT_GRACE_MS,
    include_open: bool = False,
) -> list[ExportedHour]:
    """Export every hour that ended ``grace_ms`` before ``now_ts_ms`` and was not exported yet.

    The grace period lets late rows (ingest lag, collectors flushing their buffer after a
    broker outage) land before their hour is frozen. Rows arriving later still are kept in
    DuckDB but do not reach the lake. Raises :class:`StoreError` or :class:`ConfigError`.

    ``include_open`` also writes the hours not yet frozen (the current one and those in
    their grace period) as they are now, to the same file names, so a jobs process reading
    the lake sees rows one export interval old. Every file is written beside its final
    name and renamed over it, so a reader sees each (table, hour, ingester) once, never
    half-written or twice. Rewriting the open hours costs their size each round.
    """
    if not _SAFE_ID.fullmatch(ingester_id):
        raise ConfigError(
            f"ingester id {ingester_id!r} must match {_SAFE_ID.pattern} (it names files)"
        )
    last_hour = (now_ts_ms - grace_ms) // HOUR_MS * HOUR_MS
    written = []
    with store.lock:  # the ingester commits on another thread through the same connection
        _ensure_ledger(store)
        for table, column in LAKE_TABLES.items():
            written += _export_table(store, lake_dir, ingester_id, table, column, last_hour)
            if include_open:
                written += _export_open_hours(
                    store, lake_dir, ingester_id, table, column, last_hour
                )
    return written


def _export_open_hours(
    store: Store, lake_dir: Path, ingester_id: str, table: str, column: str, first_open_hour: int
) -> list[ExportedHour]:
    hours = store.con.execute(
        f"SELECT DISTINCT {column} // {HOUR_MS} * {HOUR_MS} AS hour FROM {table} "
        f"WHERE {column} >= ? ORDER BY hour",
        [first_open_hour],
    ).fetchall()
    exported = []
    for (hour,) in hours:
        path = _hour_path(lake_dir, table, hour, ingester_id)
        rows = _write_hour(store, table, column, hour, path)
        exported.append(ExportedHour(table, hour, rows, path))
    return exported


def _hour_path(lake_dir: Path, table: str, hour: int, ingester_id: str) -> Path:
    start = datetime.fromtimestamp(hour / 1000, tz=UTC)
    date, hour_of_day = start.strftime("%Y-%m-%d"), start.strftime("%H")
    path = lake_dir / table / f"date={date}" / f"hour={hour_of_day}" / f"{ingester_id}.parquet"
    if "'" in str(path):  # COPY … TO takes no parameter for the file name
        raise ConfigError(f"lake path {path} must not contain a quote")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _write_hour(store: Store, table: str, column: str, hour: int, path: Path) -> int:
    """Write one hour of ``table`` to ``path`` atomically (beside it, then renamed); its rows."""
    partial = path.with_name(path.name + ".partial")  # not *.parquet: readers skip it
    store.con.execute(
        f"COPY (SELECT * FROM {table} WHERE {column} >= ? AND {column} < ? ORDER BY {column}) "
        f"TO '{partial}' (FORMAT PARQUET, COMPRESSION ZSTD)",
        [hour, hour + HOUR_MS],
    )
    row = store.con.execute("SELECT count(*) FROM read_parquet(?)", [str(partial)]).fetchone()
    os.replace(partial, path)
    return int(row[0]) if row else 0


def _export_table(
    store: Store, lake_dir: Path, ingester_id: str, table: str, column: str, current_hour: int
) -> list[ExportedHour]:
    hours = store.con.execute(
        f"SELECT DISTINCT {column} // {HOUR_MS} * {HOUR_MS} AS hour FROM {table} "
        f"WHERE {column} < ? AND hour NOT IN "
        "(SELECT hour_start_ms FROM lake_exports WHERE table_name = ?) ORDER BY hour",
        [current_hour, table],
    ).fetchall()
    return [_export_hour(store, lake_dir, ingester_id, table, column, hour) for (hour,) in hours]


def _export_hour(
    store: Store, lake_dir: Path, ingester_id: str, table: str, column: str, hour: int
) -> ExportedHour:
    path = _hour_path(lake_dir, table, hour, ingester_id)
    with store.transaction(f"export {table} for the hour of {hour} ms") as con:
        rows = _write_hour(store, table, column, hour, path)
        con.execute("INSERT INTO lake_exports VALUES (?, ?, ?, ?)", [table, hour, rows, str(path)])
    log.info("exported %d rows of %s for hour %d ms to %s", rows, table, hour, path)
    return ExportedHour(table, hour, rows, path)


def lake_view_sql(lake_dir: Path, table: str) -> str:
    """A SELECT over every ingester's exported hours of ``table``."""
    pattern = str(lake_dir / table / "**" / "*.parquet")
    return (
        f"SELECT * FROM read_parquet('{pattern}', hive_partitioning = true, union_by_name = true)"
    )


def create_lake_views(con: duckdb.DuckDBPyConnection, lake_dir: Path) -> None:
    """Views of :data:`LAKE_TABLES` (samples, requests, flag transitions, target health) over the
    lake, in ``con``.

    They have exactly the schemas' columns and types (the Hive ``date``/``hour`` columns
    are dropped; a column no file has yet, e.g. one added to a schema after those hours
    were exported, is NULL), so SQL written for an ingester's file (the SLO jobs,
    :mod:`slo.queries`) runs unchanged over every ingester's rows. A table with no file
    yet is an empty view of the right types; call again to pick up a table's first file
    (later files of a table already present are found by every query). Raises
    :class:`StoreError`.
    """
    schemas = {schema.table: schema for schema in iter_schemas()}
    for table in LAKE_TABLES:
        schema = schemas[table]
        try:
            if any((lake_dir / table).glob("**/*.parquet")):
                source = f"({lake_view_sql(lake_dir, table)})"
                present = {
                    row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
                }
            else:
                source, present = "(SELECT 1) WHERE false", set()
            columns = ", ".join(
                f"CAST({field.name if field.name in present else 'NULL'} "
                f"AS {duckdb_type(field.type)}) AS {field.name}"
                for field in schema.arrow
            )
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT {columns} FROM {source}")
        except duckdb.Error as exc:
            raise StoreError(f"cannot read the lake at {lake_dir} for {table}: {exc}") from exc
