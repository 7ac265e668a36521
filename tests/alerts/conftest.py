"""Helpers for the alerts tests: generate a spec's bundle into a directory, run promtool."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from alerts import alertmanager_config, load_rule_model, render_bundle, render_yaml, write_all
from alerts.push import ActiveAlert
from alerts.records import AlertChange, alert_rows, table_writer
from pipeline.store import Store
from slo.sinks import JobsHeartbeat, StoreTransitionSink
from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).parent / "specs"
#: Every example spec the project ships plus the test specs (all sources and formats).
EXAMPLE_SPECS = [
    REPO / "config" / "slo.example.yaml",
    SPECS / "engines.yaml",
    SPECS / "openslo.yaml",
    SPECS / "sloth-getting-started.yaml",
]


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool (Debian ``prometheus``)."""
    return require_tool("promtool")


def record_alert(db: Path, fired_ms: int, last_cycle_ms: int | None) -> None:
    """Store one page alert (``LlmEngineStalled`` on pod-0) that fired at ``fired_ms`` and, when
    given, a jobs heartbeat at ``last_cycle_ms`` (the last cycle that confirmed it)."""
    page = ActiveAlert(
        {"alertname": "LlmEngineStalled", "severity": "page", "instance": "pod-0:8000"},
        {"summary": "stall on instance pod-0:8000"},
    )
    with Store(db) as store:
        table_writer(store.con)(alert_rows([AlertChange(fired_ms, "firing", page, fired_ms)]))
        if last_cycle_ms is not None:
            beat = JobsHeartbeat(last_cycle_ms, last_cycle_ms, "host-1", 10.0)
            StoreTransitionSink(store.con).beat(beat)


def generate(spec: Path, out: Path) -> tuple[Path, list[Path]]:
    """Write ``spec``'s rule file and promtool tests under ``out``; returns their paths."""
    rules = out / "rules.yml"
    files = render_bundle(load_rule_model(spec), rules, out / "tests")
    write_all(files)
    return rules, sorted(p for p in files if p != rules)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run a binary, capturing text output (never raises on exit status)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Alertmanager:
    """A real prometheus-alertmanager on loopback with the generated config (``group_wait``
    1 s); ``stop()`` then ``start()`` is a restart on the same port."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary, self.directory = binary, directory
        self.config = directory / "alertmanager.yml"
        self.config.write_text(render_yaml(alertmanager_config(group_wait="1s"), header=""))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.directory / "alertmanager.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("alertmanager did not become ready")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v2/alerts", timeout=5)
        response.raise_for_status()
        return list(response.json())


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    manager = Alertmanager(require_tool("prometheus-alertmanager", "alertmanager"), tmp_path)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


def eventually(check: Any, timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)
