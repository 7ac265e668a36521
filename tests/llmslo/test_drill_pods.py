"""The drill's simulated fleet in a process of its own: it serves, takes faults over its pipe,
refuses bad ones and keeps serving, stops with the block, and its token timing does not wait
for the drill's interpreter lock."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from llmslo.drill.child import DrillChildError
from llmslo.drill.fronts import drill_fleet_config
from llmslo.drill.lag import LoopLag
from llmslo.drill.pods import POD_NICE, PodsProcess
from pipeline.errors import ConfigError


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def test_the_pods_serve_and_take_faults_over_the_pipe() -> None:
    config = drill_fleet_config("pods", 2, seed=3, prefill_chunk_tokens=512)
    with PodsProcess(config) as fleet:
        assert [p.name for p in fleet.pods] == ["p0", "p1"]
        assert fleet.pid is not None and fleet.pid != os.getpid()
        if os.geteuid() == 0:  # CAP_SYS_NICE: the engine stand-ins outweigh the rest
            assert os.getpriority(os.PRIO_PROCESS, fleet.pid) == POD_NICE
        assert _get(f"{fleet.pods[1].url}/health")[0] == 200
        assert "DCGM_FI_DEV_GPU_UTIL" in _get(f"{fleet.dcgm[0].url}/metrics")[1]

        fleet.set_fault("p1", "stall")
        assert "stall" in json.loads(_get(f"{fleet.pods[1].url}/admin/faults")[1])["active"]
        assert fleet.clear_fault("p1", "stall") is True
        assert json.loads(_get(f"{fleet.pods[1].url}/admin/faults")[1])["active"] == {}

        with pytest.raises(ConfigError, match="no_such_fault"):
            fleet.set_fault("p0", "no_such_fault")
        with pytest.raises(ConfigError, match="unknown 'p9'"):
            fleet.set_fault("p9", "stall")
        assert _get(f"{fleet.pods[0].url}/health")[0] == 200  # still serving
        url = fleet.pods[0].url
    assert fleet.started is None  # left: the layout is gone with the child
    with pytest.raises(urllib.error.URLError):
        _get(f"{url}/health")


def test_a_pod_process_that_dies_is_a_clear_error() -> None:
    with PodsProcess(drill_fleet_config("pods", 1, seed=3, prefill_chunk_tokens=512)) as fleet:
        assert fleet.pid is not None
        os.kill(fleet.pid, signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(DrillChildError, match="drill pods exited with code -9"):
            fleet.set_fault("p0", "stall")


def test_the_pods_keep_time_while_the_drill_holds_its_interpreter_lock() -> None:
    """A loop thread of the drill's own process stops while the lock is held (what the pods
    suffered beside the taps and the load); the pods' process does not."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with PodsProcess(drill_fleet_config("pods", 1, seed=3, prefill_chunk_tokens=512)) as fleet:
            fleet.start_lag()
            here = LoopLag(loop, period_s=0.05)
            time.sleep(0.3)
            sum(range(60_000_000))  # one C call: the lock is not released until it returns
            time.sleep(0.3)
            in_process, pods = here.stop(), fleet.stop_lag()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert in_process["max_ms"] >= 300, in_process  # the lock was held that long
    assert pods["max_ms"] < in_process["max_ms"] / 2, (pods, in_process)
