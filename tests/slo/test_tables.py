"""The SLO engine's tables are declared once: DuckDB has exactly them, commented and documented."""

from __future__ import annotations

from pathlib import Path

from pipeline.store import Store
from slo.rollups.counts import create_rollup_tables
from slo.sinks import create_output_tables
from slo.tables import SLO_TABLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "tables.md"


def test_every_slo_column_in_duckdb_is_declared_commented_and_documented(store: Store) -> None:
    create_rollup_tables(store.con)
    create_output_tables(store.con)
    create_rollup_tables(store.con)  # idempotent, comments included
    rows = store.con.execute(
        "SELECT table_name, column_name, data_type, is_nullable, comment FROM duckdb_columns() "
        "WHERE database_name = current_database() AND table_name LIKE 'slo\\_%' ESCAPE '\\' "
        "ORDER BY table_name, column_index"
    ).fetchall()
    declared = {
        (t.name, name): (type_.split()[0], "NOT NULL" not in type_, meaning)
        for t in SLO_TABLES
        for name, type_, meaning in t.columns
    }
    assert {(table, column) for table, column, *_ in rows} == set(declared)
    doc = DOC.read_text()
    for table, column, data_type, nullable, comment in rows:
        type_, may_be_null, meaning = declared[(table, column)]
        assert (data_type, nullable, comment) == (type_, may_be_null, meaning)
        assert f"## `{table}`" in doc and f"| `{column}` |" in doc
