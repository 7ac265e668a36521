"""Hypothesis strategies that build valid rows of any record schema from its Arrow types.

Floats include NaN, infinities and ``-0.0`` (Arrow carries them all); ``json_safe=True``
draws only what JSON can carry (finite numbers, and float32 lists within float32 range).
Values also satisfy the schema's value rules (:data:`pipeline.schema.VALUE_RULES`): the
codec refuses anything else, see ``tests/pipeline/test_value_rules.py``. Text is valid Unicode: a lone surrogate cannot be stored in an Arrow (UTF-8) string at
all, and ``tests/pipeline/test_codec.py`` sends surrogates as hostile JSON on purpose.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from pipeline.schema import RecordSchema, ValueRule, value_rules

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


def value_strategy(type_: pa.DataType, *, json_safe: bool = False) -> st.SearchStrategy[Any]:
    if pa.types.is_dictionary(type_):
        return value_strategy(type_.value_type, json_safe=json_safe)
    if pa.types.is_list(type_):
        return st.lists(value_strategy(type_.value_type, json_safe=json_safe), max_size=5)
    if pa.types.is_boolean(type_):
        return st.booleans()
    if pa.types.is_integer(type_):
        bits = type_.bit_width
        return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if pa.types.is_float32(type_):
        return st.floats(width=32, allow_nan=not json_safe, allow_infinity=not json_safe)
    if pa.types.is_floating(type_):
        return st.floats(allow_nan=not json_safe, allow_infinity=not json_safe)
    if pa.types.is_string(type_):
        return _TEXT
    raise NotImplementedError(type_)


def ruled_value_strategy(
    type_: pa.DataType, rule: ValueRule, *, json_safe: bool = False
) -> st.SearchStrategy[Any]:
    """Values of ``type_`` that satisfy ``rule`` (bounds, allowed strings)."""
    if pa.types.is_list(type_):
        return st.lists(
            ruled_value_strategy(type_.value_type, rule, json_safe=json_safe), max_size=5
        )
    if rule.allowed is not None:
        return st.sampled_from(rule.allowed)
    if pa.types.is_integer(type_):
        bits = type_.bit_width
        low = -(2 ** (bits - 1)) if rule.minimum is None else int(rule.minimum)
        high = (
            2 ** (bits - 1) - 1
            if rule.maximum is None
            else min(int(rule.maximum), 2 ** (bits - 1) - 1)
        )
        return st.integers(low, high)
    return st.floats(
        rule.minimum,
        rule.maximum,
        width=32 if pa.types.is_float32(type_) else 64,
        allow_nan=False,
        allow_infinity=not json_safe and rule.maximum is None,
    )


def row_strategy(
    schema: RecordSchema, *, json_safe: bool = False
) -> st.SearchStrategy[dict[str, Any]]:
    fields = {}
    rules = {rule.column: rule for rule in value_rules(schema)}
    for field in schema.arrow:
        rule = rules.get(field.name)
        if rule is None:
            value = value_strategy(field.type, json_safe=json_safe)
        else:
            value = ruled_value_strategy(field.type, rule, json_safe=json_safe)
        fields[field.name] = value if not field.nullable else st.none() | value
    return st.fixed_dictionaries(fields)


def rows_strategy(
    schema: RecordSchema, *, json_safe: bool = False, min_size: int = 1
) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(row_strategy(schema, json_safe=json_safe), min_size=min_size, max_size=8)
