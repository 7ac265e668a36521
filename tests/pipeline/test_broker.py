"""The embedded broker's start-up: a port picked for it may be taken before it binds."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.broker import EmbeddedBroker
from pipeline.errors import BusError
from tests.processes import wait_gone


def test_a_picked_port_taken_before_the_broker_binds_it_is_picked_again() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:  # listens: connects succeed
        port = taken.getsockname()[1]
        broker = EmbeddedBroker()
        broker.port = port  # as if another process took the picked port meanwhile
        with broker:
            assert broker.port != port  # not the other listener
            with socket.create_connection(("127.0.0.1", broker.port), timeout=2):
                pass
        with pytest.raises(BusError, match="exited"), EmbeddedBroker(port=port):
            pass  # a port the caller chose is not swapped


def test_a_killed_owner_takes_its_embedded_broker_with_it(tmp_path: Path) -> None:
    """A test run or a pipeline killed with SIGKILL runs no clean-up: the kernel stops the
    broker and its object store (they used to pile up, one per killed run)."""
    owner = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os\n"
            "from pipeline.broker import EmbeddedBroker\n"
            "broker = EmbeddedBroker().start()\n"
            "print(broker.pid, broker._store.pid, flush=True)\n"
            "os._exit(9)  # as after a SIGKILL: no atexit, no finally\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    pids = [int(p) for p in owner.stdout.split()]
    assert owner.returncode == 9 and len(pids) == 2, owner.stderr[-2000:]
    assert wait_gone(pids, 15.0) == []
