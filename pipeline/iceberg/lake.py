"""Append committed batches to Iceberg tables, with the Kafka offsets in the same commit.

Why batches, not frozen hours: the offsets an Iceberg commit records must describe
exactly the rows it adds. A frozen hour is cut by event time, not by offset, so its
commit could not say which records of a partition it holds, and a new owner resuming
from it would lose or double the rest. Each committed batch (``ingest.batch_max_ms`` /
``batch_max_rows``) is therefore one Iceberg commit per table it touches, *before* the
DuckDB commit and Kafka's: the table is the truth for the lake.

Offsets ride in the snapshot summary (``llmslo.offsets.<group>``, JSON), and every commit
carries the whole map forward from its parent snapshot (its own partitions updated), so the
current snapshot alone says where every partition of the table stands, whoever wrote it
and whatever snapshots were expired. Catalog commits are optimistic: a commit whose parent
moved fails (``CommitFailedException``); it is retried on the refreshed table, merging the
offsets again. Each commit carries a unique ``llmslo.commit-id``: after an error that may
hide a success (a lost reply), the retry first looks for its own id, so nothing doubles.

Order and crashes. Iceberg, then DuckDB, then Kafka, for each batch; the ingester appends
batch N+1 to the lake while batch N goes into DuckDB (never N+1 before N is in the lake),
so the table may be one batch ahead of the file. A SIGKILL after the Iceberg commit
leaves the table ahead of the ingester's file and Kafka; whoever owns the partition next
(the same ingester after a restart, or another) starts at the table's offset, so the
lake holds each record once. Those batches (one or two) are then missing from the dead ingester's own
DuckDB file: the lake is complete, a file is the process's working copy.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline._offsets import LogIdentity, StoredOffset
from pipeline.config import StoreConfig
from pipeline.errors import ConfigError, StoreError
from pipeline.iceberg.config import IcebergConfig, catalog_properties
from pipeline.iceberg.files import write_data_files
from pipeline.iceberg.tables import (
    ICEBERG_TABLES,
    PARTITION_WIDTH_MS,
    lake_arrow_schema,
    lake_topics,
    to_lake_batch,
)

__all__ = ["CommitReport", "IcebergLake", "LakeError", "open_iceberg_lake"]

log = logging.getLogger(__name__)

#: The modules whose errors are the catalog's: the SQL catalog's drivers, and the HTTP client
#: of the REST catalog (its refusals are pyiceberg's ``RESTError``s); the object store's are
#: pyarrow's ``OSError``s and botocore's.
_CATALOG_ERRORS = frozenset({"sqlalchemy", "psycopg2", "sqlite3", "requests", "urllib3"})

OFFSETS_PREFIX = "llmslo.offsets."
COMMIT_ID = "llmslo.commit-id"
MAX_BACKOFF_S = 5.0
#: Properties of every lake table: the lake retries its own conflicts (see
#: ``_with_lake_properties``), and each commit deletes the table's metadata files more than
#: 100 versions old (every commit writes one listing all snapshots; they would pile up).
#: A column's Parquet dictionary stops at 128 KiB (Iceberg's default: 2 MiB), then the
#: column chunk goes on plain-encoded: a column of mostly distinct values (sample values,
#: request ids) no longer fills a 2 MiB dictionary that is larger than the values it
#: encodes; the names of 4,096 instances still fit. Measured on an ingester's batch of
#: engine samples: Parquet encoding 222 → 111 ms of CPU per million rows, 9.65 → 7.78
#: bytes a row; on the requests 54 → 43 bytes a row (docs/topology.md).
TABLE_PROPERTIES = {
    "commit.retry.num-retries": "0",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
    "write.parquet.dict-size-bytes": str(128 * 1024),
}
#: An object store's refusals that retrying cannot fix (spaces and underscores removed:
#: botocore says AccessDenied, pyarrow ACCESS_DENIED).
_REFUSALS = (
    "accessdenied",
    "invalidaccesskeyid",
    "accesskeyidyouprovideddoesnotexist",
    "signaturedoesnotmatch",
    "nosuchbucket",
    "forbidden",
    "responsecode403",
)


class LakeError(StoreError):
    """The Iceberg lake refused a write or stayed unreachable (names bucket, key or table)."""


@dataclass
class CommitReport:
    """What committing one batch to the lake took."""

    tables: int = 0
    rows: int = 0
    conflicts: int = 0
    retries: int = 0  # after the store or catalog was unreachable
    seconds: float = 0.0


def _encode(offsets: Mapping[tuple[str, int], StoredOffset]) -> str:
    return json.dumps(
        {
            f"{topic}/{partition}": [o.next_offset, o.log.cluster_id, o.log.topic_id]
            for (topic, partition), o in sorted(offsets.items())
        },
        separators=(",", ":"),
    )


def _decode(text: str | None) -> dict[tuple[str, int], StoredOffset]:
    if not text:
        return {}
    found = {}
    for key, (next_offset, cluster_id, topic_id) in json.loads(text).items():
        topic, _, partition = key.rpartition("/")
        found[(topic, int(partition))] = StoredOffset(
            int(next_offset), LogIdentity(cluster_id, topic_id)
        )
    return found


def _is_refusal(exc: BaseException) -> bool:
    """Whether retrying cannot help: the store refused us, or this process cannot write
    Iceberg at all (a missing optional module: pyiceberg's ``NotInstalledError``)."""
    if isinstance(exc, ImportError) or type(exc).__name__ == "NotInstalledError":
        return True
    text = f"{type(exc).__name__} {exc}".lower().replace("_", "").replace(" ", "")
    return any(word in text for word in _REFUSALS)


class IcebergLake:
    """The Iceberg tables of one consumer group's ingesters (one instance per process).

    ``topics`` maps each consumed topic (prefixed) to its table; offsets of topics whose
    table is not in :data:`ICEBERG_TABLES` stay with DuckDB and Kafka only.
    """

    def __init__(self, config: IcebergConfig, *, group_id: str, topics: Mapping[str, str]) -> None:
        try:
            from pyiceberg.catalog.sql import SqlCatalog
        except ImportError as exc:  # the `lake` extra
            raise ConfigError(
                "store.lake: iceberg needs pyiceberg: pip install 'llmslo[lake]'"
            ) from exc
        self.config = config
        self.group_id = group_id
        self.topics = {t: table for t, table in topics.items() if table in ICEBERG_TABLES}
        self._offsets_key = OFFSETS_PREFIX + group_id

        def open_catalog() -> Any:
            properties = catalog_properties(config, create_local=True)
            try:
                return SqlCatalog("llmslo", **properties)
            except Exception:  # another process created the catalog's tables meanwhile
                return SqlCatalog("llmslo", **properties)

        self._catalog = self._guard("open the catalog", open_catalog)
        self._tables: dict[str, Any] = {}
        self._guard(f"create namespace {config.namespace}", self._create_namespace)
        for table in sorted(set(self.topics.values())):
            self._tables[table] = self._guard(
                f"open table {table}", functools.partial(self._open, table)
            )

    def _where(self, table: str | None = None) -> str:
        bucket = self.config.bucket
        place = (
            f"bucket {bucket!r}, warehouse {self.config.warehouse}"
            if bucket
            else (f"warehouse {self.config.warehouse}")
        )
        if table is not None:
            place += f", table {self.config.namespace}.{table}"
            loaded = self._tables.get(table)
            if loaded is not None:
                place += f" (key prefix {loaded.location()})"
        return place

    def _unreachable(self, exc: BaseException) -> str:
        """Which part of the lake failed, named, and the error's first line: the catalog
        (SQLAlchemy's errors are often many lines with the statement) or the store."""
        from pyiceberg.exceptions import RESTError

        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if isinstance(exc, RESTError) or type(exc).__module__.split(".")[0] in _CATALOG_ERRORS:
            return f"Iceberg catalog unreachable ({self.config.catalog_uri}): {text}"
        return f"Iceberg object store unreachable ({self._where()}): {text}"

    def _guard(self, what: str, action: Callable[[], Any], table: str | None = None) -> Any:
        """``action()``, its failures as :class:`LakeError` naming bucket, key and table."""
        try:
            return action()
        except LakeError:
            raise
        except Exception as exc:  # pyiceberg, pyarrow, SQLAlchemy and botocore each have their own
            raise LakeError(f"Iceberg lake: cannot {what} ({self._where(table)}): {exc}") from exc

    def _create_namespace(self) -> None:
        """The namespace, created unless it exists. Two ingesters starting together can both
        find it missing; the loser's insert is refused by the catalog (SQLite and PostgreSQL
        raise an integrity error, not pyiceberg's ``NamespaceAlreadyExistsError``), which is
        fine once the namespace is there."""
        namespace = self.config.namespace
        try:
            self._catalog.create_namespace_if_not_exists(namespace)
        except Exception:
            if not self._catalog.namespace_exists(namespace):
                raise

    def _open(self, table: str) -> Any:
        from pyiceberg.exceptions import (
            CommitFailedException,
            NoSuchTableError,
            TableAlreadyExistsError,
        )
        from pyiceberg.transforms import TruncateTransform

        identifier = f"{self.config.namespace}.{table}"
        try:
            loaded = self._catalog.load_table(identifier)
            return self._with_new_columns(table, self._with_lake_properties(loaded))
        except NoSuchTableError:
            pass
        try:
            with (
                self._catalog.create_table_transaction(
                    identifier, schema=lake_arrow_schema(table), properties=TABLE_PROPERTIES
                ) as create,
                create.update_spec() as spec,
            ):
                spec.add_field(
                    ICEBERG_TABLES[table], TruncateTransform(PARTITION_WIDTH_MS), "hour_ms"
                )
        except (TableAlreadyExistsError, CommitFailedException):
            # Another ingester created it meanwhile: the catalog refuses the insert, or
            # the commit's "table does not exist" requirement fails.
            pass
        return self._with_lake_properties(self._catalog.load_table(identifier))

    @staticmethod
    def _with_new_columns(name: str, table: Any) -> Any:
        """``table`` with the columns a newer release appended to its record schema (nullable,
        as schemas append them): Iceberg evolves the schema in place, old files read them as
        null, and this release's batches append with them."""
        from pyiceberg.exceptions import CommitFailedException

        wanted = lake_arrow_schema(name)
        for _ in range(10):
            present = {field.name for field in table.schema().fields}
            if set(wanted.names) <= present:
                return table
            try:
                with table.update_schema() as update:
                    update.union_by_name(wanted)
            except CommitFailedException:
                pass
            table.refresh()
        raise LakeError(f"cannot add new columns to {table.name()}: commits keep conflicting")

    @staticmethod
    def _with_lake_properties(table: Any) -> Any:
        """``table`` with :data:`TABLE_PROPERTIES` (created elsewhere, or by a release
        before one of them), pyiceberg's own commit retries off among them.

        pyiceberg (≥ 0.10) re-applies a conflicting append on the refreshed table with the
        snapshot properties it was given, i.e. with offsets merged from the stale parent: it
        would record another ingester's partitions at their old offsets. :meth:`_commit`
        retries itself and merges the offsets again.
        """
        from pyiceberg.exceptions import CommitFailedException

        for _ in range(10):
            if all(table.properties.get(k) == v for k, v in TABLE_PROPERTIES.items()):
                return table
            try:
                with table.transaction() as change:
                    change.set_properties(TABLE_PROPERTIES)
            except CommitFailedException:
                pass
            table.refresh()
        raise LakeError(
            f"cannot set {TABLE_PROPERTIES} on {table.name()}: commits keep conflicting"
        )

    def table(self, name: str) -> Any:
        """The pyiceberg table ``name`` as last loaded (for readers, benches and tests)."""
        return self._tables[name]

    def read_offsets(self) -> dict[tuple[str, int], StoredOffset]:
        """Where each partition of this group stands in the lake (every table's current
        snapshot, freshly loaded)."""
        found: dict[tuple[str, int], StoredOffset] = {}
        for name, table in self._tables.items():
            self._guard("read the table's offsets", table.refresh, name)
            found |= self._offsets_of(table)
        return found

    def _offsets_of(self, table: Any) -> dict[tuple[str, int], StoredOffset]:
        snapshot = table.current_snapshot()
        if snapshot is None:
            return {}
        return _decode(snapshot.summary.get(self._offsets_key))

    def append_batch(
        self,
        rows: Mapping[str, Sequence[pa.Table]],
        offsets: Mapping[tuple[str, int], StoredOffset],
        *,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> CommitReport:
        """Append ``rows`` of every lake table whose topic has ``offsets`` in this batch,
        each table's commit with its topic's offsets. Raises :class:`LakeError`."""
        started = time.perf_counter()
        report = CommitReport()
        by_table: dict[str, dict[tuple[str, int], StoredOffset]] = {}
        for (topic, partition), stored in offsets.items():
            table = self.topics.get(topic)
            if table is not None:
                by_table.setdefault(table, {})[(topic, partition)] = stored
        for table, table_offsets in sorted(by_table.items()):
            data = to_lake_batch(table, list(rows.get(table, ())))
            self._commit(table, data, table_offsets, report, should_stop)
            report.tables += 1
            report.rows += data.num_rows
        report.seconds = time.perf_counter() - started
        return report

    def _commit(
        self,
        name: str,
        data: pa.Table,
        offsets: Mapping[tuple[str, int], StoredOffset],
        report: CommitReport,
        should_stop: Callable[[], bool],
    ) -> None:
        from pyiceberg.exceptions import CommitFailedException

        table = self._tables[name]
        commit_id = uuid.uuid4().hex
        deadline = time.monotonic() + self.config.retry_for_s
        delay = 0.1
        ambiguous = False  # a failure that may hide a success: look for our commit first
        files: list[Any] | None = None  # written once; a retried commit appends them again
        while True:
            try:
                if ambiguous:
                    table.refresh()
                    if any(s.summary.get(COMMIT_ID) == commit_id for s in table.snapshots()):
                        return
                if files is None:
                    files = write_data_files(table, data)
                merged = self._offsets_of(table)
                for key, stored in offsets.items():
                    if key not in merged or merged[key].next_offset < stored.next_offset:
                        merged[key] = stored
                summary = {self._offsets_key: _encode(merged), COMMIT_ID: commit_id}
                with (
                    table.transaction() as change,
                    change.update_snapshot(snapshot_properties=summary).fast_append() as append,
                ):
                    for data_file in files:
                        append.append_data_file(data_file)
                return
            except CommitFailedException:
                # Another ingester committed first: nothing of ours is in the table.
                report.conflicts += 1
                self._guard("reload the table after a conflict", table.refresh, name)
                time.sleep(random.uniform(0, 0.05 * min(report.conflicts, 10)))
            except Exception as exc:
                if _is_refusal(exc):
                    raise LakeError(
                        f"Iceberg lake refused the commit ({self._where(name)}): {exc}"
                    ) from exc
                if time.monotonic() > deadline or should_stop():
                    raise LakeError(
                        f"Iceberg lake unreachable for {self.config.retry_for_s:.0f} s or "
                        f"stopping ({self._where(name)}): {exc}"
                    ) from exc
                report.retries += 1
                ambiguous = True
                log.warning(
                    "%s; commit to %s retrying in %.1f s", self._unreachable(exc), name, delay
                )
                time.sleep(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)


def open_iceberg_lake(store: StoreConfig, group_id: str, topic_prefix: str) -> IcebergLake | None:
    """The group's Iceberg lake when ``store.lake`` is ``iceberg``, else ``None``."""
    if store.lake != "iceberg" or store.iceberg is None:
        return None
    return IcebergLake(store.iceberg, group_id=group_id, topics=lake_topics(topic_prefix))
