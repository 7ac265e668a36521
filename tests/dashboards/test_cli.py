"""`llmslo dashboard`: refuses what it cannot serve before starting anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmslo.cli import main
from llmslo.commands.dashboard import dashboard_command


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api", "http://127.0.0.1:1", "--db", "x.duckdb"], "give --api or --db, not both"),
        (["--api", "127.0.0.1:8080"], "expected an http:// or https:// URL"),
        (["--db", "nowhere/missing.duckdb"], "no such DuckDB file"),
        (["--db", "{empty}", "--port", "70000"], "--port 70000: must be in 1..65535"),
    ],
    ids=["both sources", "a URL without a scheme", "a missing file", "a port out of range"],
)
def test_a_bad_source_or_port_is_a_clear_error_and_exit_2(
    argv: list[str], message: str, empty_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(empty_db) if a == "{empty}" else a for a in argv]
    assert main(["dashboard", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_file_another_process_writes_points_to_the_api(empty_db: Path, tmp_path: Path) -> None:
    path = tmp_path / "busy.duckdb"
    path.write_bytes(empty_db.read_bytes())
    writer = subprocess.Popen(
        [sys.executable, "-c", "import duckdb,sys,time; c=duckdb.connect(sys.argv[1]); print(1, flush=True); time.sleep(60)", str(path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "1"
        done = subprocess.run(
            [sys.executable, "-m", "llmslo", "dashboard", "--db", str(path), "--port", "0"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        writer.kill()
        writer.wait()
    assert done.returncode == 2 and "use --api instead" in done.stderr


def test_streamlit_is_bound_to_loopback_and_headless() -> None:
    command = dashboard_command(8601)
    assert command[command.index("--server.address") + 1] == "127.0.0.1"
    assert command[command.index("--server.headless") + 1] == "true"
    assert command[command.index("--server.port") + 1] == "8601"
