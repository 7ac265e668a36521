"""A batch's data files: written with pyarrow, described as pyiceberg ``DataFile``\\ s.

Why not ``Table.append``: it would cost the ingester more than the rest of its commit.
pyiceberg's append splits a batch by partition with an Arrow group-by and a filter and a copy
per partition, even when the batch is one hour (an ingester's batch of a few hundred
milliseconds nearly always is), and its Parquet writer must be handed the lake's string
columns, so every dictionary column is first decoded to strings and encoded to a Parquet
dictionary again. Here a batch keeps its dictionary columns (one dictionary per column for
the batch), the Parquet writer writes them as they are, and the partition split runs only
when the batch's first and last event times fall in different hours.

The files are the ones pyiceberg would write: the same Parquet types (strings, not
dictionaries: the file stores no Arrow schema, so readers see what Iceberg declares), field
ids, table write properties (``write.parquet.*``), data file layout
(:func:`~pyiceberg.table.locations.load_location_provider`) and column statistics
(:func:`~pyiceberg.io.pyarrow.data_file_statistics_from_parquet_metadata`), so readers, the
partition pruning and ``lake maintain`` see no difference. They are committed by
:class:`~pipeline.iceberg.lake.IcebergLake` with pyiceberg's fast append, as
``Table.append`` commits its own, and a retried commit appends the same files again
instead of writing them anew.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["write_data_files"]

#: Parquet's key for an Iceberg field id in an Arrow field's metadata.
_FIELD_ID = b"PARQUET:field_id"


def _with_id(field: pa.Field, iceberg: Any) -> pa.Field:
    """``field`` (its Arrow type kept) with the field id and optionality of the Iceberg
    ``NestedField`` ``iceberg``, and so the fields nested in it (a list's element, a map's
    key and value, a struct's fields by name)."""
    from pyiceberg.types import ListType, MapType, StructType

    kind, arrow = iceberg.field_type, field.type
    if isinstance(kind, ListType) and pa.types.is_list(arrow):
        arrow = pa.list_(_with_id(arrow.value_field, kind.element_field))
    elif isinstance(kind, MapType) and pa.types.is_map(arrow):
        arrow = pa.map_(
            _with_id(arrow.key_field, kind.key_field), _with_id(arrow.item_field, kind.value_field)
        )
    elif isinstance(kind, StructType) and pa.types.is_struct(arrow):
        arrow = pa.struct(_with_id(child, kind.field_by_name(child.name)) for child in arrow)
    metadata = {_FIELD_ID: str(iceberg.field_id).encode()}
    return pa.field(field.name, arrow, iceberg.optional, metadata)


def _file_schema(table: Any, data: pa.Schema) -> pa.Schema:
    """``data``'s Arrow types with the Iceberg field ids and optionality of ``table``'s
    columns of the same names. Raises ``ValueError`` for a column the table lacks."""
    schema = table.schema()
    fields = []
    for field in data:
        try:
            iceberg = schema.find_field(field.name)
        except ValueError as exc:
            raise ValueError(f"{table.name()} has no column {field.name!r}") from exc
        fields.append(_with_id(field, iceberg))
    return pa.schema(fields)


def _partitions(table: Any, data: pa.Table) -> list[tuple[Any, pa.Table]]:
    """``data`` split by ``table``'s partition spec: (``PartitionKey``, rows) pairs.

    A one-field spec over a column without nulls (the lake's: the hour of the event time) is
    split only when the transform of the column's least and greatest values differ; any
    other spec is split by pyiceberg's own ``_determine_partitions``.
    """
    from pyiceberg.io.pyarrow import _determine_partitions
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

    spec, schema = table.spec(), table.schema()
    field = spec.fields[0] if len(spec.fields) == 1 else None
    column = data.column(schema.find_column_name(field.source_id)) if field else None
    if field is None or column is None or column.null_count or data.num_rows == 0:
        return [
            (part.partition_key, part.arrow_table_partition)
            for part in _determine_partitions(spec, schema, data)
        ]
    source_type = schema.find_field(field.source_id).field_type
    transform = field.transform.transform(source_type)
    least, greatest = pc.min_max(column).values()
    if transform(least.as_py()) == transform(greatest.as_py()):
        values = [transform(least.as_py())]
        parts = [data]
    else:
        keys = field.transform.pyarrow_transform(source_type)(column)
        values = sorted(pc.unique(keys).to_pylist())
        parts = [data.filter(pc.equal(keys, value)) for value in values]
    return [
        (PartitionKey([PartitionFieldValue(field, value)], spec, schema), part)
        for value, part in zip(values, parts, strict=True)
    ]


def _write_one(table: Any, key: Any, rows: pa.Table, path: str) -> Any:
    """``rows`` as the Parquet file ``path``, described as a ``DataFile`` of partition ``key``."""
    from pyiceberg.io.pyarrow import (
        _get_parquet_writer_kwargs,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_int

    properties, schema = table.properties, table.schema()
    row_group_rows = property_as_int(
        properties,
        TableProperties.PARQUET_ROW_GROUP_LIMIT,
        TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT,
    )
    with table.io.new_output(path).create(overwrite=True) as stream:
        with pq.ParquetWriter(
            stream,
            schema=_file_schema(table, rows.schema),
            store_schema=False,  # the Arrow schema would tell readers "dictionary"
            store_decimal_as_integer=True,
            **_get_parquet_writer_kwargs(properties),
        ) as writer:
            writer.write_table(rows, row_group_size=row_group_rows)
        size = stream.tell()  # what a HEAD request would say, without one
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=writer.writer.metadata,
        stats_columns=compute_statistics_plan(schema, properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=key.partition,
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def write_data_files(table: Any, data: pa.Table) -> list[Any]:
    """``data`` (the lake's column types; dictionary columns allowed) as new data files of
    the pyiceberg ``table``, one per partition (more past ``write.target-file-size-bytes``),
    in no snapshot yet: the ``DataFile``\\ s to commit. Raises what pyarrow and the
    object store raise."""
    from pyiceberg.io.pyarrow import bin_pack_arrow_table
    from pyiceberg.table import TableProperties
    from pyiceberg.table.locations import load_location_provider
    from pyiceberg.utils.properties import property_as_int

    target_bytes = property_as_int(
        table.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    locations = load_location_provider(table.location(), table.properties)
    write_uuid = uuid.uuid4()
    files: list[Any] = []
    for key, rows in _partitions(table, data):
        for batches in bin_pack_arrow_table(rows, target_bytes or 1):
            name = f"00000-{len(files)}-{write_uuid}.parquet"
            path = locations.new_data_location(data_file_name=name, partition_key=key)
            files.append(_write_one(table, key, pa.Table.from_batches(batches), path))
    return files
