"""Every command that takes ``--metrics-port`` says which port is taken, in one sentence."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        [
            "collect",
            "--target",
            "127.0.0.1:1",
            "--rounds",
            "1",
            "--bootstrap-servers",
            "127.0.0.1:1",
        ],
        ["ingest", "--bootstrap-servers", "127.0.0.1:1", "--db", "{tmp}/i.duckdb"],
        ["jobs", "--spec", "config/slo.example.yaml", "--db", "{tmp}/j.duckdb", "--once"],
        ["tap", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--no-kafka"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_busy_metrics_port_is_one_sentence_naming_it_not_a_traceback(
    argv: list[str], taken_port: int, tmp_path: Path
) -> None:
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    done = subprocess.run(
        [sys.executable, "-m", "llmslo", *args, "--metrics-port", str(taken_port)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"llmslo {argv[0]}: --metrics-port {taken_port}: cannot serve")
    assert "in use" in line and "give a free port" in line
