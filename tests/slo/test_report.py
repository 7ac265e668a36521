"""``llmslo slo report``'s table names every group a reader can look for."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmslo.cli import main
from pipeline.store import Store
from tests.slo.factories import T0_MS, insert, request

EXAMPLE = str(Path(__file__).parents[2] / "config" / "slo.example.yaml")


def test_a_grouped_slo_without_events_says_so_instead_of_an_empty_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tap requests only, as in the demo: the probe SLOs (grouped by entry point) have no
    event, so there is no instance to name."""
    db = tmp_path / "db.duckdb"
    with Store(db) as store:
        insert(store, requests=[request(T0_MS + i * 1000, ttft_s=0.3) for i in range(50)])
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db)]) == 0
    table = capsys.readouterr().out
    assert "=]" not in table
    assert "inference-probe-availability [by instance: no events yet]" in table
    assert "inference-probe-ttft [by instance: no events yet]" in table
    assert "inference-availability [pool=llama-3-8b]" in table
