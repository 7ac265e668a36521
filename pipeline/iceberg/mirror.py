"""The Iceberg lake's recent rows in a local DuckDB file, for the SLO jobs.

The jobs' SQL (:mod:`slo.queries`) runs over an ingester's tables. Over the Iceberg lake
(``store.lake: iceberg``) the jobs keep those tables in their own :class:`~pipeline.store.Store`
file and bring them up to date before each cycle, **data file by data file**: an Iceberg
append only adds files, so a file path loaded once is never read again, and a refresh reads
only what ingesters committed since. Which files are loaded is recorded in the same DuckDB
transaction as their rows (``iceberg_loaded_files``), so a jobs process that dies mid-load
resumes without doubling anything, and a restart reads nothing twice.

* **Pruning.** Files are planned once per refresh and those of hours that ended before
  ``now - window`` are left (the tables are partitioned by hour of the event time), so a
  refresh never opens an hour older than the window; rows that age out are deleted from
  the mirror with the store's :meth:`~pipeline.store.Store.prune`.
* **Rewrites.** A file that was loaded and is no longer in the table's current snapshot (a
  compaction or a delete rewrote it) makes that table reload whole; an expired snapshot
  removes no live file, so expiry alone costs nothing.
* **Freshness.** The mirror is as fresh as its last :meth:`IcebergMirror.refresh`: the jobs'
  cycle interval plus an ingester's batch time (``ingest.batch_max_ms``), since each batch is
  its own Iceberg commit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from pipeline.codec import conform
from pipeline.iceberg.lake import IcebergLake
from pipeline.iceberg.tables import ICEBERG_TABLES, PARTITION_WIDTH_MS
from pipeline.schema import iter_schemas
from pipeline.store import Store
from pipeline.units import floor_to

__all__ = ["IcebergMirror", "MirrorReport"]

log = logging.getLogger(__name__)

LOADED_FILES = "iceberg_loaded_files"
#: The mirror's own group in the store's offsets table: it consumes no Kafka.
MIRROR_GROUP = "iceberg-mirror"
PRUNE_EVERY_S = 600.0


@dataclass
class MirrorReport:
    """What one refresh read from the lake."""

    files: int = 0
    rows: int = 0
    reloaded: list[str] = field(default_factory=list)  # tables read whole after a rewrite
    seconds: float = 0.0


def _hour_of(task: Any) -> int:
    """The hour (epoch ms) a planned data file's partition holds; a file without one (a
    table partitioned otherwise) counts as the newest, so it is read, never skipped."""
    partition = task.file.partition
    value = partition[0] if partition is not None and len(partition) else None
    return int(value) if value is not None else 2**62


class IcebergMirror:
    """The lake tables' rows newer than ``window_ms`` in ``store`` (the jobs' own file)."""

    def __init__(self, lake: IcebergLake, store: Store, *, window_ms: int) -> None:
        self.lake = lake
        self.store = store
        self.window_ms = window_ms
        self._schemas = {s.table: s for s in iter_schemas() if s.table in ICEBERG_TABLES}
        self._last_prune_s = float("-inf")
        with store.transaction("create the mirror's file list") as con:
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {LOADED_FILES} "
                "(table_name VARCHAR NOT NULL, file_path VARCHAR NOT NULL, "
                "PRIMARY KEY (table_name, file_path))"
            )

    def refresh(self, now_ms: int) -> MirrorReport:
        """Load every data file committed since the last refresh (rows since
        ``now_ms - window_ms``). Raises :class:`~pipeline.iceberg.lake.LakeError`
        (lake unreachable) or :class:`~pipeline.errors.StoreError` (local file)."""
        started = time.perf_counter()
        report = MirrorReport()
        since_ms = now_ms - self.window_ms
        for name in sorted(ICEBERG_TABLES):
            self._refresh_table(name, since_ms, report)
        if time.monotonic() - self._last_prune_s >= PRUNE_EVERY_S:
            self.store.prune(since_ms)
            self._last_prune_s = time.monotonic()
        report.seconds = time.perf_counter() - started
        return report

    def _loaded(self, name: str) -> set[str]:
        with self.store.lock:
            rows = self.store.con.execute(
                f"SELECT file_path FROM {LOADED_FILES} WHERE table_name = ?", [name]
            ).fetchall()
        return {path for (path,) in rows}

    def _refresh_table(self, name: str, since_ms: int, report: MirrorReport) -> None:
        table = self.lake.table(name)
        self.lake._guard("refresh the table", table.refresh, name)
        # One plan of the current snapshot serves both questions (planning reads every
        # manifest: at a commit per batch it was ~40 % of a refresh, done twice).
        planned = self.lake._guard(
            "plan the table's files", lambda: list(table.scan().plan_files()), name
        )
        live = {task.file.file_path for task in planned}
        loaded = self._loaded(name)
        if loaded - live:
            # A rewrite (compaction, delete): the rows of the files that went are elsewhere now.
            log.info("Iceberg table %s was rewritten; reloading it whole", name)
            report.reloaded.append(name)
            self._forget(name)
            loaded = set()
        # Pruned by partition: an hour that ended before the window is never opened.
        first_hour_ms = floor_to(since_ms, PARTITION_WIDTH_MS)
        tasks = [
            task
            for task in planned
            if task.file.file_path not in loaded and _hour_of(task) >= first_hour_ms
        ]
        if not tasks:
            return
        rows = self.lake._guard(
            f"read {len(tasks)} data files", lambda: self._read(table, tasks), name
        )
        self._store(name, rows, [task.file.file_path for task in tasks])
        report.files += len(tasks)
        report.rows += rows.num_rows

    @staticmethod
    def _read(table: Any, tasks: list[Any]) -> pa.Table:
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        return scan.to_table(tasks)

    def _store(self, name: str, rows: pa.Table, paths: list[str]) -> None:
        data = conform(self._schemas[name], rows) if rows.num_rows else None

        def record_files(con: duckdb.DuckDBPyConnection) -> None:
            con.executemany(
                f"INSERT INTO {LOADED_FILES} VALUES (?, ?)", [(name, path) for path in paths]
            )

        self.store.commit_batch(
            {name: [data]} if data is not None else {},
            group_id=MIRROR_GROUP,
            offsets={},
            now_ts_ms=int(time.time() * 1000),
            in_same_transaction=record_files,
        )

    def _forget(self, name: str) -> None:
        # A normalised table's rows are its values; its series rows are identities the
        # reload finds known (retention's prune drops those left without values).
        rows = f"{name}_values" if self._schemas[name].series_columns else name
        with self.store.transaction(f"forget the mirror of {name}") as con:
            con.execute(f"DELETE FROM {rows}")
            con.execute(f"DELETE FROM {LOADED_FILES} WHERE table_name = ?", [name])
