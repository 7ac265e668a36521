"""The demo's report tells the truth: its ``=== signals ===`` section lists the findings still
open in ``slo_findings`` (as ``/api/v1/findings/open``), not the last cycle's detector output."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmslo.demo import _print_demo_result
from pipeline.store import Store
from slo.jobs import CycleResult
from slo.signals.detectors import Finding
from slo.sinks import create_output_tables, write_findings

T0 = 1_764_601_200_000


def _finding(ts: int, signal: str, instance: str, severity: str) -> Finding:
    return Finding(ts, signal, "instance", instance, "llama", severity, "signature", {"x": 1})


def test_the_signals_section_prints_the_open_findings_not_the_last_cycles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.duckdb"
    stall = _finding(T0, "stall", "pod-0", "page")
    queue = _finding(T0 + 60_000, "queue_growth", "pod-1", "ticket")
    gone = _finding(T0 + 5_000, "preemption_cascade", "pod-2", "ticket")
    with Store(db) as store:
        create_output_tables(store.con)
        write_findings(store.con, T0, "firing", [stall])
        write_findings(store.con, T0 + 5_000, "firing", [gone])
        write_findings(store.con, T0 + 60_000, "firing", [queue])
        write_findings(store.con, T0 + 90_000, "resolved", [gone])
    # the last cycle no longer re-detected the stall (its tokens stopped long before)
    _print_demo_result(db, CycleResult(T0 + 120_000, findings=[queue]))
    out = capsys.readouterr().out
    signals = out.split("=== signals ===")[1].split("=== instances")[0]
    lines = [line for line in signals.splitlines() if line.strip()]
    assert len(lines) == 2, signals
    assert "stall" in lines[0] and "pod-0" in lines[0] and "page" in lines[0]  # pages first
    assert "since 15:00:00 UTC" in lines[0]
    assert "queue_growth" in lines[1] and "pod-1" in lines[1]
    assert "preemption_cascade" not in signals  # resolved: not open


def test_a_demo_without_findings_says_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.duckdb"
    with Store(db):
        pass  # a store whose jobs never wrote a finding (no slo_findings table at all)
    _print_demo_result(db, None)
    signals = capsys.readouterr().out.split("=== signals ===")[1].split("=== instances")[0]
    assert signals.strip() == "(none)"
