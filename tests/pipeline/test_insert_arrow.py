"""Every writer of Arrow rows into DuckDB inserts by column name: a file whose table holds
its columns in another order (as one upgraded across releases does) still receives each
value in its own column."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from alerts.push import ActiveAlert
from alerts.records import AlertChange, alert_rows, table_writer
from llmslo.drill.matrix import DrillProfile, DrillReport
from llmslo.drill.report import write_drills
from llmslo.drill.score import ModeResult
from pipeline.store import Store, insert_arrow
from slo.flags import FlagTransition
from slo.sinks import StoreTransitionSink
from slo.tables import DRILLS


def _reverse_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Rebuild ``table`` with its columns in reverse order, rows kept."""
    names = [row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()]
    columns = ", ".join(f'"{name}"' for name in reversed(names))
    con.execute(f"CREATE TABLE {table}_reversed AS SELECT {columns} FROM {table}")
    con.execute(f"DROP TABLE {table}")
    con.execute(f"ALTER TABLE {table}_reversed RENAME TO {table}")


@pytest.fixture
def reordered_store(tmp_path: Path) -> Path:
    """A store file whose ``flag_transitions`` and ``alerts`` hold their columns reversed."""
    path = tmp_path / "upgraded.duckdb"
    with Store(path) as store:
        _reverse_columns(store.con, "flag_transitions")
        _reverse_columns(store.con, "alerts")
    return path


def test_flag_transitions_land_in_their_columns_of_a_reordered_table(
    reordered_store: Path,
) -> None:
    transition = FlagTransition(
        ts_ms=120_000,
        scope="instance",
        scope_id="10.0.0.7:8000",
        pool="chat",
        from_level=0,
        to_level=2,
        kv_free_ratio=0.04,
        reason="kv_free_low",
        evidence={"kv_free_ratio": 0.04},
    )
    with Store(reordered_store) as store:
        StoreTransitionSink(store.con).write([transition])
        got = store.con.execute(
            "SELECT ts_ms, scope, scope_id, pool, from_level, to_level, kv_free_ratio, reason "
            "FROM flag_transitions"
        ).fetchall()
    assert got == [(120_000, "instance", "10.0.0.7:8000", "chat", 0, 2, 0.04, "kv_free_low")]


def test_alert_rows_land_in_their_columns_of_a_reordered_table(reordered_store: Path) -> None:
    alert = ActiveAlert(
        labels={"alertname": "LlmEngineStalled", "severity": "page", "instance": "h:1"},
        annotations={"summary": "stalled"},
        generator_url="http://jobs/stall",
    )
    change = AlertChange(ts_ms=90_000, state="resolved", alert=alert, starts_ts_ms=30_000)
    with Store(reordered_store) as store:
        table_writer(store.con)(alert_rows([change]))
        got = store.con.execute(
            "SELECT ts_ms, alertname, state, severity, starts_ts_ms, ends_ts_ms, generator_url "
            "FROM alerts"
        ).fetchall()
    assert got == [
        (90_000, "LlmEngineStalled", "resolved", "page", 30_000, 90_000, "http://jobs/stall")
    ]


def test_drill_rows_land_in_their_columns_of_a_reordered_table(tmp_path: Path) -> None:
    profile = DrillProfile(warmup_s=20, hold_s=40, clear_s=35, modes_per_fleet=1, seed=7)
    result = ModeResult(
        mode="stall",
        fleet="fleet-1",
        instance="h:1",
        fault="stall",
        injected_ts_ms=1_000,
        removed_ts_ms=41_000,
        detected=True,
        detected_by=["stall"],
        detect_s=4.5,
    )
    report = DrillReport(started_ts_ms=500, profile=profile, results=[result])
    with duckdb.connect(str(tmp_path / "drills.duckdb")) as con:
        reversed_columns = ", ".join(f"{n} {t}" for n, t, _ in reversed(DRILLS.columns))
        con.execute(f"CREATE TABLE {DRILLS.name} ({reversed_columns})")
        assert write_drills(con, report) == 1
        got = con.execute(
            "SELECT run_ts_ms, mode, fleet, instance, injected_ts_ms, detected, detect_s "
            "FROM drills"
        ).fetchall()
    assert got == [(500, "stall", "fleet-1", "h:1", 1_000, True, 4.5)]


def test_columns_the_rows_lack_are_left_null_and_registrations_are_not_left_behind(
    tmp_path: Path,
) -> None:
    with duckdb.connect(str(tmp_path / "t.duckdb")) as con:
        con.execute("CREATE TABLE t (b VARCHAR, a BIGINT, c DOUBLE)")
        insert_arrow(con, "t", pa.table({"a": [1, 2], "b": ["x", "y"]}))
        got = con.execute("SELECT a, b, c FROM t ORDER BY a").fetchall()
        views = con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall()
    assert got == [(1, "x", None), (2, "y", None)]
    assert views == [(0,)]
