"""The drill's CPU hogs: they really burn CPU, and nothing outlives the drill."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from llmslo.drill.hogs import MAX_HOGS, cpu_hogs
from pipeline.errors import ConfigError
from tests.processes import cpu_s, wait_gone


def test_each_hog_burns_cpu_and_is_stopped_when_the_block_ends() -> None:
    with cpu_hogs(2, max_s=60) as hogs:
        pids = [h.pid for h in hogs]
        # Busy, not sleeping: each reaches 0.3 CPU seconds (how soon depends on the load).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and min(cpu_s(p) for p in pids) < 0.3:
            time.sleep(0.1)
        burnt = [cpu_s(p) for p in pids]
    assert len(pids) == 2
    assert min(burnt) >= 0.3, burnt
    assert wait_gone(pids, 1.0) == []


def test_hogs_are_stopped_when_the_drill_raises() -> None:
    pids: list[int] = []
    with pytest.raises(RuntimeError), cpu_hogs(1, max_s=60) as hogs:
        pids = [h.pid for h in hogs]
        raise RuntimeError("a fleet failed")
    assert wait_gone(pids, 1.0) == []


def test_a_hog_stops_itself_at_its_deadline() -> None:
    with cpu_hogs(1, max_s=0.5) as hogs:
        hog = hogs[0]
        assert hog.wait(timeout=10) == 0


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_hogs_die_with_a_killed_parent() -> None:
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "from llmslo.drill.hogs import cpu_hogs\n"
            "with cpu_hogs(2, max_s=120) as hogs:\n"
            "    print(' '.join(str(h.pid) for h in hogs), flush=True)\n"
            "    time.sleep(1)  # killed later in its life, not while its hogs still start\n"
            "    os._exit(9)  # no clean-up runs, as after a SIGKILL\n",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    pids = [int(p) for p in parent.stdout.split()]
    assert parent.returncode == 9 and len(pids) == 2
    assert wait_gone(pids, 5.0) == []


@pytest.mark.skipif(sys.platform != "linux", reason="SCHED_IDLE is Linux's")
@pytest.mark.parametrize(
    ("hog_class", "policy"), [("besteffort", "SCHED_IDLE"), ("equal", "SCHED_OTHER")]
)
def test_a_hog_takes_its_class_cpu_weight(hog_class: str, policy: str) -> None:
    """A BestEffort neighbour runs SCHED_IDLE (the lowest weight); an equal one at the
    fleets' own."""
    with cpu_hogs(1, max_s=60, hog_class=hog_class) as hogs:
        pid = hogs[0].pid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and cpu_s(pid) < 0.05:  # past its set-up
            time.sleep(0.05)
        assert os.sched_getscheduler(pid) == getattr(os, policy)


def test_an_unknown_hog_class_is_refused() -> None:
    with pytest.raises(ConfigError, match="class"), cpu_hogs(1, max_s=1, hog_class="gold"):
        pass


@pytest.mark.parametrize("count", [-1, MAX_HOGS + 1])
def test_a_count_out_of_bounds_is_refused(count: int) -> None:
    with pytest.raises(ConfigError, match="hogs"), cpu_hogs(count, max_s=1):
        pass
