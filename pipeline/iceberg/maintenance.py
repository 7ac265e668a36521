"""Housekeeping of the Iceberg lake: retention, compaction of closed hours, snapshot expiry
and deletion of the files no snapshot references.

Why: each ingest batch is one Iceberg commit, so a table gains a data file (and a manifest,
and a snapshot) per batch and hour touched: at a batch every 0.5 s, thousands an hour. A
pass of :class:`LakeMaintainer`, per table:

1. **Retention**: the data files of whole hours older than ``retention_ms`` are dropped (a
   partition is an hour, so no file is rewritten).
2. **Compaction**: each closed hour (ended :data:`CLOSED_AFTER_MS` ago) with at least
   ``min_files`` files is read and written back as one file, sorted by event time.
3. **Expiry**: snapshots older than ``keep_ms`` are removed from the table's metadata.
4. **Deletion** (:mod:`pipeline.iceberg.cleanup`): the files only expired snapshots
   referenced (the small files a compaction or retention replaced, old manifests and
   manifest lists) are deleted from the store at once; other unreferenced files (orphans:
   commits that lost a race, writers that died) once older than ``orphan_grace_ms``.

**Safe while ingesters commit.**

* A rewrite (1 or 2) names the exact data files it removes and commits one ``overwrite``
  snapshot on the head it read. The snapshot requires that head (pyiceberg's
  ``AssertRefSnapshotId``, checked by the SQL catalog against the table's fresh metadata,
  then a compare-and-swap of the metadata location), so an ingester's append in between
  makes it fail with ``CommitFailedException``. It is then retried on the refreshed table:
  the ingester's new files are untouched (only the named files go), and the compacted file,
  written once, is committed again. If a named file is gone (another maintainer got there
  first), pyiceberg refuses the commit (``ValidationException``) and that hour is left.
* **Offsets.** The rewrite's snapshot carries the head's ``llmslo.offsets.*`` summary keys
  (every group's) unchanged, and ingesters read offsets from the current snapshot alone
  (:meth:`~pipeline.iceberg.lake.IcebergLake.read_offsets`): a partition resumes where it
  stood before the pass.
* **Expiry** never removes the head (pyiceberg protects branch heads), so it cannot change
  the offsets; ``keep_ms`` must cover an ingester's commit retries (``retry_for_s``),
  which look for their own commit id among the snapshots after a lost reply.
* pyiceberg's own commit retries stay off (the tables' ``commit.retry.num-retries: 0``):
  they would re-apply the summary carried from a stale head.
* **Deletion** never touches a file a commit in flight may reference: an expired
  snapshot's files cannot become a new commit's (its parent must be the head), and files
  no snapshot ever held are left for the grace period (see :mod:`pipeline.iceberg.cleanup`).
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline.config import StoreConfig
from pipeline.errors import ConfigError
from pipeline.iceberg.cleanup import delete_unreferenced
from pipeline.iceberg.lake import OFFSETS_PREFIX, IcebergLake, LakeError
from pipeline.iceberg.tables import ICEBERG_TABLES, PARTITION_WIDTH_MS
from pipeline.units import DAY_MS, HOUR_MS

__all__ = [
    "CLOSED_AFTER_MS",
    "LakeMaintainer",
    "MaintenancePolicy",
    "TableMaintenance",
    "maintenance_policy",
]

log = logging.getLogger(__name__)

#: An hour is compacted once it ended this long ago: an ingester's late batch (lag, a
#: retried commit) still lands in it, and would become the next pass's second file.
CLOSED_AFTER_MS = 5 * 60 * 1000
#: Attempts at one commit that keeps losing races with ingesters before the pass gives up
#: on it (the next pass tries again; nothing is lost either way).
MAX_ATTEMPTS = 30


@dataclass(frozen=True)
class MaintenancePolicy:
    """What a pass keeps: rows of ``retention_ms``, snapshots of ``keep_ms``, and
    unreferenced files younger than ``orphan_grace_ms`` (a writer may be about to commit
    them; Iceberg's own default is 3 days)."""

    retention_ms: int
    keep_ms: int
    min_files: int = 2  # an hour with fewer data files is left as it is
    orphan_grace_ms: int = 3 * DAY_MS


@dataclass
class TableMaintenance:
    """What a pass did to one table (files and bytes are the current snapshot's data files)."""

    table: str
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    hours_dropped: int = 0
    hours_compacted: int = 0
    snapshots_expired: int = 0
    files_deleted: int = 0  # unreferenced files deleted from the store (any kind)
    bytes_deleted: int = 0
    orphans_deleted: int = 0  # of files_deleted, those no snapshot ever held
    conflicts: int = 0  # commits refused because an ingester committed first (retried)
    skipped: list[str] = field(default_factory=list)  # what was given up, and why
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return asdict(self)


class LakeMaintainer:
    """Maintenance passes over ``lake``'s tables (see the module's docstring).

    ``sleep`` waits between conflicting attempts (seconds; injected for tests);
    ``should_stop`` ends a pass early, between two commits (a process shutting down).
    """

    def __init__(
        self,
        lake: IcebergLake,
        policy: MaintenancePolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.lake = lake
        self.policy = policy
        self._sleep = sleep
        self._should_stop = should_stop

    def run(self, now_ms: int) -> list[TableMaintenance]:
        """One pass over every table, as of ``now_ms`` (epoch ms). Raises
        :class:`~pipeline.iceberg.lake.LakeError` when the lake is unreachable."""
        reports = []
        for name in sorted(set(self.lake.topics.values())):
            if self._should_stop():
                break
            reports.append(self.maintain(name, now_ms))
        return reports

    def maintain(self, name: str, now_ms: int) -> TableMaintenance:
        """Retention, compaction and expiry of table ``name``."""
        started = time.perf_counter()
        report = TableMaintenance(name)
        table = self.lake.table(name)
        files = self._live_files(table, name)
        report.files_before, report.bytes_before = _count(files)
        self._drop_old_hours(table, name, files, now_ms, report)
        self._compact_closed_hours(table, name, now_ms, report)
        expired = self._expire(table, name, now_ms, report)
        if not self._should_stop():
            self._delete_unreferenced(table, name, expired, now_ms, report)
        report.files_after, report.bytes_after = _count(self._live_files(table, name))
        report.seconds = time.perf_counter() - started
        log.info(
            "maintained %s: %d → %d files, %d → %d bytes, %d hours compacted, %d dropped, "
            "%d snapshots expired, %d files (%d bytes) deleted, %d conflicts in %.1f s",
            name,
            report.files_before,
            report.files_after,
            report.bytes_before,
            report.bytes_after,
            report.hours_compacted,
            report.hours_dropped,
            report.snapshots_expired,
            report.files_deleted,
            report.bytes_deleted,
            report.conflicts,
            report.seconds,
        )
        return report

    def _live_files(self, table: Any, name: str) -> list[Any]:
        """The data files of the current snapshot (pyiceberg ``DataFile``), freshly loaded."""
        self.lake._guard("refresh the table", table.refresh, name)
        return [
            task.file
            for task in self.lake._guard(
                "plan the table's files", lambda: list(table.scan().plan_files()), name
            )
        ]

    def _drop_old_hours(
        self, table: Any, name: str, files: list[Any], now_ms: int, report: TableMaintenance
    ) -> None:
        cutoff_ms = (now_ms - self.policy.retention_ms) // HOUR_MS * HOUR_MS
        old = [f for f in files if _hour_of(f) + PARTITION_WIDTH_MS <= cutoff_ms]
        if old and self._replace(table, name, old, [], report, f"drop hours before {cutoff_ms}"):
            report.hours_dropped += len({_hour_of(f) for f in old})

    def _compact_closed_hours(
        self, table: Any, name: str, now_ms: int, report: TableMaintenance
    ) -> None:
        by_hour: dict[int, list[Any]] = defaultdict(list)
        for data_file in self._live_files(table, name):
            by_hour[_hour_of(data_file)].append(data_file)
        closed_before_ms = now_ms - CLOSED_AFTER_MS
        for hour_ms, files in sorted(by_hour.items()):
            if self._should_stop():
                return
            if hour_ms + PARTITION_WIDTH_MS > closed_before_ms:
                continue
            if len(files) < self.policy.min_files:
                continue
            written = self.lake._guard(
                f"compact hour {hour_ms} ({len(files)} files)",
                lambda files=files: self._write_compacted(table, name, files),  # type: ignore[misc]
                name,
            )
            read, kept = (sum(int(f.record_count) for f in fs) for fs in (files, written))
            if read != kept:  # never trade rows for fewer files
                report.skipped.append(f"compact hour {hour_ms}: {read} rows read, {kept} written")
                _delete_quietly(table, written)
                continue
            if self._replace(table, name, files, written, report, f"compact hour {hour_ms}"):
                report.hours_compacted += 1
            else:
                _delete_quietly(table, written)

    def _write_compacted(self, table: Any, name: str, files: list[Any]) -> list[Any]:
        """The rows of ``files`` written as new data files (one unless past the table's
        target file size), not yet in any snapshot."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
        from pyiceberg.table import FileScanTask

        scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        rows = scan.to_table([FileScanTask(f) for f in files]).sort_by(ICEBERG_TABLES[name])
        return list(
            _dataframe_to_data_files(
                table_metadata=table.metadata, df=rows, io=table.io, write_uuid=uuid.uuid4()
            )
        )

    def carried_summary(self, table: Any) -> dict[str, str]:
        """The head's offsets (``llmslo.offsets.*``, every group's), which each snapshot of
        the pass carries unchanged so that the current snapshot still says where every
        partition stands."""
        snapshot = table.current_snapshot()
        if snapshot is None or snapshot.summary is None:
            return {}
        properties = snapshot.summary.additional_properties
        return {key: value for key, value in properties.items() if _is_offsets(key)}

    def _replace(
        self,
        table: Any,
        name: str,
        removed: list[Any],
        added: list[Any],
        report: TableMaintenance,
        what: str,
    ) -> bool:
        """Commit one snapshot that removes exactly ``removed`` and adds ``added``; retried
        on the refreshed table while ingesters win the race. Whether it committed."""
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        attempts = 0
        while attempts < MAX_ATTEMPTS and not (attempts and self._should_stop()):
            attempts += 1
            try:
                with table.transaction() as change:
                    summary = self.carried_summary(table)
                    with change.update_snapshot(snapshot_properties=summary).overwrite() as swap:
                        for data_file in removed:
                            swap.delete_data_file(data_file)
                        for data_file in added:
                            swap.append_data_file(data_file)
                return True
            except CommitFailedException:
                report.conflicts += 1
                self._sleep(random.uniform(0, 0.05 * min(attempts, 10)))
            except ValidationException as exc:  # a named file is gone: another maintainer
                report.skipped.append(f"{what}: {exc}")
                self.lake._guard("refresh the table", table.refresh, name)
                return False
            except Exception as exc:  # the store or catalog: the next pass tries again
                raise LakeError(f"cannot {what} in {name}: {exc}") from exc
            self.lake._guard("reload the table after a conflict", table.refresh, name)
        report.skipped.append(f"{what}: {attempts} attempts lost to ingesters' commits")
        return False

    def _expire(self, table: Any, name: str, now_ms: int, report: TableMaintenance) -> list[Any]:
        """Expire the snapshots older than ``keep_ms``; the snapshots that went (pyiceberg
        ``Snapshot``, as loaded before)."""
        from pyiceberg.exceptions import CommitFailedException

        cutoff_ms = now_ms - self.policy.keep_ms
        older_than = datetime.fromtimestamp(cutoff_ms / 1000, tz=UTC)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            head = table.current_snapshot()
            old = {
                s.snapshot_id
                for s in table.metadata.snapshots
                if s.timestamp_ms < cutoff_ms
                and (head is None or s.snapshot_id != head.snapshot_id)
            }
            if not old:
                return []
            before = list(table.metadata.snapshots)
            try:
                table.maintenance.expire_snapshots().older_than(older_than).commit()
            except CommitFailedException:
                report.conflicts += 1
                self._sleep(random.uniform(0, 0.05 * min(attempt, 10)))
                self.lake._guard("reload the table after a conflict", table.refresh, name)
                continue
            except Exception as exc:
                raise LakeError(f"cannot expire snapshots of {name}: {exc}") from exc
            # The commit left the table at the metadata it committed (pyiceberg's _do_commit):
            # no reload here; the deletion step reloads right before it lists the files.
            remaining = {s.snapshot_id for s in table.metadata.snapshots}
            report.snapshots_expired += len(old - remaining)
            return [s for s in before if s.snapshot_id not in remaining]
        report.skipped.append(f"expire snapshots: {MAX_ATTEMPTS} attempts lost")
        return []

    def _delete_unreferenced(
        self, table: Any, name: str, expired: list[Any], now_ms: int, report: TableMaintenance
    ) -> None:
        # Reloaded: the files the ingesters committed since the expiry count as referenced.
        self.lake._guard("refresh the table", table.refresh, name)
        swept = self.lake._guard(
            "delete unreferenced files",
            lambda: delete_unreferenced(
                table, expired, now_ms=now_ms, orphan_grace_ms=self.policy.orphan_grace_ms
            ),
            name,
        )
        report.files_deleted += swept.files
        report.bytes_deleted += swept.bytes
        report.orphans_deleted += swept.orphans


def _is_offsets(key: str) -> bool:
    return key.startswith(OFFSETS_PREFIX)


def _hour_of(data_file: Any) -> int:
    """The hour (epoch ms) of a data file's partition."""
    return int(data_file.partition[0])


def _count(files: Iterable[Any]) -> tuple[int, int]:
    files = list(files)
    return len(files), sum(int(f.file_size_in_bytes) for f in files)


def _delete_quietly(table: Any, data_files: list[Any]) -> None:
    """Remove files a compaction wrote and did not commit (no snapshot refers to them)."""
    for data_file in data_files:
        try:
            table.io.delete(data_file.file_path)
        except Exception as exc:  # an orphan left behind costs bytes, not correctness
            log.warning("cannot delete uncommitted file %s: %s", data_file.file_path, exc)


def maintenance_policy(store: StoreConfig) -> MaintenancePolicy:
    """The policy ``store`` configures: rows of ``raw_retention_days``, snapshots of
    ``iceberg.snapshot_keep_s``, orphans younger than ``iceberg.orphan_grace_s``."""
    if store.iceberg is None:
        raise ConfigError("lake maintenance needs store.lake: iceberg and store.iceberg")
    return MaintenancePolicy(
        retention_ms=int(store.raw_retention_days * DAY_MS),
        keep_ms=int(store.iceberg.snapshot_keep_s * 1000),
        orphan_grace_ms=int(store.iceberg.orphan_grace_s * 1000),
    )
