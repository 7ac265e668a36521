"""llmslo's record schemas as Iceberg tables: types Iceberg has, partitioned by hour.

Iceberg has no dictionary encoding and no 8- or 16-bit integers: dictionary columns become
strings (Parquet dictionary-encodes them again on disk) and small integers ``int``. What an
ingester appends keeps its dictionaries (:func:`to_lake_batch`): the data file writer
(:mod:`pipeline.iceberg.files`) writes them as Parquet strings without decoding them. Column
docs travel as Iceberg field docs, so Trino's or Spark's ``DESCRIBE`` shows them.

Partitioning is ``truncate(3600000)`` of the event-time column (epoch ms): one partition
per hour, and readers prune by time on the column itself (no derived timestamp column to
keep in step). Not by pool: a batch of a few hundred milliseconds would then write a file
per pool, and a small-file problem is what partitioning must not buy.

Only tables fed by one topic each are in the lake, so a commit's Kafka offsets (its
topic's partitions) describe exactly the rows of that one table.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.schema import iter_schemas
from pipeline.units import HOUR_MS

__all__ = [
    "ICEBERG_TABLES",
    "PARTITION_WIDTH_MS",
    "lake_arrow_schema",
    "lake_topics",
    "to_lake",
    "to_lake_batch",
]

#: Tables in the Iceberg lake and their event-time (partition) column.
ICEBERG_TABLES = {
    "engine_samples": "ts_ms",
    "gpu_samples": "ts_ms",
    "requests": "received_ts_ms",
    "target_health": "ts_ms",
}
PARTITION_WIDTH_MS = HOUR_MS


def _lake_type(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(arrow_type):
        return _lake_type(arrow_type.value_type)
    if pa.types.is_integer(arrow_type) and arrow_type.bit_width < 32:
        return pa.int32()
    if pa.types.is_list(arrow_type):
        return pa.list_(_lake_type(arrow_type.value_type))
    return arrow_type


def lake_arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of ``table`` in the lake (Iceberg's types, the schema's docs)."""
    schema = next(s for s in iter_schemas() if s.table == table)
    return pa.schema(
        pa.field(f.name, _lake_type(f.type), nullable=f.nullable, metadata=f.metadata)
        for f in schema.arrow
    )


def to_lake(table: str, parts: list[pa.Table]) -> pa.Table:
    """Decoded parts of ``table`` (its schema's Arrow types) as one table of the lake's."""
    target = lake_arrow_schema(table)
    return pa.concat_tables([part.cast(target) for part in parts if part.num_rows])


def to_lake_batch(table: str, parts: list[pa.Table]) -> pa.Table:
    """Decoded parts of ``table`` as one table for :func:`~pipeline.iceberg.files.write_data_files`:
    the lake's types, except that dictionary columns stay dictionaries, one per column for
    the whole batch (Parquet's writer goes over to plain encoding when a column's
    dictionary changes from one chunk to the next), in one chunk. Decoding them to
    strings here, as :func:`to_lake` does, cost more than the Parquet encoding of the
    rest."""
    kept = [part for part in parts if part.num_rows]
    if not kept:
        return lake_arrow_schema(table).empty_table()
    # one chunk; Arrow's concatenation unifies differing dictionaries (codec.join_tables)
    data = pa.concat_tables(kept, promote_options="permissive").combine_chunks()
    target = pa.schema(
        f if pa.types.is_dictionary(f.type) else f.with_type(_lake_type(f.type))
        for f in data.schema
    )
    return data.cast(target)


def lake_topics(prefix: str) -> dict[str, str]:
    """Each lake table's topic (with the bus's ``prefix``) → the table."""
    return {prefix + s.topic: s.table for s in iter_schemas() if s.table in ICEBERG_TABLES}
