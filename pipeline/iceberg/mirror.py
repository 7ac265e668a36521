"""The Iceberg lake's recent rows in a local DuckDB file, for the SLO jobs.

The jobs' SQL (:mod:`slo.queries`) runs over an ingester's tables. Over the Iceberg lake
(``store.lake: iceberg``) the jobs keep those tables in their own :class:`~pipeline.store.Store`
file and bring them up to date before each cycle, **snapshot by snapshot**: an Iceberg
append only adds files, so a refresh reads only the manifests and data files that the
snapshots committed since the last one added. The snapshot reached and the files loaded
are recorded in the same DuckDB transaction as their rows (``iceberg_mirror_snapshots``,
``iceberg_loaded_files``), so a jobs process that dies mid-load resumes without doubling
anything, and a restart reads nothing twice.

* **Incremental.** A refresh whose table has no new snapshot reads only the table's
  metadata; one whose new snapshots are all appends descending from the recorded one reads
  the current manifest list and the manifests those snapshots added, never the older ones.
  Anything else (no recorded snapshot, a rewrite, a rollback, an expired recorded
  snapshot) plans the table's whole current snapshot and loads the files not loaded yet.
* **Pruning.** Files of hours that ended before ``now - window`` are left (the tables are
  partitioned by hour of the event time), so a refresh never opens an hour older than the
  window; rows that age out are deleted from the mirror with the store's
  :meth:`~pipeline.store.Store.prune`.
* **Rewrites.** A file that was loaded and is no longer in the table's current snapshot (a
  compaction or a delete rewrote it) makes that table reload whole; an expired snapshot
  removes no live file, so expiry alone costs nothing.
* **What changed.** :attr:`MirrorReport.changed_from_ms` gives, per table, the earliest
  event time among the rows a refresh loaded (``None``: reloaded whole, anything may have
  changed), so the rollups recompute only the minutes new rows fell in
  (:meth:`slo.rollups.counts.Rollup.update`).
* **Fetching ahead.** :meth:`IcebergMirror.fetch` loads the files committed since, as a
  refresh does (rows, files and snapshot in one transaction), and leaves its report to the
  next :meth:`IcebergMirror.refresh`, so a process that follows the lake between cycles
  stores almost every row outside them: a cycle's refresh loads only the last commits and
  reports everything stored since the last cycle (``changed_from_ms``).
* **Freshness.** The mirror is as fresh as its last :meth:`IcebergMirror.refresh`: the jobs'
  cycle interval plus an ingester's batch time (``ingest.batch_max_ms``), since each batch is
  its own Iceberg commit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.codec import conform
from pipeline.iceberg.lake import IcebergLake
from pipeline.iceberg.tables import ICEBERG_TABLES, PARTITION_WIDTH_MS
from pipeline.schema import iter_schemas
from pipeline.store import Store
from pipeline.units import floor_to

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

__all__ = ["IcebergMirror", "MirrorReport"]

log = logging.getLogger(__name__)

LOADED_FILES = "iceberg_loaded_files"
#: Per table, the snapshot the mirror holds every row of (within the window).
MIRROR_SNAPSHOTS = "iceberg_mirror_snapshots"
#: The mirror's own group in the store's offsets table: it consumes no Kafka.
MIRROR_GROUP = "iceberg-mirror"
PRUNE_EVERY_S = 600.0


@dataclass
class MirrorReport:
    """What one refresh read from the lake."""

    files: int = 0
    rows: int = 0
    reloaded: list[str] = field(default_factory=list)  # tables read whole after a rewrite
    #: Table → earliest event time (ms) of the rows loaded; ``None`` for a table reloaded
    #: whole (any row may have changed). A table without new rows is absent.
    changed_from_ms: dict[str, int | None] = field(default_factory=dict)
    planned: list[str] = field(default_factory=list)  # tables whose whole snapshot was planned
    seconds: float = 0.0


def _merge_changes(into: dict[str, int | None], changes: dict[str, int | None]) -> None:
    """Add ``changes`` (table → earliest event time, ``None``: anything) to ``into``."""
    for name, changed in changes.items():
        if name not in into:
            into[name] = changed
        elif (known := into[name]) is not None:
            into[name] = None if changed is None else min(known, changed)


def _hour_of(data_file: Any) -> int:
    """The hour (epoch ms) a data file's partition holds; a file without one (a table
    partitioned otherwise) counts as the newest, so it is read, never skipped."""
    partition = data_file.partition
    value = partition[0] if partition is not None and len(partition) else None
    return int(value) if value is not None else 2**62


@dataclass(frozen=True)
class _Load:
    """One table's rows read from the lake by a refresh, and what to record with them."""

    table: str
    rows: pa.Table | None
    paths: list[str]  # the data files read
    snapshot_id: int  # the snapshot they bring the mirror to


class IcebergMirror:
    """The lake tables' rows newer than ``window_ms`` in ``store`` (the jobs' own file)."""

    def __init__(self, lake: IcebergLake, store: Store, *, window_ms: int) -> None:
        self.lake = lake
        self.store = store
        self.window_ms = window_ms
        self._schemas = {s.table: s for s in iter_schemas() if s.table in ICEBERG_TABLES}
        self._last_prune_s = float("-inf")
        self._unreported: dict[str, int | None] = {}
        #: Per table, the loads fetched and not stored yet, oldest first (:meth:`fetch`).
        self._fetched: dict[str, list[_Load]] = {}
        self._fetch_report = MirrorReport()
        with store.transaction("create the mirror's file list") as con:
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {LOADED_FILES} "
                "(table_name VARCHAR NOT NULL, file_path VARCHAR NOT NULL, "
                "PRIMARY KEY (table_name, file_path))"
            )
            con.execute(
                f"CREATE TABLE IF NOT EXISTS {MIRROR_SNAPSHOTS} "
                "(table_name VARCHAR PRIMARY KEY, snapshot_id BIGINT NOT NULL)"
            )

    def fetch(self, now_ms: int) -> MirrorReport:
        """Load the data files committed since the last fetch or refresh (rows since
        ``now_ms - window_ms``) as :meth:`refresh` does, in one transaction, and leave their
        report to the next :meth:`refresh` (``changed_from_ms``, ``files``, ``rows``,
        ``planned``): a process that fetches between its cycles stores almost every row
        outside them. Returns what this fetch loaded. Raises
        :class:`~pipeline.iceberg.lake.LakeError` or :class:`~pipeline.errors.StoreError`;
        what a failed fetch read is stored by the next fetch or refresh."""
        started = time.perf_counter()
        report = MirrorReport()
        since_ms = now_ms - self.window_ms
        try:
            for name in sorted(ICEBERG_TABLES):
                self._fetch_table(name, since_ms, report)
            self._store_fetched(report)
        finally:  # a table forgotten (a reload) is reported even if the store failed
            ahead = self._fetch_report
            ahead.files += report.files
            ahead.rows += report.rows
            ahead.planned += report.planned
            ahead.reloaded += report.reloaded
            _merge_changes(self._unreported, report.changed_from_ms)
        self._prune_if_due(since_ms)  # between cycles, when the process follows the lake
        report.seconds = time.perf_counter() - started
        return report

    def refresh(self, now_ms: int) -> MirrorReport:
        """Load every data file committed since the last fetch or refresh (rows since
        ``now_ms - window_ms``), stored in one transaction, and report them with what the
        fetches since the last refresh stored (:meth:`fetch`). Raises
        :class:`~pipeline.iceberg.lake.LakeError` (lake unreachable) or
        :class:`~pipeline.errors.StoreError` (local file); a failed refresh keeps what it
        read for the next, and the next reports what it stored."""
        started = time.perf_counter()
        # What failed refreshes and the fetches since stored (or forgot: a reload) is
        # reported by the next refresh that succeeds.
        report = MirrorReport(changed_from_ms=self._unreported)
        self._unreported = report.changed_from_ms
        since_ms = now_ms - self.window_ms
        for name in sorted(ICEBERG_TABLES):
            self._fetch_table(name, since_ms, report)
        self._store_fetched(report)
        ahead, self._fetch_report = self._fetch_report, MirrorReport()
        report.files += ahead.files
        report.rows += ahead.rows
        report.planned[:0] = ahead.planned
        report.reloaded[:0] = ahead.reloaded
        self._unreported = {}
        self._prune_if_due(since_ms)
        report.seconds = time.perf_counter() - started
        return report

    def _prune_if_due(self, since_ms: int) -> None:
        """Delete the rows older than the window every PRUNE_EVERY_S."""
        if time.monotonic() - self._last_prune_s >= PRUNE_EVERY_S:
            self.store.prune(since_ms)
            self._last_prune_s = time.monotonic()

    def _store_fetched(self, report: MirrorReport) -> None:
        """Store every load read and not stored yet (one DuckDB transaction for every
        table's rows) and add them to ``report``; kept for the next call if it fails."""
        new = [load for loads in self._fetched.values() for load in loads]
        if new:
            self._store(new)
        self._fetched = {}
        for load in new:
            self._report(load, report)

    def _fetch_table(self, name: str, since_ms: int, report: MirrorReport) -> _Load | None:
        """:meth:`_load_table`, kept with what was fetched before (dropped when the table
        was planned whole: its plan holds every file not stored)."""
        planned = len(report.planned)
        load = self._load_table(name, since_ms, report)
        if load is not None:
            if len(report.planned) > planned:
                self._fetched[name] = []
            self._fetched.setdefault(name, []).append(load)
        return load

    def _loaded(self, name: str) -> set[str]:
        with self.store.lock:
            rows = self.store.con.execute(
                f"SELECT file_path FROM {LOADED_FILES} WHERE table_name = ?", [name]
            ).fetchall()
        return {path for (path,) in rows}

    def _recorded_snapshot(self, name: str) -> int | None:
        with self.store.lock:
            row = self.store.con.execute(
                f"SELECT snapshot_id FROM {MIRROR_SNAPSHOTS} WHERE table_name = ?", [name]
            ).fetchone()
        return int(row[0]) if row else None

    def _load_table(self, name: str, since_ms: int, report: MirrorReport) -> _Load | None:
        """The table's rows committed since its recorded snapshot (within the window),
        read from the lake, not stored yet; ``None`` when nothing was committed."""
        from pyiceberg.table import FileScanTask

        table = self.lake.table(name)
        self.lake._guard("refresh the table", table.refresh, name)
        current = table.current_snapshot()
        if current is None:
            return None
        fetched = self._fetched.get(name)
        recorded = fetched[-1].snapshot_id if fetched else self._recorded_snapshot(name)
        if recorded == current.snapshot_id:
            return None  # nothing committed since: no manifest read
        appended = self._appended_since(table, recorded, current)
        first_hour_ms = floor_to(since_ms, PARTITION_WIDTH_MS)
        if appended is not None:
            files = self.lake._guard(
                "read the new manifests", lambda: self._files_added(table, current, appended), name
            )
        else:
            report.planned.append(name)
            files = self._plan_unloaded(table, name, current.snapshot_id, report)
        # Pruned by partition: an hour that ended before the window is never opened.
        tasks = [FileScanTask(f) for f in files if _hour_of(f) >= first_hour_ms]
        rows = (
            self.lake._guard(
                f"read {len(tasks)} data files", lambda: self._read(table, tasks), name
            )
            if tasks
            else None
        )
        return _Load(name, rows, [task.file.file_path for task in tasks], current.snapshot_id)

    @staticmethod
    def _report(load: _Load, report: MirrorReport) -> None:
        rows = load.rows
        if rows is None or not rows.num_rows:
            return
        report.files += len(load.paths)
        report.rows += rows.num_rows
        earliest = int(pc.min(rows.column(ICEBERG_TABLES[load.table])).as_py())
        changed = report.changed_from_ms
        if load.table not in changed:
            changed[load.table] = earliest
        elif (known := changed[load.table]) is not None:  # None (reloaded) stays
            changed[load.table] = min(known, earliest)

    @staticmethod
    def _appended_since(table: Any, recorded: int | None, current: Any) -> set[int] | None:
        """The ids of the snapshots after ``recorded`` up to ``current`` when all are
        appends descending from it; ``None`` when the table must be planned whole."""
        from pyiceberg.table.snapshots import Operation, ancestors_of

        if recorded is None:
            return None
        ids: set[int] = set()
        for snapshot in ancestors_of(current, table.metadata):
            if snapshot.snapshot_id == recorded:
                return ids
            summary = snapshot.summary
            if summary is None or summary.operation != Operation.APPEND:
                return None
            ids.add(snapshot.snapshot_id)
        return None  # the recorded snapshot is no ancestor (rolled back, or expired)

    @staticmethod
    def _files_added(table: Any, current: Any, snapshot_ids: set[int]) -> list[Any]:
        """The data files that the appends ``snapshot_ids`` added: only their own manifests
        are read (the current manifest list names who added each)."""
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
        from pyiceberg.utils.concurrent import ExecutorFactory

        manifests = [
            manifest
            for manifest in current.manifests(table.io)
            if manifest.added_snapshot_id in snapshot_ids
            and manifest.content == ManifestContent.DATA
        ]
        # A manifest per commit: fetched at once, as pyiceberg's scans fetch data files.
        entries = ExecutorFactory.get_or_create().map(
            lambda manifest: manifest.fetch_manifest_entry(table.io, discard_deleted=True),
            manifests,
        )
        return [
            entry.data_file
            for manifest_entries in entries
            for entry in manifest_entries
            if entry.status == ManifestEntryStatus.ADDED
        ]

    def _plan_unloaded(
        self, table: Any, name: str, snapshot_id: int, report: MirrorReport
    ) -> list[Any]:
        """The whole snapshot's files not loaded yet (every file after a rewrite)."""
        planned = self.lake._guard(
            "plan the table's files",
            lambda: [task.file for task in table.scan(snapshot_id=snapshot_id).plan_files()],
            name,
        )
        loaded = self._loaded(name)
        if loaded - {f.file_path for f in planned}:
            # A rewrite (compaction, delete): the rows of the files that went are elsewhere now.
            log.info("Iceberg table %s was rewritten; reloading it whole", name)
            report.reloaded.append(name)
            report.changed_from_ms[name] = None
            self._forget(name)
            loaded = set()
        return [f for f in planned if f.file_path not in loaded]

    @staticmethod
    def _read(table: Any, tasks: list[FileScanTask]) -> pa.Table:
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        return scan.to_table(tasks)

    def _store(self, loads: list[_Load]) -> None:
        """Store ``loads`` (oldest first per table) in one transaction, each table at the
        snapshot of its last load."""
        rows: dict[str, list[pa.Table]] = {}
        for load in loads:
            if load.rows is not None and load.rows.num_rows:
                rows.setdefault(load.table, []).append(
                    conform(self._schemas[load.table], load.rows)
                )
        snapshots = {load.table: load.snapshot_id for load in loads}

        def record(con: duckdb.DuckDBPyConnection) -> None:
            paths = [(load.table, path) for load in loads for path in load.paths]
            if paths:
                con.executemany(f"INSERT INTO {LOADED_FILES} VALUES (?, ?)", paths)
            con.executemany(
                f"INSERT OR REPLACE INTO {MIRROR_SNAPSHOTS} VALUES (?, ?)", list(snapshots.items())
            )

        self.store.commit_batch(
            rows,
            group_id=MIRROR_GROUP,
            offsets={},
            now_ts_ms=int(time.time() * 1000),
            in_same_transaction=record,
        )

    def _forget(self, name: str) -> None:
        # A normalised table's rows are its values; its series rows are identities the
        # reload finds known (retention's prune drops those left without values).
        rows = f"{name}_values" if self._schemas[name].series_columns else name
        with self.store.transaction(f"forget the mirror of {name}") as con:
            con.execute(f"DELETE FROM {rows}")
            con.execute(f"DELETE FROM {LOADED_FILES} WHERE table_name = ?", [name])
            con.execute(f"DELETE FROM {MIRROR_SNAPSHOTS} WHERE table_name = ?", [name])
