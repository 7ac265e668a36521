"""Fuzz the Kafka boundary: whatever arrives, ``decode_message`` raises only ``DecodeError``.

And whenever it returns, the rows commit cleanly into a fresh DuckDB store and read back:
a decoded message must never be a poison pill for the ingester's commit. The safety net
(``decode_crash``) must not be what catches these: each input class is refused at its cause.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeline.codec import (
    ARROW_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    DecodedMessage,
    decode_message,
    encode_arrow,
)
from pipeline.errors import DecodeError
from pipeline.schema import RecordSchema, iter_schemas
from pipeline.store import Store, StoredOffset
from tests.pipeline.strategies import rows_strategy

SCHEMAS = list(iter_schemas())
CONTENT_TYPES = [
    ARROW_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    None,  # no header: Arrow
    "Application/JSON; charset=utf-8",
    "text/csv",
]
#: Every reason a malformed message may be refused with (``decode_crash`` is a bug).
EXPECTED_REASONS = {
    "empty",
    "oversized",
    "oversized_decoded",
    "not_arrow",
    "truncated_arrow",
    "corrupt_arrow",
    "not_json",
    "schema_mismatch",
    "missing_required",
    "invalid_value",  # a tweaked table can hold values its columns' rules refuse (ts_ms < 0)
    "unknown_schema",
    "unknown_content_type",
}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _headers(schema: RecordSchema, content_type: str | None) -> list[tuple[str, bytes]]:
    headers = [("llmslo-schema", schema.header_value)]
    if content_type is not None:
        headers.append(("content-type", content_type.encode()))
    return headers


def _check(payload: bytes, headers: list[tuple[str, bytes]], directory: Path) -> str:
    """Decode; a refusal must be a known reason, a success must commit and read back."""
    try:
        decoded = decode_message(payload, headers, max_bytes=1 << 20)
    except DecodeError as exc:
        assert exc.reason in EXPECTED_REASONS, f"{exc.reason}: {exc}"
        event(exc.reason)
        return exc.reason
    _commit_and_read_back(decoded, directory)
    event("decoded and committed")
    return "decoded"


def _commit_and_read_back(decoded: DecodedMessage, directory: Path) -> None:
    table = decoded.schema.table
    with Store(directory / "fuzz.duckdb") as store:
        store.commit_batch(
            {table: [decoded.table]},
            group_id="fuzz",
            offsets={("t", 0): StoredOffset(1)},
            now_ts_ms=0,
        )
        stored = store.con.execute(f"SELECT * FROM {table}").fetchall()
        assert len(stored) == decoded.table.num_rows
        assert store.read_offsets("fuzz") == {("t", 0): StoredOffset(1)}


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@FUZZ
@given(
    payload=st.binary(max_size=600),
    schema=st.sampled_from(SCHEMAS),
    content_type=st.sampled_from(CONTENT_TYPES),
)
def test_arbitrary_bytes(
    tmp_path_factory: pytest.TempPathFactory,
    payload: bytes,
    schema: RecordSchema,
    content_type: str | None,
) -> None:
    _check(payload, _headers(schema, content_type), tmp_path_factory.mktemp("bytes"))


_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and ±Infinity are sent as the tokens Python writes
    | st.text(max_size=8)
    # st.text() never draws surrogates: join characters to get lone ones too
    | st.lists(
        st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=4
    ).map("".join)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth if depth % 2 else b'{"a":' * depth + b"1" + b"}" * depth


@FUZZ
@given(
    value=_JSON_VALUES,
    depth=st.none() | st.integers(1, 200_000),
    schema=st.sampled_from(SCHEMAS),
)
def test_arbitrary_json_values(
    tmp_path_factory: pytest.TempPathFactory, value: Any, depth: int | None, schema: RecordSchema
) -> None:
    payload = json.dumps(value).encode() if depth is None else _nested(depth)
    _check(payload, _headers(schema, JSON_CONTENT_TYPE), tmp_path_factory.mktemp("json"))


@FUZZ
@given(data=st.data(), schema=st.sampled_from(SCHEMAS))
def test_valid_json_rows_with_hostile_field_values(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, schema: RecordSchema
) -> None:
    rows = data.draw(rows_strategy(schema, json_safe=True, min_size=0))
    names = st.sampled_from(schema.arrow.names) | st.text(max_size=4)
    for row in rows:
        row.update(data.draw(st.dictionaries(names, _JSON_VALUES, max_size=2)))
    payload = json.dumps(rows).encode()
    _check(payload, _headers(schema, JSON_CONTENT_TYPE), tmp_path_factory.mktemp("rows"))


def _schema_message_bytes(schema: RecordSchema) -> int:
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, schema.arrow).close()
    return len(sink.getvalue()) - 8  # without the end-of-stream marker


def _valid_payload(data: st.DataObject, schema: RecordSchema) -> tuple[bytes, list[bytes]]:
    """A valid payload, and the UTF-8 strings it carries (where they can be found as is)."""
    rows = data.draw(rows_strategy(schema))
    table = pa.Table.from_pylist(rows, schema=schema.arrow)
    if data.draw(st.booleans()):
        return encode_arrow(schema, table), []
    strings = [v.encode() for row in rows for v in row.values() if isinstance(v, str) and v]
    return _ipc(table), strings


@FUZZ
@given(data=st.data(), schema=st.sampled_from(SCHEMAS))
def test_mutated_arrow_payloads(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, schema: RecordSchema
) -> None:
    valid, strings = _valid_payload(data, schema)
    payload = bytearray(valid)
    mutation = data.draw(st.sampled_from(["flip", "truncate", "splice", "bad_utf8"]))
    event(f"mutation: {mutation if strings or mutation != 'bad_utf8' else 'none'}")
    if mutation == "bad_utf8" and strings:
        # 0xFF is never valid UTF-8: put it inside one of the string values.
        value = data.draw(st.sampled_from(strings))
        at = payload.find(value, _schema_message_bytes(schema))  # not in the schema's docs
        payload[at + data.draw(st.integers(0, len(value) - 1))] = 0xFF
    elif mutation == "flip":
        # Half the time only in the dictionaries and record batches, past the schema message.
        first = data.draw(st.sampled_from([0, _schema_message_bytes(schema)]))
        bits = st.integers(min(first, len(payload) - 1) * 8, len(payload) * 8 - 1)
        for position in data.draw(st.lists(bits, min_size=1, max_size=4)):
            payload[position // 8] ^= 1 << (position % 8)
    elif mutation == "truncate":
        del payload[data.draw(st.integers(0, len(payload) - 1)) :]
    else:
        at = data.draw(st.integers(0, len(payload)))
        payload[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    # Mostly as Arrow (where the bytes get far), sometimes under every other content type.
    content_type = data.draw(st.sampled_from([ARROW_CONTENT_TYPE] * 6 + CONTENT_TYPES))
    _check(bytes(payload), _headers(schema, content_type), tmp_path_factory.mktemp("flip"))


def _tweak(data: st.DataObject, table: pa.Table) -> pa.Table:
    """One schema change a confused producer might make."""
    index = data.draw(st.integers(0, table.num_columns - 1))
    name = table.column_names[index]
    column = table.column(index)
    plain = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    how = data.draw(
        st.sampled_from(
            [
                *("drop", "rename", "duplicate", "nulls", "cast", "struct", "extra", "dict8"),
                *("null_entry", "bad_index"),
            ]
        )
    )
    if how == "drop":
        return table.remove_column(index)
    if how == "rename":
        other = data.draw(st.sampled_from(table.column_names))
        return table.rename_columns(
            [other if i == index else n for i, n in enumerate(table.column_names)]
        )
    if how == "duplicate":
        return table.append_column(name, column)
    if how == "nulls":
        return table.set_column(
            index, table.field(index).with_nullable(True), pa.nulls(table.num_rows, column.type)
        )
    if how == "struct":
        struct = pa.StructArray.from_arrays([pa.array(range(table.num_rows))], ["a"])
        return table.set_column(index, name, struct)
    if how in ("null_entry", "bad_index"):
        # Every row points at a null dictionary entry, or past the end of the dictionary.
        index_value, dictionary = (0, [None]) if how == "null_entry" else (3, ["x"])
        indices = pa.array([index_value] * table.num_rows, pa.int32())
        bad = pa.DictionaryArray.from_arrays(indices, pa.array(dictionary, pa.string()), safe=False)
        return table.set_column(index, name, bad)
    if how == "extra":
        return table.append_column("prompt", pa.array(["secret"] * table.num_rows))
    if how == "dict8" and pa.types.is_string(plain):
        small = pa.dictionary(pa.int8(), pa.string())
        return table.set_column(index, name, column.cast(plain).dictionary_encode().cast(small))
    target = data.draw(
        st.sampled_from(
            [
                pa.string(),
                pa.large_string(),
                pa.float64(),
                pa.float32(),
                pa.int64(),
                pa.int8(),
                pa.bool_(),
                pa.list_(pa.float64()),
                pa.timestamp("ms"),
            ]
        )
    )
    try:
        return table.set_column(index, name, column.cast(target, safe=False))
    except (pa.ArrowException, ValueError):
        return table  # not castable by Arrow either: this tweak does not apply


@FUZZ
@given(data=st.data(), schema=st.sampled_from(SCHEMAS))
def test_arrow_payloads_with_a_tweaked_schema(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, schema: RecordSchema
) -> None:
    rows = data.draw(rows_strategy(schema))
    table = pa.Table.from_pylist(rows, schema=schema.arrow)
    for _ in range(data.draw(st.integers(1, 2))):
        table = _tweak(data, table)
    _check(_ipc(table), _headers(schema, ARROW_CONTENT_TYPE), tmp_path_factory.mktemp("tweak"))
