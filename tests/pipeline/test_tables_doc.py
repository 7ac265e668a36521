"""docs/tables.md is generated from the schemas and matches the tables DuckDB really has."""

from __future__ import annotations

from pathlib import Path

from api.tables import API_TABLES
from pipeline.store import LogIdentity, Store, StoredOffset
from pipeline.tables import render_tables_doc
from slo.tables import DOCUMENTED_TABLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "tables.md"


def test_checked_in_tables_doc_is_current() -> None:
    assert DOC.read_text() == render_tables_doc((*DOCUMENTED_TABLES, *API_TABLES)), (
        "regenerate with: llmslo tables > docs/tables.md"
    )


def test_every_duckdb_column_is_documented_with_a_comment(store: Store) -> None:
    rows = store.con.execute(
        "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE database_name = current_database()"
    ).fetchall()
    doc = DOC.read_text()
    assert len(rows) > 60
    for table, column, comment in rows:
        assert comment, f"{table}.{column} has no comment"
        assert f"`{table}`" in doc and f"`{column}`" in doc
    views = {
        name
        for (name,) in store.con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
    }
    assert views == {"engine_samples", "gpu_samples"}
    for view in views:
        assert f"## `{view}`" in doc


def test_migrate_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "twice.duckdb"
    with Store(path) as first:
        first.con.execute("INSERT INTO ingest_offsets VALUES ('g', 't', 0, 5, 1, 'c', 'u')")
    with Store(path) as second:
        assert second.read_offsets("g") == {("t", 0): StoredOffset(5, LogIdentity("c", "u"))}
