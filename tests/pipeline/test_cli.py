"""The command line: help with examples everywhere, and the demo works on embedded defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmslo.cli import build_parser, main
from pipeline.store import Store


def _subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)  # type: ignore[arg-type]


def test_top_level_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "llmslo demo" in out


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_has_help_with_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "examples:" in capsys.readouterr().out


@pytest.mark.slow
def test_demo_runs_the_whole_product_and_reports_what_it_saw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.duckdb"
    assert main(["demo", "--seconds", "30", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    # The SLO report covers the example spec, computed from tap records that were ingested.
    assert "inference-availability" in out and "inference-ttft-p99" in out
    stored = re.search(r"requests ([\d,]+), flag_transitions", out)
    assert stored is not None and int(stored.group(1).replace(",", "")) > 50
    # The KV leak injected into pod-1 raised its degradation flag.
    transitions = out.split("=== degradation flag transitions ===")[1]
    assert "L0 -> L" in transitions
    # Names people use: pods are pod-N everywhere, their host:port one column away.
    signals = out.split("=== signals ===")[1].split("=== instances")[0]
    assert "pod-1" in transitions.split("DuckDB")[0]
    assert "127.0.0.1:" not in transitions.split("DuckDB")[0] and "127.0.0.1:" not in signals
    instances = out.split("=== instances")[1].split("=== degradation")[0]
    assert re.search(r"pod-0\s+127\.0\.0\.1:\d+", instances)
    with Store(db, read_only=True) as store:
        served = store.con.execute(
            "SELECT DISTINCT instance, address IS NOT NULL FROM requests ORDER BY 1"
        ).fetchall()
        tapped = store.con.execute(
            "SELECT DISTINCT instance FROM engine_samples WHERE dialect = 'tap' ORDER BY 1"
        ).fetchall()
    assert served == [(f"pod-{i}", True) for i in range(4)]
    assert tapped == [(f"pod-{i}",) for i in range(4)]
    # It ends by saying how to open the dashboards on the data it kept.
    assert (
        out.rstrip()
        .splitlines()[-1]
        .startswith(f"Dashboards on this data: llmslo dashboard --db {db}")
    )
    assert db.exists()


def test_an_unreachable_broker_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        ["ingest", "--bootstrap-servers", "127.0.0.1:1", "--db", str(tmp_path / "x.duckdb")]
    )
    assert code == 2
    assert "127.0.0.1:1" in capsys.readouterr().err


def test_lake_export_from_a_missing_store_is_an_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "missing.duckdb"
    args = ["lake", "export", "--db", str(db), "--lake", str(tmp_path / "lake")]
    assert main(args) == 2
    assert f"no DuckDB store at {db}" in capsys.readouterr().err
    assert not db.exists()
