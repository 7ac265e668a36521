"""A DuckDB file held by another process: the error names the process and what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import StoreError
from pipeline.store import Store

HOLD = (
    "import sys, time, duckdb\n"
    "con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == 'read')\n"
    "print('open', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.parametrize("mode", ["write", "read"], ids=["held by a writer", "held by a reader"])
def test_opening_a_file_another_process_holds_names_it_and_says_what_to_do(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "held.duckdb"
    Store(path).close()  # tables exist, so a read-only holder can open it
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    holder = subprocess.Popen(
        [sys.executable, str(script), str(path), mode, "--marker-for-the-test"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError) as raised:
            Store(path)
    finally:
        holder.kill()
        holder.wait()
    message = str(raised.value)
    assert f"process {holder.pid}" in message
    assert "--marker-for-the-test" in message  # its command line, to recognise it by
    assert "Stop that process" in message and "--api" in message
