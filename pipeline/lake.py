"""Hourly Parquet export: how several ingesters' DuckDB files become one queryable lake.

Each ingester owns its DuckDB file (DuckDB has one writer per file). Completed hours are
exported as Hive-partitioned Parquet, to a shared directory or to an S3-compatible object
store (``s3://BUCKET/PREFIX``, :mod:`pipeline.s3`)::

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
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from pipeline.errors import ConfigError, StoreError
from pipeline.s3 import ObjectStore, S3Config
from pipeline.schema import iter_schemas
from pipeline.store import Store, duckdb_type
from pipeline.units import HOUR_MS, MINUTE_MS

__all__ = [
    "LAKE_TABLES",
    "ExportedHour",
    "PendingHour",
    "create_lake_views",
    "export_hours",
    "is_s3",
    "lake_object_store",
    "lake_view_sql",
    "pending_hours",
]

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
    """One Parquet file written (``path``: a local path, or an ``s3://`` URI)."""

    table: str
    hour_start_ms: int
    rows: int
    path: Path | str


@dataclass(frozen=True)
class PendingHour:
    """An hour of a table that an export round writes (``frozen``: once, recorded in
    ``lake_exports``; otherwise an open hour, rewritten each round)."""

    table: str
    column: str
    hour_start_ms: int
    frozen: bool


def is_s3(lake: Path | str) -> bool:
    """Whether ``lake`` is an ``s3://`` URI (else a local directory)."""
    return isinstance(lake, str) and lake.startswith("s3://")


def lake_object_store(lake: Path | str, s3: S3Config) -> ObjectStore | None:
    """The object store of an ``s3://`` lake (``store.s3``), ``None`` for a directory."""
    return ObjectStore(s3) if is_s3(lake) else None


def _ensure_ledger(store: Store) -> None:
    store.con.execute(  # lake_exports: what was written, so nothing is exported twice
        "CREATE TABLE IF NOT EXISTS lake_exports (table_name VARCHAR NOT NULL, hour_start_ms BIGINT NOT NULL, "
        "rows BIGINT NOT NULL, path VARCHAR NOT NULL, PRIMARY KEY (table_name, hour_start_ms))"
    )


def pending_hours(
    store: Store, *, now_ts_ms: int, grace_ms: int = DEFAULT_GRACE_MS, include_open: bool = False
) -> list[PendingHour]:
    """The hours :func:`export_hours` would write now, table by table, oldest first."""
    last_hour = (now_ts_ms - grace_ms) // HOUR_MS * HOUR_MS
    pending = []
    with store.lock:  # the ingester commits on another thread through the same connection
        _ensure_ledger(store)
        for table, column in LAKE_TABLES.items():
            frozen = store.con.execute(
                f"SELECT DISTINCT {column} // {HOUR_MS} * {HOUR_MS} AS hour FROM {table} "
                f"WHERE {column} < ? AND hour NOT IN "
                "(SELECT hour_start_ms FROM lake_exports WHERE table_name = ?) ORDER BY hour",
                [last_hour, table],
            ).fetchall()
            pending += [PendingHour(table, column, hour, True) for (hour,) in frozen]
            if include_open:
                open_hours = store.con.execute(
                    f"SELECT DISTINCT {column} // {HOUR_MS} * {HOUR_MS} AS hour FROM {table} "
                    f"WHERE {column} >= ? ORDER BY hour",
                    [last_hour],
                ).fetchall()
                pending += [PendingHour(table, column, hour, False) for (hour,) in open_hours]
    return pending


def export_hours(
    store: Store,
    lake: Path | str,
    ingester_id: str,
    *,
    now_ts_ms: int,
    grace_ms: int = DEFAULT_GRACE_MS,
    include_open: bool = False,
    objects: ObjectStore | None = None,
    advance: Callable[[float], None] | None = None,
) -> list[ExportedHour]:
    """Export every hour that ended ``grace_ms`` before ``now_ts_ms`` and was not exported yet.

    The grace period lets late rows (ingest lag, collectors flushing their buffer after a
    broker outage) land before their hour is frozen. Rows arriving later still are kept in
    DuckDB but do not reach the lake. Raises :class:`StoreError` (an
    :class:`~pipeline.s3.ObjectStoreError` naming bucket and key for an ``s3://`` lake) or
    :class:`ConfigError`.

    ``lake`` is a directory or an ``s3://BUCKET/PREFIX`` URI, put through ``objects``
    (default: :class:`~pipeline.s3.ObjectStore` with the environment's credentials).
    ``include_open`` also writes the hours not yet frozen (the current one and those in
    their grace period) as they are now, to the same names, so a jobs process reading the
    lake sees rows one export interval old. A reader sees each (table, hour, ingester)
    once, never half-written or twice: a local file is written beside its name and renamed
    over it; an object is one PUT of a file written locally first (S3 shows an object whole
    or not at all, and a retried or repeated upload replaces the same key). An hour is
    recorded in ``lake_exports`` after its file is in place, so a crash in between writes
    it again, to the same name. Rewriting the open hours costs their size each round.
    ``advance(1)`` is called after each file (a progress bar).
    """
    if not _SAFE_ID.fullmatch(ingester_id):
        raise ConfigError(
            f"ingester id {ingester_id!r} must match {_SAFE_ID.pattern} (it names files)"
        )
    if is_s3(lake) and objects is None:
        objects = ObjectStore(S3Config())
    written = []
    with tempfile.TemporaryDirectory(prefix="llmslo-lake-") as staging:
        for hour in pending_hours(
            store, now_ts_ms=now_ts_ms, grace_ms=grace_ms, include_open=include_open
        ):
            written.append(_export_hour(store, lake, objects, Path(staging), ingester_id, hour))
            if advance is not None:
                advance(1)
    return written


def _hour_name(lake: Path | str, table: str, hour: int, ingester_id: str) -> Path | str:
    start = datetime.fromtimestamp(hour / 1000, tz=UTC)
    date, hour_of_day = start.strftime("%Y-%m-%d"), start.strftime("%H")
    parts = (table, f"date={date}", f"hour={hour_of_day}", f"{ingester_id}.parquet")
    if isinstance(lake, str):
        return "/".join((lake.rstrip("/"), *parts))
    path = lake.joinpath(*parts)
    if "'" in str(path):  # COPY … TO takes no parameter for the file name
        raise ConfigError(f"lake path {path} must not contain a quote")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _export_hour(
    store: Store,
    lake: Path | str,
    objects: ObjectStore | None,
    staging: Path,
    ingester_id: str,
    hour: PendingHour,
) -> ExportedHour:
    name = _hour_name(lake, hour.table, hour.hour_start_ms, ingester_id)
    if isinstance(name, Path):  # beside its name: the rename is atomic on one filesystem
        partial = name.with_name(name.name + ".partial")  # not *.parquet: readers skip it
    else:
        partial = staging / f"{hour.table}.{hour.hour_start_ms}.parquet"
    rows = _write_hour(store, hour, partial)
    if isinstance(name, Path):
        os.replace(partial, name)
    else:
        assert objects is not None
        # Outside the store's lock: the ingester keeps committing while the store retries.
        objects.put(partial, name)
        partial.unlink()
    if hour.frozen:
        with store.transaction(f"record {hour.table}'s hour of {hour.hour_start_ms} ms") as con:
            con.execute(
                "INSERT OR REPLACE INTO lake_exports VALUES (?, ?, ?, ?)",
                [hour.table, hour.hour_start_ms, rows, str(name)],
            )
        log.info(
            "exported %d rows of %s for hour %d ms to %s",
            rows,
            hour.table,
            hour.hour_start_ms,
            name,
        )
    return ExportedHour(hour.table, hour.hour_start_ms, rows, name)


def _write_hour(store: Store, hour: PendingHour, path: Path) -> int:
    """Write one hour of a table to the local file ``path``; its rows."""
    column, start = hour.column, hour.hour_start_ms
    if "'" in str(path):  # COPY … TO takes no parameter for the file name
        raise ConfigError(f"staging path {path} must not contain a quote")
    with store.lock:  # the ingester commits on another thread through the same connection
        try:
            store.con.execute(
                f"COPY (SELECT * FROM {hour.table} WHERE {column} >= ? AND {column} < ? "
                f"ORDER BY {column}) TO '{path}' (FORMAT PARQUET, COMPRESSION ZSTD)",
                [start, start + HOUR_MS],
            )
            row = store.con.execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchone()
        except duckdb.Error as exc:
            raise StoreError(f"cannot export {hour.table}'s hour of {start} ms: {exc}") from exc
    return int(row[0]) if row else 0


def lake_view_sql(lake: Path | str, table: str) -> str:
    """A SELECT over every ingester's exported hours of ``table`` (an ``s3://`` lake needs
    its filesystem registered in the connection: :func:`create_lake_views` does it)."""
    pattern = _pattern(lake, table)
    if "'" in pattern:
        raise ConfigError(f"lake {lake} must not contain a quote")
    return (
        f"SELECT * FROM read_parquet('{pattern}', hive_partitioning = true, union_by_name = true)"
    )


def _pattern(lake: Path | str, table: str) -> str:
    if isinstance(lake, str):
        return f"{lake.rstrip('/')}/{table}/**/*.parquet"
    return str(lake / table / "**" / "*.parquet")


def create_lake_views(
    con: duckdb.DuckDBPyConnection, lake: Path | str, *, objects: ObjectStore | None = None
) -> None:
    """Views of :data:`LAKE_TABLES` (samples, requests, flag transitions, target health) over the
    lake, in ``con``.

    They have exactly the schemas' columns and types (the Hive ``date``/``hour`` columns
    are dropped; a column no file has yet, e.g. one added to a schema after those hours
    were exported, is NULL), so SQL written for an ingester's file (the SLO jobs,
    :mod:`slo.queries`) runs unchanged over every ingester's rows. A table with no file
    yet is an empty view of the right types; call again to pick up a table's first file
    (later files of a table already present are found by every query). An ``s3://`` lake
    is read through ``objects``' filesystem (s3fs), registered in ``con``. Raises
    :class:`StoreError`.
    """
    if is_s3(lake):
        objects = objects or ObjectStore(S3Config())
        if "s3" not in {name.split("://")[0] for name in con.list_filesystems()}:
            con.register_filesystem(objects.filesystem)
        objects.invalidate()  # other ingesters' new files
    schemas = {schema.table: schema for schema in iter_schemas()}
    for table in LAKE_TABLES:
        schema = schemas[table]
        try:
            if _has_files(lake, table, objects):
                source = f"({lake_view_sql(lake, table)})"
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
            raise StoreError(f"cannot read the lake at {lake} for {table}: {exc}") from exc


def _has_files(lake: Path | str, table: str, objects: ObjectStore | None) -> bool:
    if isinstance(lake, Path):
        return any((lake / table).glob("**/*.parquet"))
    assert objects is not None
    return bool(objects.glob(_pattern(lake, table)))
