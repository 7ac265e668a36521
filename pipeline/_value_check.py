"""Checks a decoded table against its schema's value rules (:data:`pipeline.schema.VALUE_RULES`).

Vectorised with Arrow compute: each rule first takes a fast path (min/max, a NaN probe,
the dictionary of a dictionary column) and builds a per-row mask only when that fails,
so a valid message costs a few kernel calls per rule.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from pipeline._lazy import on_first_use
from pipeline.errors import DecodeError
from pipeline.schema import RecordSchema, ValueRule, value_rules

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = on_first_use("pyarrow")
    pc = on_first_use("pyarrow.compute")

__all__ = ["check_values"]


def _flat(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray | pa.Array, pa.Array | None]:
    """A list column's elements and the row of each (``None`` for a plain column)."""
    if not pa.types.is_list(column.type):
        return column, None
    combined = column.combine_chunks()
    return pc.list_flatten(combined), pc.list_parent_indices(combined)


def _breaks_range(rule: ValueRule, values: pa.ChunkedArray | pa.Array) -> pa.Array | None:
    """A mask of the values outside ``rule``'s bounds (NaN included); ``None`` if all fit."""
    floating = pa.types.is_floating(values.type)
    # Fast path: min and max within bounds and no NaN (the common case, no per-row mask).
    # A NaN makes the sum NaN (so may +inf and -inf together: the exact pass sorts that out).
    bounds = pc.min_max(values)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    has_nan = floating and math.isnan(pc.sum(values).as_py() or 0.0)
    if low is None or (
        not has_nan
        and (rule.minimum is None or low >= rule.minimum)
        and (rule.maximum is None or high <= rule.maximum)
    ):
        return None
    checks = [pc.is_nan(values)] if floating else []
    if rule.minimum is not None:
        checks.append(pc.less(values, rule.minimum))
    if rule.maximum is not None:
        checks.append(pc.greater(values, rule.maximum))
    mask = functools.reduce(pc.or_kleene, checks)
    # A null compares as null: filled as "fine", a missing value is not a bad one.
    return pc.fill_null(mask, False)


@functools.cache
def _allowed_array(allowed: tuple[str, ...]) -> pa.Array:
    return pa.array(allowed, pa.string())


def _breaks_allowed(rule: ValueRule, values: pa.ChunkedArray | pa.Array) -> pa.Array | None:
    """A mask of the strings not in ``rule.allowed``; ``None`` if all are allowed."""
    allowed = _allowed_array(rule.allowed or ())
    if pa.types.is_dictionary(values.type):
        chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
        # Fast path: every dictionary entry is allowed (unused entries are judged too, cheaply).
        if all(pc.all(pc.is_in(c.dictionary, allowed)).as_py() is not False for c in chunks):
            return None
        values = values.cast(values.type.value_type)
    mask = pc.and_(pc.is_valid(values), pc.invert(pc.is_in(values, allowed)))
    return mask if pc.any(mask).as_py() else None


def check_values(schema: RecordSchema, table: pa.Table) -> None:
    """Raise :class:`DecodeError` ``invalid_value`` if a value of ``table`` breaks a rule.

    The message names the column, the first bad value (at most 80 characters of it), its
    row and how many values broke the rule; nulls are never judged here.
    """
    for rule in value_rules(schema):
        values, rows = _flat(table.column(rule.column))
        if rule.allowed is not None:
            mask = _breaks_allowed(rule, values)
        else:
            mask = _breaks_range(rule, values)
        if mask is None or not pc.any(mask).as_py():
            continue
        bad = pc.indices_nonzero(mask)
        first = bad[0].as_py()
        row = first if rows is None else rows[first].as_py()
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        value = repr(values[first].as_py())
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise DecodeError(
            "invalid_value",
            f"{schema.name}.v{schema.version}: {rule.column}={shown} in row {row} "
            f"{rule.describe()} ({len(bad)} bad value(s) in the message)",
        )
