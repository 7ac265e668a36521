"""Encode and decode record batches for the Kafka bus.

Our producers send Arrow IPC streams (fast, typed), except the stream tap and the SLO jobs'
``flags`` topic (which every tap reads), which are JSON arrays
(:class:`pipeline.publisher.JsonRows`) so that a sidecar never loads pyarrow;
third-party producers may send JSON too (one object or an array of objects). Both decode to
the same table. Either way two headers travel with the message:

* ``llmslo-schema``: the schema name and version, e.g. ``engine_sample.v1``;
* ``content-type``: ``application/vnd.apache.arrow.stream`` or ``application/json``.

Header names match case-insensitively, header values may be ``bytes`` or ``str``, and the
content type is matched case-insensitively ignoring parameters
(``Application/JSON; charset=utf-8`` is JSON). A missing content type means Arrow.

Decoding is a boundary: anything malformed raises :class:`DecodeError` with a stable
``reason`` (``empty``, ``oversized``, ``oversized_decoded``, ``not_arrow``, ``truncated_arrow``, ``corrupt_arrow``,
``not_json``, ``schema_mismatch``, ``missing_required``, ``invalid_value``,
``unknown_schema``, ``unknown_content_type``), which the ingester turns into a dead letter. Nothing here raises
anything else: an unexpected exception is a bug, reported as ``decode_crash`` rather than
raised into the stream (STYLE §6).

What :func:`decode_message` returns is safe to commit: Arrow payloads are fully validated
(UTF-8, dictionary indices, offsets), required columns hold no nulls (not even through a
null dictionary entry), and every value fits its column exactly (JSON ``1.5`` is not an
``int16``, ``1e300`` is not a ``float32``, ``NaN``/``Infinity`` are not JSON), and every
value satisfies its column's :class:`~pipeline.schema.ValueRule` (an ``outcome`` of
``"pwned"`` or a ``ttft_s`` of ``-5`` is ``invalid_value``).

A message is one unit: if any row breaks a rule the whole message is refused (and the
ingester dead-letters it, payload included, so it can be fixed and replayed). Splitting a
message would store a part of what a producer sent as if it were the whole, and its
offset could no longer say "done" for every row of it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline._ipc_size import check_decoded_size
from pipeline._lazy import on_first_use
from pipeline._value_check import check_values
from pipeline.errors import DecodeError
from pipeline.schema import RecordSchema, lookup_schema

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = on_first_use("pyarrow")
    pc = on_first_use("pyarrow.compute")

__all__ = [
    "ARROW_CONTENT_TYPE",
    "DEFAULT_MAX_DECODED_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "JSON_CONTENT_TYPE",
    "DecodedMessage",
    "HeaderValue",
    "conform",
    "decode_message",
    "encode_arrow",
    "encode_json",
    "encode_json_object",
    "headers_for",
    "join_json_objects",
    "join_tables",
    "message_kind",
]

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSON_CONTENT_TYPE = "application/json"
SCHEMA_HEADER = "llmslo-schema"
CONTENT_TYPE_HEADER = "content-type"
#: Larger messages are dead-lettered as ``oversized`` before any parsing.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Arrow messages whose buffers decompress to more are dead-lettered as ``oversized_decoded``
#: before anything is decompressed (LZ4 turns 16 MiB of zeros' runs into gigabytes).
DEFAULT_MAX_DECODED_BYTES = 64 * 1024 * 1024


# Messages are small (one scrape or one batch of records): Arrow's thread pool costs more
# than it saves here (LZ4 decode of a 2,000-row batch: ~2 ms threaded vs ~0.3 ms not).
# (Functions, not constants: nothing of Arrow is built at import, see ``pipeline._lazy``.)
@functools.cache
def _ipc_write() -> pa.ipc.IpcWriteOptions:
    return pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)


@functools.cache
def _ipc_read() -> pa.ipc.IpcReadOptions:
    return pa.ipc.IpcReadOptions(use_threads=False)


#: A Kafka header value as kafka-python gives it (bytes), or as a caller may pass it (str).
HeaderValue = bytes | str | None


@dataclass(frozen=True)
class DecodedMessage:
    """A decoded message: its schema and its rows, conformed to the schema's Arrow types."""

    schema: RecordSchema
    table: pa.Table


def headers_for(
    schema: RecordSchema, content_type: str = ARROW_CONTENT_TYPE
) -> list[tuple[str, bytes]]:
    """Kafka headers naming the schema and the payload encoding."""
    return [(SCHEMA_HEADER, schema.header_value), (CONTENT_TYPE_HEADER, content_type.encode())]


def _mismatch(schema: RecordSchema, message: str) -> DecodeError:
    return DecodeError("schema_mismatch", f"{schema.name}.v{schema.version}: {message[:300]}")


def _float32_overflow(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether casting ``source`` to ``target`` can turn a finite float into an infinity."""
    if pa.types.is_list(source) and pa.types.is_list(target):
        return _float32_overflow(source.value_type, target.value_type)
    return pa.types.is_float32(target) and pa.types.is_float64(source)


def _infinities(column: pa.ChunkedArray | pa.Array) -> int:
    while pa.types.is_list(column.type):
        column = pc.list_flatten(column)
    return int(pc.sum(pc.is_inf(column)).as_py() or 0)


def _cast_exact(
    schema: RecordSchema, field: pa.Field, column: pa.ChunkedArray | pa.Array
) -> pa.ChunkedArray | pa.Array:
    """``column`` cast to ``field``'s type, refusing any value that does not fit exactly.

    Integers must not overflow or lose a fraction (``1.5`` is not an ``int16``); a finite
    float must stay finite (``1e300`` is not a ``float32``). Rounding a float is fine.
    """
    try:
        cast = column.cast(field.type, safe=True)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise _mismatch(
            schema, f"column {field.name!r} is {column.type}, expected {field.type}: {exc}"
        ) from exc
    if _float32_overflow(column.type, field.type) and _infinities(cast) != _infinities(column):
        raise _mismatch(schema, f"column {field.name!r} has values that overflow {field.type}")
    return cast


def conform(schema: RecordSchema, table: pa.Table) -> pa.Table:
    """Return ``table`` with exactly the schema's columns, order and types.

    Plain strings are cast to the dictionary columns and numbers are converted when the
    values fit exactly; missing nullable columns are filled with nulls. Raises
    :class:`DecodeError` (``schema_mismatch`` or ``missing_required``).
    """
    if table.schema.equals(schema.arrow, check_metadata=False):
        return table
    names = table.column_names
    if len(set(names)) != len(names):
        duplicated = sorted({name for name in names if names.count(name) > 1})
        raise _mismatch(schema, f"duplicate columns {duplicated[:5]}")
    extra = sorted(set(names) - set(schema.arrow.names))
    if extra:
        raise _mismatch(schema, f"unknown columns {extra[:5]}")
    columns = []
    for field in schema.arrow:
        if field.name in names:
            column = table.column(field.name)
            columns.append(
                column if column.type == field.type else _cast_exact(schema, field, column)
            )
        elif field.nullable:
            columns.append(pa.nulls(table.num_rows, field.type))
        else:
            raise DecodeError(
                "missing_required",
                f"{schema.name}.v{schema.version}: required column {field.name!r} is missing",
            )
    return pa.Table.from_arrays(columns, schema=schema.arrow)


def _has_nulls(column: pa.ChunkedArray) -> bool:
    """Nulls in the validity bitmap, or indices pointing at a null dictionary entry."""
    if column.null_count:
        return True
    if not pa.types.is_dictionary(column.type):
        return False
    # Rare: only a dictionary that holds a null needs the per-row look.
    return any(
        chunk.dictionary.null_count and pc.any(pc.is_null(chunk)).as_py() for chunk in column.chunks
    )


def _check_required(schema: RecordSchema, table: pa.Table) -> None:
    for field in schema.arrow:
        if not field.nullable and _has_nulls(table.column(field.name)):
            raise DecodeError(
                "missing_required",
                f"{schema.name}.v{schema.version}: required column {field.name!r} has nulls",
            )


def encode_arrow(schema: RecordSchema, table: pa.Table | pa.RecordBatch) -> bytes:
    """Serialise rows as one LZ4-compressed Arrow IPC stream conforming to ``schema``."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    table = conform(schema, table)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema.arrow, options=_ipc_write()) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def join_tables(tables: Sequence[pa.Table]) -> pa.Table:
    """``tables`` (of one Arrow schema) as one table, one chunk per column.

    Arrow's concatenation unifies the dictionaries of a dictionary column itself, and leaves
    equal ones as they are: the parts of one target (taken from one template table) are not
    hashed again, as ``unify_dictionaries`` first would (half the cost of a join)."""
    return pa.concat_tables(tables).combine_chunks()


def encode_json(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Serialise rows the way a third-party producer would: a JSON array of objects."""
    return join_json_objects([encode_json_object(row) for row in rows])


def encode_json_object(row: Mapping[str, Any]) -> bytes:
    """One row as a compact JSON object; ``ValueError`` for NaN/inf, ``TypeError`` for a value
    JSON cannot hold."""
    return json.dumps(row, separators=(",", ":"), allow_nan=False).encode()


def join_json_objects(objects: Sequence[bytes]) -> bytes:
    """Encoded objects as one JSON array (what :func:`encode_json` gives for their rows)."""
    return b"[" + b",".join(objects) + b"]"


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _header(headers: Iterable[tuple[str | bytes, HeaderValue]] | None, name: str) -> str | None:
    """The first header called ``name`` (any case), as text; ``None`` if absent or empty."""
    for key, value in headers or ():
        if _text(key).lower() == name:
            return None if value is None else (_text(value) or None)
    return None


def message_kind(
    headers: Iterable[tuple[str | bytes, HeaderValue]] | None,
) -> tuple[RecordSchema, str]:
    """A message's schema and media type (:data:`ARROW_CONTENT_TYPE` or
    :data:`JSON_CONTENT_TYPE`) from its headers, without reading the payload (or loading
    Arrow). Raises :class:`DecodeError` (``unknown_schema``, ``unknown_content_type``)."""
    schema = lookup_schema(_header(headers, SCHEMA_HEADER))
    content_type = _header(headers, CONTENT_TYPE_HEADER)
    media_type = (
        ARROW_CONTENT_TYPE if content_type is None else content_type.split(";")[0].strip().lower()
    )
    if media_type not in (ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE):
        raise DecodeError(
            "unknown_content_type", f"unknown content-type {(content_type or '')[:80]!r}"
        )
    return schema, media_type


def _decode_arrow(value: bytes, max_decoded_bytes: int) -> pa.Table:
    check_decoded_size(value, max_decoded_bytes)  # before Arrow allocates a single buffer
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(value), options=_ipc_read())
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError("not_arrow", f"not an Arrow IPC stream: {exc}") from exc
    try:
        table = reader.read_all()
    except (pa.ArrowException, OSError) as exc:
        raise DecodeError(
            "truncated_arrow", f"Arrow IPC stream is truncated or corrupt: {exc}"
        ) from exc
    try:
        # Structure only is checked by the reader; bad UTF-8 or an out-of-range dictionary
        # index would otherwise surface at commit (or be stored as a wrong value).
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise DecodeError("corrupt_arrow", f"Arrow data is invalid: {str(exc)[:300]}") from exc
    return table


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _json_compatible(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a JSON value inferred as ``source`` may fill a column of type ``target``."""
    if pa.types.is_null(source):
        return True
    if pa.types.is_dictionary(target):
        target = target.value_type
    if pa.types.is_list(target):
        return pa.types.is_list(source) and _json_compatible(source.value_type, target.value_type)
    if pa.types.is_integer(target) or pa.types.is_floating(target):
        return pa.types.is_integer(source) or pa.types.is_floating(source)
    if pa.types.is_string(target):
        return pa.types.is_string(source)
    if pa.types.is_boolean(target):
        return pa.types.is_boolean(source)
    return False


def _json_table(schema: RecordSchema, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows as a table of the schema, each column inferred from its values, then cast exactly.

    (``from_pylist`` with the target types would silently truncate ``1.5`` to ``1`` and
    overflow ``1e300`` to ``inf``; inferring the whole array at once stays in C++.)
    """
    if not rows:
        return schema.arrow.empty_table()
    try:
        inferred = pa.array(rows)  # a struct array: the union of every row's keys
    except UnicodeEncodeError as exc:
        # json.loads turns the escape \ud800 into a lone surrogate, which is not Unicode text.
        raise DecodeError(
            "not_json", f"a JSON string holds a lone UTF-16 surrogate: {exc}"
        ) from exc
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        raise _mismatch(schema, str(exc)) from exc
    names = [inferred.type.field(i).name for i in range(inferred.type.num_fields)]
    unknown = sorted(set(names) - set(schema.arrow.names))
    if unknown:
        raise _mismatch(schema, f"unknown fields {unknown[:5]}")
    given = dict(zip(names, inferred.flatten(), strict=True))
    columns = []
    for field in schema.arrow:
        column = given.get(field.name)
        if column is None:
            columns.append(pa.nulls(len(rows), field.type))
        elif _json_compatible(column.type, field.type):
            columns.append(_cast_exact(schema, field, column))
        else:
            raise _mismatch(schema, f"field {field.name!r} is {column.type}, expected {field.type}")
    return pa.Table.from_arrays(columns, schema=schema.arrow)


def _decode_json(schema: RecordSchema, value: bytes) -> pa.Table:
    try:
        parsed = json.loads(value, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise DecodeError("not_json", "JSON payload is nested too deeply") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError("not_json", f"payload is not valid JSON: {exc}") from exc
    rows = [parsed] if isinstance(parsed, dict) else parsed
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise DecodeError("not_json", "JSON payload must be an object or an array of objects")
    return _json_table(schema, rows)


def _decode(
    value: bytes | None,
    headers: Iterable[tuple[str | bytes, HeaderValue]] | None,
    max_bytes: int,
    max_decoded_bytes: int,
) -> DecodedMessage:
    if value is None:
        raise DecodeError("empty", "message has no value (tombstone)")
    if len(value) > max_bytes:
        raise DecodeError("oversized", f"message of {len(value)} bytes exceeds {max_bytes}")
    schema, media_type = message_kind(headers)
    if media_type == ARROW_CONTENT_TYPE:
        table = _decode_arrow(value, max_decoded_bytes)
    else:
        table = _decode_json(schema, value)
    table = conform(schema, table)
    _check_required(schema, table)
    check_values(schema, table)
    return DecodedMessage(schema, table)


def decode_message(
    value: bytes | None,
    headers: Iterable[tuple[str | bytes, HeaderValue]] | None,
    *,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> DecodedMessage:
    """Decode one Kafka message into rows of a known schema.

    Raises :class:`DecodeError` with a stable ``reason`` for anything malformed, and
    nothing else: an unexpected exception (a bug here or in a library) is reported as
    ``decode_crash`` so that one poison message cannot stop the ingester.
    """
    try:
        return _decode(value, headers, max_bytes, max_decoded_bytes)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(
            "decode_crash", f"unexpected {type(exc).__name__} while decoding: {str(exc)[:200]}"
        ) from exc
