"""Replay over a generated history with a known incident: the findings and flags a live jobs
process would have raised, at the simulated times of the incident, the same twice, and a
"what would this spec have done" copy that leaves the source file alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from llmslo.cli import main
from llmslo.run import EXAMPLE_SPEC, load_model
from pipeline.store import Store
from pipeline.units import MINUTE_MS
from simulator.history import HistoryConfig, HistoryGenerator, StoreSink
from slo.replay import parse_instant, replay

#: 2025-12-01T15:00:00Z: the diurnal load peaks at 15:00 UTC, so the incident's KV surge
#: (+25 points of usage) takes the busiest pods' free blocks below every flag threshold.
INCIDENT_MS = 1_764_601_200_000
END_MS = INCIDENT_MS + 70 * MINUTE_MS  # the incident lasts an hour: still on at the end
FROM_MS = INCIDENT_MS - 5 * MINUTE_MS
TO_MS = INCIDENT_MS + 8 * MINUTE_MS
#: Within this of the injected time the replay must have raised the incident's findings.
BOUND_MS = 3 * MINUTE_MS

TABLES = {
    "slo_findings": "SELECT * FROM slo_findings ORDER BY ALL",
    "flag_transitions": "SELECT * FROM flag_transitions ORDER BY ALL",
    "slo_status_current": "SELECT * FROM slo_status_current ORDER BY ALL",
}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hours of 8 pods, one incident at a known simulated time (no replay yet)."""
    path = tmp_path_factory.mktemp("replay") / "history.duckdb"
    generator = HistoryGenerator(
        HistoryConfig(days=2 / 24, end_ts_ms=END_MS, pods=8, incident_starts_ms=(INCIDENT_MS,))
    )
    with Store(path) as store:
        sink = StoreSink(store)
        for schema, table in generator.chunks():
            sink.write(schema, table)
    return path


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[Any, ...]]]:
    return {name: con.execute(sql).fetchall() for name, sql in TABLES.items()}


@pytest.fixture(scope="module")
def replayed(history: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A copy of the history replayed twice over the same range: (file, tables each time)."""
    path = tmp_path_factory.mktemp("replayed") / "h.duckdb"
    path.write_bytes(history.read_bytes())
    model = load_model(None)
    runs = []
    with Store(path) as store:
        for _ in range(2):
            summary = replay(store.con, model, start_ms=FROM_MS, end_ms=TO_MS)
            assert summary.errors == []
            assert summary.steps == 14
            runs.append(_tables(store.con))
    return path, runs


def test_replay_raises_the_incidents_findings_within_minutes_of_it_and_none_before(
    replayed: tuple[Path, Any],
) -> None:
    _, (tables, _) = replayed
    firing = [r for r in tables["slo_findings"] if r[1] == "firing"]
    assert all(ts >= INCIDENT_MS for ts, *_ in firing), "a finding before the incident"
    early = {(signal, severity) for ts, _, signal, _, _, _, severity, *_ in firing}
    assert ("oom_risk", "page") in early  # KV usage near 100 %: the page an on-call gets
    assert {"preemption_cascade", "queue_growth"} <= {signal for signal, _ in early}
    first = min(ts for ts, *_ in firing)
    assert INCIDENT_MS <= first <= INCIDENT_MS + BOUND_MS
    # every step is on the minute grid, stamped with its simulated time
    assert all(ts % MINUTE_MS == 0 for ts, *_ in tables["slo_findings"])


def test_replay_steps_the_flags_at_the_incidents_simulated_time(
    replayed: tuple[Path, Any],
) -> None:
    _, (tables, _) = replayed
    transitions = tables["flag_transitions"]
    assert transitions, "no degradation flag moved during the incident"
    assert all(INCIDENT_MS <= row[0] <= TO_MS for row in transitions)
    columns = ("ts_ms", "scope", "scope_id", "pool", "from_level", "to_level")
    rows = [dict(zip(columns, row, strict=False)) for row in transitions]
    pool = [r for r in rows if r["scope"] == "pool" and r["to_level"] >= 2]
    assert pool and pool[0]["ts_ms"] <= INCIDENT_MS + BOUND_MS  # the pool degraded in minutes
    assert min(r["ts_ms"] for r in rows if r["scope"] == "instance") <= INCIDENT_MS + MINUTE_MS


def test_replay_leaves_the_slo_status_of_its_last_step_with_the_page_alerting(
    replayed: tuple[Path, Any],
) -> None:
    _, (tables, _) = replayed
    statuses = {
        json.loads(row[3])["name"]: (row[2], json.loads(row[3]))
        for row in tables["slo_status_current"]
    }
    ts, ttft = statuses["ttft-p99"]
    assert ts == TO_MS  # the last step's time, not the wall clock's
    assert any(p["alerting"] and p["severity"] == "page" for p in ttft["pairs"])


def test_two_replays_of_the_same_range_write_identical_tables(replayed: tuple[Path, Any]) -> None:
    _, (first, second) = replayed
    assert first == second  # replaced, never duplicated
    assert len(first["slo_findings"]) > 10


def test_replay_into_a_scratch_file_never_touches_the_source(
    history: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "live.duckdb"
    source.write_bytes(history.read_bytes())
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    scratch = tmp_path / "what-if.duckdb"
    argv = ["jobs", "--spec", str(EXAMPLE_SPEC), "--db", str(source), "--replay"]
    # "--from -6m": relative to the newest data, as written (not --from=-6m)
    assert main([*argv, "--from", "-6m", "--into", str(scratch)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["db"] == str(scratch) and out["steps"] == 7 and out["errors"] == []
    assert out["replay"]["to_ts_ms"] == END_MS
    assert hashlib.sha256(source.read_bytes()).hexdigest() == digest
    with duckdb.connect(str(source), read_only=True) as con:
        names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert "slo_findings" not in names or con.execute(
            "SELECT count(*) FROM slo_findings"
        ).fetchone() == (0,)
    with duckdb.connect(str(scratch), read_only=True) as con:
        (found,) = con.execute("SELECT count(*) FROM slo_findings").fetchone() or (0,)
        (raw,) = con.execute("SELECT count(*) FROM engine_samples").fetchone() or (0,)
    assert found > 0 and raw > 0  # the copy holds the history and what the spec concluded


def test_sim_history_opens_with_findings_and_flags_unless_told_not_to(tmp_path: Path) -> None:
    db = tmp_path / "h.duckdb"
    argv = ["sim", "history", "--days", "0.01", "--pods", "2", "--db", str(db)]
    assert main([*argv, "--end-ts-ms", str(END_MS)]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM slo_status_current").fetchone() != (0,)
    skipped = tmp_path / "skipped.duckdb"
    argv = ["sim", "history", "--days", "0.01", "--pods", "2", "--db", str(skipped)]
    assert main([*argv, "--end-ts-ms", str(END_MS), "--no-replay"]) == 0
    with duckdb.connect(str(skipped), read_only=True) as con:
        names = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert "slo_status_current" not in names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-24h", END_MS - 24 * 60 * MINUTE_MS),
        ("-90m", END_MS - 90 * MINUTE_MS),
        ("2025-12-01T15:00:00Z", INCIDENT_MS),
        ("2025-12-01T16:00:00+01:00", INCIDENT_MS),
        (str(INCIDENT_MS), INCIDENT_MS),
    ],
)
def test_replay_instants_are_utc_epoch_ms_or_relative_to_the_newest_data(
    text: str, expected: int
) -> None:
    assert parse_instant(text, END_MS) == expected
