"""The drill's Alertmanager: started on loopback, read for when it received each alert, and
"not run" (or an error under ``LLMSLO_REQUIRE_TOOLS=1``) when the binary is missing; the
command's ``--healthy-load``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from llmslo.cli import main
from llmslo.drill.alerts import Alertmanager, AlertWatch, find_alertmanager
from llmslo.drill.matrix import DrillProfile, DrillReport, run_drill
from llmslo.drill.report import render_markdown
from llmslo.drill.score import ModeResult
from pipeline.errors import ConfigError
from tests.conftest import require_tool


def _post(url: str, starts: datetime) -> None:
    alert = {
        "labels": {"alertname": "LlmEngineStalled", "instance": "127.0.0.1:9001"},
        "startsAt": starts.isoformat(),
    }
    httpx.post(f"{url}/api/v2/alerts", json=[alert], timeout=5).raise_for_status()


def test_the_watch_keeps_when_alertmanager_first_received_each_alert(tmp_path: Path) -> None:
    binary = require_tool("prometheus-alertmanager", "alertmanager")
    started = datetime.now(UTC) - timedelta(minutes=10)  # the alert's own start: long before
    with Alertmanager(binary, tmp_path) as manager, AlertWatch(manager.url, 0.2) as watch:
        before_ms = int(time.time() * 1000)
        _post(manager.url, started)
        after_ms = int(time.time() * 1000)
        deadline = time.monotonic() + 10
        while not watch.received() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        _post(manager.url, started)  # a re-send: Alertmanager moves updatedAt, not the receipt
        time.sleep(0.6)
        (alert,) = watch.received()
    assert alert.name == "LlmEngineStalled" and alert.labels["instance"] == "127.0.0.1:9001"
    assert before_ms - 5 <= alert.received_ts_ms <= after_ms + 5
    assert alert.starts_ts_ms == int(started.timestamp() * 1000)


def test_without_the_binary_the_alert_column_says_not_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("LLMSLO_REQUIRE_TOOLS", raising=False)
    assert find_alertmanager() is None
    report = DrillReport(0, DrillProfile(), alertmanager=None)
    report.results.append(ModeResult("stall", "fleet0", "127.0.0.1:9001", "stall", 0, 1))
    text = render_markdown(report)
    assert "Alerts: not run" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| stall ")]
    assert row.split("|")[8].strip() == "not run"


def test_required_tools_make_a_missing_alertmanager_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("LLMSLO_REQUIRE_TOOLS", "1")
    with pytest.raises(ConfigError, match="prometheus-alertmanager is not installed"):
        run_drill([], tmp_path / "drill", DrillProfile(healthy_minutes=0.1))
    assert not (tmp_path / "drill").exists()  # refused before anything ran


def test_the_command_states_load_as_a_share_of_capacity_and_refuses_nonsense(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["drill", "--modes", "none", "--healthy-minutes", "1", "--workdir", str(tmp_path)]
    assert main([*argv, "--healthy-load", "5"]) == 2
    assert "healthy_load must be a share of capacity in (0, 2]" in capsys.readouterr().err
    assert main([*argv, "--healthy-load", "0"]) == 2
    assert not any(tmp_path.iterdir())  # refused before any fleet ran
