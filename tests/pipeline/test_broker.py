"""The embedded broker's start-up: a port picked for it may be taken before it binds."""

from __future__ import annotations

import socket

import pytest

from pipeline.broker import EmbeddedBroker
from pipeline.errors import BusError


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
