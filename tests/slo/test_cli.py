"""``llmslo slo validate``, ``llmslo slo report`` and ``llmslo jobs --once`` through main(argv)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from llmslo.cli import main
from pipeline.store import Store
from tests.slo.factories import T0_MS, histogram, insert, request

EXAMPLE = str(Path(__file__).parents[2] / "config" / "slo.example.yaml")


def test_validate_accepts_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slo", "validate", EXAMPLE]) == 0
    assert "valid (8 SLOs)" in capsys.readouterr().out  # 6 + the two probe SLOs


def test_validate_reports_field_paths_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "version: llmslo/v1\nslos:\n  - {name: a, objective: 99.9, sli: {kind: availability}}\n"
    )
    assert main(["slo", "validate", str(spec)]) == 2
    assert "slos[0].objective: must be in (0, 1)" in capsys.readouterr().err


def test_validate_checks_thresholds_against_bounds_in_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.duckdb"
    with Store(db) as store:  # this fleet's TTFT histogram has no 2 s bound
        insert(store, engine=histogram(T0_MS, "ttft", [0.5, 1.0, 2.5], {}, 0))
    assert main(["slo", "validate", EXAMPLE, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert (
        "slos[5].sli.threshold_s: 2 s is not a ttft bucket bound "
        "(bucket bounds seen in engine_samples)" in err
    )


def test_report_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db.duckdb"
    with Store(db) as store:
        insert(
            store,
            requests=[request(T0_MS + i * 1000, ttft_s=3.0 if i < 30 else 0.3) for i in range(100)],
        )
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ttft = next(s for s in report["slos"] if s["name"] == "ttft-p99")
    assert ttft["group"] == {"pool": "llama-3-8b"}
    assert ttft["events"] == 100 and ttft["bad"] == 30
    assert ttft["burn_rates"]["5m"] == pytest.approx(30.0)
    page = next(p for p in ttft["pairs"] if p["id"] == "page-1h-5m")
    assert page["alerting"] is True and page["guarded"] is False  # 100 events meet min_events: 100
    assert ttft["burn_rates"]["1h"] == pytest.approx(30.0)
    assert "own_targets" not in report  # no request carried targets of its own
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--no-update"]) == 0
    table = capsys.readouterr().out
    assert "inference-ttft-p99 [pool=llama-3-8b]" in table and "page-1h-5m" in table


def test_report_sets_requests_own_targets_beside_the_routers_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.duckdb"
    with Store(db) as store:
        insert(
            store,
            requests=[
                request(T0_MS, slo_ttft_s=0.5, ttft_s=0.9, slo_met=False),
                request(T0_MS + 1000, slo_ttft_s=0.5, ttft_s=0.2, slo_met=True),
                request(T0_MS + 2000, ttft_s=9.0),  # no targets of its own
            ],
        )
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--json"]) == 0
    own = json.loads(capsys.readouterr().out)["own_targets"]
    assert own["rows"] == [
        {
            "pool": "llama-3-8b",
            "type": "ttft",
            "tap_targeted": 2,
            "tap_violations": 1,
            "router_violations": None,
        }
    ]
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--no-update"]) == 0
    table = capsys.readouterr().out
    assert "[pool=llama-3-8b] ttft  taps 1 of 2 missed   router —" in table


def test_report_on_an_empty_store_needs_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db.duckdb"
    Store(db).close()
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db)]) == 2
    assert "no data yet" in capsys.readouterr().err
    assert (
        main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--at", str(T0_MS), "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert all(s["sli"] is None and s["budget_remaining"] == 1.0 for s in report["slos"])


def test_jobs_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db.duckdb"
    with Store(db) as store:
        insert(store, requests=[request(T0_MS + i * 1000, outcome="rejected") for i in range(200)])
    assert main(["jobs", "--spec", EXAMPLE, "--db", str(db), "--once"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ts_ms"] == T0_MS + 199_000
    assert "inference-availability" in out["alerting"] and out["errors"] == []


@pytest.mark.parametrize(
    "extra", [[], ["--no-update"], ["--at", str(T0_MS)]], ids=["updating", "read-only", "at"]
)
def test_report_on_a_missing_store_is_an_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    db = tmp_path / "typo" / "llmslo.duckdb"
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), *extra]) == 2
    assert f"no DuckDB store at {db}" in capsys.readouterr().err
    assert not db.exists() and not db.parent.exists()


def test_validate_against_a_missing_store_is_an_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "missing.duckdb"
    assert main(["slo", "validate", EXAMPLE, "--db", str(db)]) == 2
    assert f"no DuckDB store at {db}" in capsys.readouterr().err
    assert not db.exists()


def test_a_read_only_report_on_a_foreign_duckdb_file_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "other.duckdb"
    duckdb.connect(str(db)).close()
    size = db.stat().st_size
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--no-update"]) == 2
    assert "without llmslo's tables" in capsys.readouterr().err
    assert db.stat().st_size == size
