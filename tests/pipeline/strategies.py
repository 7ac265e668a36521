"""Hypothesis strategies that build valid rows of any record schema from its Arrow types."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from pipeline.schema import RecordSchema

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


def value_strategy(type_: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_dictionary(type_):
        return value_strategy(type_.value_type)
    if pa.types.is_list(type_):
        return st.lists(value_strategy(type_.value_type), max_size=5)
    if pa.types.is_boolean(type_):
        return st.booleans()
    if pa.types.is_integer(type_):
        bits = type_.bit_width
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if pa.types.is_float32(type_):
        return st.floats(width=32, allow_nan=False, allow_infinity=False)
    if pa.types.is_floating(type_):
        return st.floats(allow_nan=False)
    if pa.types.is_string(type_):
        return _TEXT
    raise NotImplementedError(type_)


def row_strategy(schema: RecordSchema) -> st.SearchStrategy[dict[str, Any]]:
    fields = {}
    for field in schema.arrow:
        value = value_strategy(field.type)
        fields[field.name] = value if not field.nullable else st.none() | value
    return st.fixed_dictionaries(fields)


def rows_strategy(schema: RecordSchema) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(row_strategy(schema), min_size=1, max_size=8)
