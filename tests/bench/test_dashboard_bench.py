"""``bench/dashboard.py``'s CPU figures: a load's CPU seconds count the server's and the
browser's helper processes, not only the process the bench started; its "scripts cached"
cold loads come from a fresh server at the address of the one before."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from bench import dashboard
from pipeline.store import Store

#: A parent that starts a child burning ``SPIN_S`` of CPU, then both wait to be killed.
SPIN_S = 0.3
_PARENT = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import time
while time.process_time() < {SPIN_S}:
    pass
print("spun", flush=True)
time.sleep(60)
'''], stdout=sys.stdout)
time.sleep(60)
"""


def test_a_loads_cpu_seconds_include_the_child_processes() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "spun"
        assert dashboard.cpu_s(parent.pid) >= SPIN_S
    finally:
        for child in dashboard.psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait(timeout=10)


def test_a_process_gone_costs_nothing_rather_than_failing() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    assert dashboard.cpu_s(gone.pid) == 0.0


def test_a_fresh_server_can_take_the_address_of_the_one_before(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    with Store(db):
        pass
    first, url = dashboard.serve(db)
    dashboard._stop(first)
    second, again = dashboard.serve(db, port=int(url.rsplit(":", 1)[1]))
    try:
        with urllib.request.urlopen(f"{again}/_stcore/health", timeout=30) as answer:
            health = answer.read().decode()
    finally:
        dashboard._stop(second)
    assert again == url  # the same origin: the browser's cached scripts apply
    assert health == "ok"
