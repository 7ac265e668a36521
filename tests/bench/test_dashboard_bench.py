"""``bench/dashboard.py``'s CPU figures: a load's CPU seconds count the server's and the
browser's helper processes, not only the process the bench started."""

from __future__ import annotations

import subprocess
import sys

from bench import dashboard

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
