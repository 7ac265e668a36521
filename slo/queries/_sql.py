"""The SQL plumbing every :mod:`slo.queries` function shares: which tables exist, optional
filters as bound parameters, and running a query into its declared Arrow schema.

Private to ``slo``; the public name :func:`present_tables` is exported by ``slo.queries``.
Column names in the SQL fragments built here come from the callers' fixed strings, never
from a value (values are always bound parameters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import duckdb
import pyarrow as pa

from slo.queries._params import check_text, check_texts

__all__ = ["optional_equal", "optional_in", "present_tables", "run_query", "signal_filter"]


def present_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Names of the tables and views of the connection's current database.

    What a reader checks before asking a table the jobs or the API may not have created
    yet (a young store). Raises :class:`duckdb.Error` when the store does not answer.
    """
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "UNION ALL SELECT view_name FROM duckdb_views() WHERE database_name = current_database()"
    ).fetchall()
    return {name for (name,) in rows}


def run_query(
    con: duckdb.DuckDBPyConnection,
    schema: pa.Schema,
    tables: Sequence[str],
    sql: str,
    params: Sequence[object] | Mapping[str, object],
) -> pa.Table:
    """Run ``sql`` and cast its answer to ``schema``; empty when a table in ``tables`` is
    missing. ``params`` bind ``?`` in order, or ``$name`` by name (a mapping)."""
    if not set(tables) <= present_tables(con):
        return schema.empty_table()
    bound = dict(params) if isinstance(params, Mapping) else list(params)
    table: pa.Table = con.sql(sql, params=bound).to_arrow_table()
    return table.rename_columns(schema.names).cast(schema)


def optional_equal(column: str, value: object, parameter: str) -> tuple[str, list[object]]:
    """`` AND column = ?`` with its value, or nothing when ``value`` is None."""
    if value is None:
        return "", []
    return f" AND {column} = ?", [check_text(parameter, value)]


def optional_in(column: str, values: object, parameter: str) -> tuple[str, list[object]]:
    """`` AND column IN (?, …)`` with its values, or nothing when ``values`` is None."""
    if values is None:
        return "", []
    checked = check_texts(parameter, values)
    return f" AND {column} IN ({', '.join('?' * len(checked))})", list(checked)


def signal_filter(
    signals: Sequence[str],
    *,
    within: Sequence[tuple[str, object, str]] = (),
    equal: Sequence[tuple[str, object, str]] = (),
) -> tuple[str, list[object]]:
    """The WHERE clause of a bucketed-signal read: ``signal IN (signals)``, then each
    ``(column, values, parameter)`` of ``within`` as ``column IN (values)`` and each of
    ``equal`` as ``column = value``, skipping the None ones. Raises
    :class:`pipeline.errors.QueryError` naming the parameter of a bad value."""
    wanted = check_texts("signals", signals)
    where, params = f"signal IN ({', '.join('?' * len(wanted))})", list[object](wanted)
    for column, values, parameter in within:
        clause, bound = optional_in(column, values, parameter)
        where, params = where + clause, params + bound
    for column, value, parameter in equal:
        clause, bound = optional_equal(column, value, parameter)
        where, params = where + clause, params + bound
    return where, params
