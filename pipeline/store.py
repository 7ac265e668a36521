"""The DuckDB store: one file holding the raw tables, the dead letters and ingest offsets.

Tables are created from :mod:`pipeline.schema` (one per record schema) plus two of the
store's own:

* ``deadletter``: input that could not be decoded, with the reason and the payload;
* ``ingest_offsets``: per consumer group and partition, the next Kafka offset to read and
  the identity of the log it indexes (:mod:`pipeline._offsets`).

High-volume sample schemas (``series_columns`` set) are stored normalised: each series once
in ``<table>_series``, each sample as ``(ts_ms, series_id, value)`` in ``<table>_values``,
and a view ``<table>`` joins them back into the schema's columns (:mod:`pipeline.series`).

:meth:`Store.commit_batch` writes rows, dead letters and offsets in **one transaction**:
after a crash at any point the file holds either all of a batch and its offsets or none
of it, and the ingester resumes from the stored offsets: nothing lost, nothing doubled.
"""

from __future__ import annotations

import glob
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from pipeline._offsets import LogIdentity, StoredOffset
from pipeline.codec import join_tables
from pipeline.errors import StoreError
from pipeline.schema import RecordSchema, iter_schemas
from pipeline.series import SeriesIndex

__all__ = [
    "DEADLETTER_COLUMNS",
    "OFFSET_COLUMNS",
    "DeadLetter",
    "LogIdentity",
    "Store",
    "StoredOffset",
    "duckdb_type",
    "insert_arrow",
    "read_peer_offsets",
]

log = logging.getLogger(__name__)

#: Raw tables with their event-time column (what retention prunes and the lake exports).
RAW_TIME_COLUMNS = {
    "engine_samples_values": "ts_ms",
    "gpu_samples_values": "ts_ms",
    "requests": "received_ts_ms",
    "jobs_heartbeats": "ts_ms",
}

#: Payload bytes kept in the dead-letter table; the whole payload also goes to the
#: dead-letter topic, and ``payload_bytes`` says how long it was.
DEADLETTER_PAYLOAD_LIMIT = 1024 * 1024

DEADLETTER_COLUMNS: Sequence[tuple[str, str, str]] = (
    ("received_ts_ms", "BIGINT NOT NULL", "when the ingester saw the message, Unix epoch ms"),
    ("topic", "VARCHAR NOT NULL", "Kafka topic"),
    ("partition", "INTEGER NOT NULL", "Kafka partition"),
    ('"offset"', "BIGINT NOT NULL", "Kafka offset"),
    ("key", "BLOB", "message key"),
    ("reason", "VARCHAR NOT NULL", "stable reason token: oversized, not_arrow, truncated_arrow, …"),
    ("error", "VARCHAR NOT NULL", "what was wrong, in words"),
    ("headers_json", "VARCHAR", "message headers as JSON (values as latin-1 text)"),
    ("payload_bytes", "BIGINT NOT NULL", "length of the payload"),
    ("payload", "BLOB", "the payload, cut to the first 1 MiB"),
)

OFFSET_COLUMNS: Sequence[tuple[str, str, str]] = (
    ("group_id", "VARCHAR NOT NULL", "Kafka consumer group of the ingester"),
    ("topic", "VARCHAR NOT NULL", "Kafka topic"),
    ("partition", "INTEGER NOT NULL", "Kafka partition"),
    ("next_offset", "BIGINT NOT NULL", "first offset not yet stored"),
    ("updated_ts_ms", "BIGINT NOT NULL", "when it was written, Unix epoch ms"),
    ("cluster_id", "VARCHAR", "cluster id of the log the offset indexes; NULL when not known"),
    (
        "topic_id",
        "VARCHAR",
        "topic UUID of the log the offset indexes (new at each topic creation); NULL when not known",
    ),
)

_ARROW_TO_DUCKDB = {
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.string(): "VARCHAR",
}


def duckdb_type(arrow_type: pa.DataType) -> str:
    """The DuckDB column type for an Arrow type used in our schemas."""
    if pa.types.is_dictionary(arrow_type):
        return duckdb_type(arrow_type.value_type)
    if pa.types.is_list(arrow_type):
        return duckdb_type(arrow_type.value_type) + "[]"
    try:
        return _ARROW_TO_DUCKDB[arrow_type]
    except KeyError:
        raise StoreError(f"no DuckDB type for Arrow type {arrow_type}") from None


@dataclass(frozen=True)
class DeadLetter:
    """One undecodable message, as stored and re-published."""

    received_ts_ms: int
    topic: str
    partition: int
    offset: int
    key: bytes | None
    reason: str
    error: str
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=tuple)
    payload: bytes | None = None
    #: Length of the payload as received, when ``payload`` holds only its first bytes.
    payload_bytes: int | None = None

    def as_row(self) -> tuple[object, ...]:
        payload = self.payload or b""
        headers = {k: (v or b"").decode("latin-1") for k, v in self.headers}
        return (
            self.received_ts_ms,
            self.topic,
            self.partition,
            self.offset,
            self.key,
            self.reason,
            self.error,
            json.dumps(headers, sort_keys=True),
            len(payload) if self.payload_bytes is None else self.payload_bytes,
            payload[:DEADLETTER_PAYLOAD_LIMIT],
        )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _table_ddl(name: str, columns: Iterable[tuple[str, str, str]], key: str = "") -> list[str]:
    body = ",\n  ".join(f"{col} {type_}" for col, type_, _ in columns)
    tail = f",\n  PRIMARY KEY ({key})" if key else ""
    statements = [f"CREATE TABLE IF NOT EXISTS {name} (\n  {body}{tail}\n)"]
    # A file from an earlier release gains the nullable columns added since (appended, as
    # schemas append them, so positional inserts still line up).
    statements += [
        f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {col} {type_}"
        for col, type_, _ in columns
        if "NOT NULL" not in type_
    ]
    statements += [f"COMMENT ON COLUMN {name}.{col} IS {_quote(doc)}" for col, _, doc in columns]
    return statements


def _normalised_ddl(schema: RecordSchema) -> list[str]:
    """``<table>_series`` + ``<table>_values`` and the view ``<table>`` that joins them."""
    columns = {name: (name, type_, doc) for name, type_, doc in _schema_columns(schema)}
    series = [
        ("series_id", "BIGINT NOT NULL", "hash of the identifying columns (same in every file)")
    ]
    series += [columns[name] for name in schema.series_columns]
    values = [
        columns["ts_ms"],
        ("series_id", "BIGINT NOT NULL", f"the series, see {schema.table}_series"),
        columns["value"],
    ]
    select = ", ".join(
        f"v.{n}" if n in ("ts_ms", "value") else f"s.{n}" for n in schema.arrow.names
    )
    return [
        *_table_ddl(f"{schema.table}_series", series),
        f"COMMENT ON TABLE {schema.table}_series IS {_quote('each distinct series of ' + schema.table + ' once')}",
        *_table_ddl(f"{schema.table}_values", values),
        f"COMMENT ON TABLE {schema.table}_values IS {_quote('one row per sample of ' + schema.table)}",
        f"CREATE OR REPLACE VIEW {schema.table} AS SELECT {select} FROM {schema.table}_values v "
        f"JOIN {schema.table}_series s USING (series_id)",
        f"COMMENT ON VIEW {schema.table} IS {_quote(schema.doc)}",
        *(
            f"COMMENT ON COLUMN {schema.table}.{name} IS {_quote(doc)}"
            for name, _, doc in columns.values()
        ),
    ]


def _schema_columns(schema: RecordSchema) -> list[tuple[str, str, str]]:
    return [
        (
            f.name,
            duckdb_type(f.type) + ("" if f.nullable else " NOT NULL"),
            f.metadata[b"doc"].decode(),
        )
        for f in schema.arrow
    ]


class Store:
    """A DuckDB file with llmslo's tables. Single writer: one ``Store`` per file and process.

    ``read_only=True`` opens it for readers (jobs, dashboards) while no writer holds it;
    ``must_exist=True`` opens an existing file for writing but never creates one (commands
    that read a store and keep caches in it); ``memory_limit`` (DuckDB syntax, e.g.
    ``"256MB"``) bounds DuckDB's buffer pool; ``checkpoint_threshold`` (the same syntax)
    is the write-ahead log's size at which a commit also checkpoints (DuckDB's default
    16 MiB): a writer that checkpoints itself (:meth:`checkpoint`) at a quiet moment raises
    it, so no commit of its timed work carries a checkpoint.

    Raises :class:`StoreError` when the file cannot be opened, when a reader or a
    ``must_exist`` caller names a file that does not exist (nothing is created), or when a
    read-only file does not hold llmslo's tables.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        must_exist: bool = False,
        memory_limit: str | None = None,
        checkpoint_threshold: str | None = None,
    ) -> None:
        self.path = Path(path)
        if (read_only or must_exist) and not self.path.is_file():
            raise StoreError(
                f"no DuckDB store at {self.path}: nothing was ingested there "
                "(check --db or store.path)"
            )
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        settings: dict[str, str | bool | int | float | list[str]] = {}
        if memory_limit:
            settings["memory_limit"] = memory_limit
        if checkpoint_threshold:
            settings["checkpoint_threshold"] = checkpoint_threshold
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only, config=settings)
        except duckdb.Error as exc:
            raise StoreError(_open_failure(self.path, exc)) from exc
        self._series: dict[str, SeriesIndex] = {}
        #: Held while using ``con`` from a thread other than the owner's (ingest commits, lake export).
        self.lock = threading.RLock()
        if read_only:
            self._check_tables()
        else:
            self.migrate()
            for schema in iter_schemas():
                if schema.series_columns:
                    known = self.con.execute(
                        f"SELECT series_id FROM {schema.table}_series"
                    ).fetchnumpy()["series_id"]
                    self._series[schema.table] = SeriesIndex(schema, known)

    def _check_tables(self) -> None:
        """Refuse a file that is not an llmslo store (a reader cannot create the tables)."""
        with self.lock:
            rows = self.con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_name = ?",
                ["ingest_offsets"],
            ).fetchall()
        if not rows:
            self.con.close()
            raise StoreError(f"{self.path} is a DuckDB file without llmslo's tables")

    def migrate(self) -> None:
        """Create every table that does not exist yet (idempotent)."""
        statements: list[str] = []
        for schema in iter_schemas():
            if schema.series_columns:
                statements += _normalised_ddl(schema)
            else:
                statements += _table_ddl(schema.table, _schema_columns(schema))
                statements.append(f"COMMENT ON TABLE {schema.table} IS {_quote(schema.doc)}")
        statements += _table_ddl("deadletter", DEADLETTER_COLUMNS)
        statements += _table_ddl("ingest_offsets", OFFSET_COLUMNS, key="group_id, topic, partition")
        with self.transaction("create tables"):
            for statement in statements:
                self.con.execute(statement)

    @contextmanager
    def transaction(self, what: str) -> Iterator[duckdb.DuckDBPyConnection]:
        """One DuckDB transaction: committed when the block ends, rolled back on any error.

        Any failure (DuckDB's, Arrow's, a bug) leaves no transaction open and surfaces as
        :class:`StoreError` naming ``what`` failed, with the original error chained.
        """
        with self.lock:
            self.con.execute("BEGIN")
            try:
                yield self.con
                self.con.execute("COMMIT")
            except BaseException as exc:
                with suppress(duckdb.Error):  # a failed COMMIT has already rolled back
                    self.con.execute("ROLLBACK")
                if isinstance(exc, Exception):
                    raise StoreError(f"cannot {what} in {self.path}: {exc}") from exc
                raise

    def checkpoint(self) -> None:
        """Write the committed changes into the file and empty its write-ahead log (what a
        commit does by itself past ``checkpoint_threshold``). Raises :class:`StoreError`."""
        with self.lock:
            try:
                self.con.execute("CHECKPOINT")
            except duckdb.Error as exc:
                raise StoreError(f"cannot checkpoint {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the file (after every thread using ``con`` has stopped)."""
        with self.lock:
            self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def read_offsets(self, group_id: str) -> dict[tuple[str, int], StoredOffset]:
        """The stored next offset of every (topic, partition) of ``group_id``, with its log."""
        with self.lock:
            rows = self.con.execute(_READ_OFFSETS, [group_id]).fetchall()
        return _stored_offsets(rows)

    def commit_batch(
        self,
        rows: Mapping[str, Sequence[pa.Table]],
        *,
        group_id: str,
        offsets: Mapping[tuple[str, int], StoredOffset],
        deadletters: Sequence[DeadLetter] = (),
        now_ts_ms: int,
        in_same_transaction: Callable[[duckdb.DuckDBPyConnection], None] | None = None,
    ) -> None:
        """Append ``rows`` (table name → Arrow tables of its schema), dead letters and offsets atomically.

        ``in_same_transaction(con)`` runs inside the same transaction, for a writer whose own
        bookkeeping must commit or roll back with the rows (the Iceberg mirror's file list).
        """
        new_series: dict[str, pa.Table] = {}
        with self.transaction("commit a batch") as con:
            for table_name, all_parts in rows.items():
                parts = [part for part in all_parts if part.num_rows]
                if not parts:
                    continue
                index = self._series.get(table_name)
                if index is None:
                    self._append(table_name, pa.concat_tables(parts))
                    continue
                # One split over the whole batch: per-message numpy calls cost more than the work.
                batch = join_tables(parts)
                split = index.split(batch, [part.num_rows for part in parts])
                series = split.new_series
                self._append(f"{table_name}_series", series)
                self._append(f"{table_name}_values", split.values)
                new_series[table_name] = series
            if deadletters:
                placeholders = ", ".join("?" * len(DEADLETTER_COLUMNS))
                con.executemany(
                    f"INSERT INTO deadletter VALUES ({placeholders})",
                    [d.as_row() for d in deadletters],
                )
            if offsets:
                con.executemany(
                    "INSERT OR REPLACE INTO ingest_offsets (group_id, topic, partition, "
                    "next_offset, updated_ts_ms, cluster_id, topic_id) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            group_id,
                            topic,
                            partition,
                            stored.next_offset,
                            now_ts_ms,
                            *stored.log.fields,
                        )
                        for (topic, partition), stored in offsets.items()
                    ],
                )
            if in_same_transaction is not None:
                in_same_transaction(con)
        for table_name, series in new_series.items():
            self._series[table_name].mark_stored(series.column("series_id").combine_chunks())

    def _append(self, table_name: str, table: pa.Table) -> None:
        if table.num_rows:
            insert_arrow(self.con, table_name, table)

    def prune(self, before_ts_ms: int) -> dict[str, int]:
        """Delete raw rows older than ``before_ts_ms``; returns rows deleted per table.

        A series left without samples goes too (``<table>_series``), so instances that come
        and go (pods rescheduled, renamed) do not grow the series tables forever; one that
        comes back is stored again. Raises :class:`StoreError`.
        """
        deleted: dict[str, int] = {}
        orphans: dict[str, np.ndarray] = {}
        with self.lock:  # no commit between the delete and the index forgetting it
            with self.transaction("prune raw rows") as con:
                for table_name, column in RAW_TIME_COLUMNS.items():
                    ((rows,),) = con.execute(
                        f"DELETE FROM {table_name} WHERE {column} < ?", [before_ts_ms]
                    ).fetchall()
                    deleted[table_name] = int(rows)
                for table_name in self._series:
                    ids = con.execute(
                        f"DELETE FROM {table_name}_series WHERE series_id NOT IN "
                        f"(SELECT series_id FROM {table_name}_values) RETURNING series_id"
                    ).fetchnumpy()["series_id"]
                    orphans[table_name] = np.asarray(ids, np.int64)
                    deleted[f"{table_name}_series"] = len(ids)
            for table_name, ids in orphans.items():
                self._series[table_name].forget(ids)
        return deleted

    def count(self, table_name: str) -> int:
        """Rows in ``table_name`` (one of our tables)."""
        known = {s.table for s in iter_schemas()} | {"deadletter", "ingest_offsets"}
        if table_name not in known:
            raise StoreError(f"unknown table {table_name!r}")
        with self.lock:
            # fetchall, not fetchone: DuckDB 2 keeps an unfinished result open otherwise.
            ((rows,),) = self.con.execute(f"SELECT count(*) FROM {table_name}").fetchall()
        return int(rows)


def insert_arrow(con: duckdb.DuckDBPyConnection, table_name: str, rows: pa.Table) -> None:
    """Insert ``rows`` into the DuckDB table ``table_name`` matching columns by name.

    By name, not position: a file upgraded across releases may hold appended columns in
    another order than a fresh one, and a column the rows lack is left NULL (or its default).
    ``rows`` is registered under a name of its own for the statement and unregistered after,
    so writers sharing a connection never see each other's rows. Raises ``duckdb.Error``.
    """
    view = f"_llmslo_rows_{uuid.uuid4().hex}"
    con.register(view, rows)
    try:
        con.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM {view}")
    finally:
        con.unregister(view)


_READ_OFFSETS = (
    "SELECT topic, partition, next_offset, cluster_id, topic_id FROM ingest_offsets "
    "WHERE group_id = ?"
)


def _stored_offsets(rows: Iterable[tuple[Any, ...]]) -> dict[tuple[str, int], StoredOffset]:
    return {
        (topic, partition): StoredOffset(offset, LogIdentity(cluster_id, topic_id))
        for topic, partition, offset, cluster_id, topic_id in rows
    }


def read_peer_offsets(
    patterns: Iterable[str], group_id: str, *, own_path: Path
) -> dict[tuple[str, int], list[StoredOffset]]:
    """The next offset of each partition stored in each of the other members' files.

    ``patterns`` are paths or glob patterns; ``own_path`` is skipped. A file that cannot be
    opened is skipped with a log line: its member is alive and holds it (DuckDB allows one
    process per file), and a live member hands its partitions over by committing its
    offsets to Kafka first. A dead member's file opens, and its offsets are what the crash
    between its DuckDB and Kafka commits left unsaid in Kafka. Never raises.
    """
    own = own_path.resolve()
    paths = sorted({Path(p).resolve() for pattern in patterns for p in glob.glob(pattern)})
    found: dict[tuple[str, int], list[StoredOffset]] = {}
    for path in paths:
        if path == own or not path.is_file():
            continue
        try:
            with duckdb.connect(str(path), read_only=True) as con:
                rows = con.execute(_peer_offsets_query(con), [group_id]).fetchall()
        except duckdb.Error as exc:
            log.info("peer store %s not read (its ingester holds it?): %s", path, exc)
            continue
        for key, stored in _stored_offsets(rows).items():
            found.setdefault(key, []).append(stored)
    return found


def _peer_offsets_query(con: duckdb.DuckDBPyConnection) -> str:
    """:data:`_READ_OFFSETS`, or NULL identities for a file from before they were stored
    (a read-only connection cannot add the columns)."""
    columns = {
        name
        for (name,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'ingest_offsets'"
        ).fetchall()
    }
    if {"cluster_id", "topic_id"} <= columns:
        return _READ_OFFSETS
    return _READ_OFFSETS.replace("cluster_id, topic_id", "NULL, NULL")


#: DuckDB's lock error names the holder: "Conflicting lock is held in /usr/bin/python (PID 42)".
_LOCK_HOLDER = re.compile(r"Conflicting lock is held in .*?\(PID (\d+)\)")


def _open_failure(path: Path, exc: duckdb.Error) -> str:
    """Why ``path`` did not open, in words: for a lock, which process holds it and what to do."""
    holder = _LOCK_HOLDER.search(str(exc))
    if holder is None:
        return f"cannot open DuckDB file {path}: {exc}"
    pid = int(holder.group(1))
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        command = ""
    who = f"process {pid}" + (f" ({command[:400]})" if command else "")
    return (
        f"{path} is open in {who}. DuckDB lets one process write a file and no other process "
        "open it meanwhile (a reader blocks a writer too). Stop that process, or read through "
        "the API of the process that writes (`llmslo dashboard --api URL`), or work on a copy "
        "of the file taken while nothing writes it."
    )
