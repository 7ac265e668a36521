"""Shared fixtures: a real embedded Kafka-protocol broker, a Bus on it, a DuckDB file.

``require_tool(name)`` is how tests that need an external binary (promtool,
alertmanager, chromium, nginx) find it: they skip with a clear reason when it is missing,
and fail instead when ``LLMSLO_REQUIRE_TOOLS=1`` (CI sets it and installs them).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.address import ADDRESS_FILE_ENV
from pipeline.broker import EmbeddedBroker
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.store import Store


def require_tool(name: str, *candidates: str) -> str:
    """Path of binary ``name`` (or one of ``candidates``); skip or fail when absent."""
    for candidate in (name, *candidates):
        path = shutil.which(candidate)
        if path:
            return path
    message = f"{name} is not installed (apt-get install it, or run .ci/run)"
    if os.environ.get("LLMSLO_REQUIRE_TOOLS") == "1":
        pytest.fail(f"LLMSLO_REQUIRE_TOOLS=1 but {message}")
    pytest.skip(message)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a ``slow`` test run first, each file's tests in their order. Under
    ``--dist loadfile`` a file is one unit of work, handed to the workers in this order: a
    minutes-long file handed out last would keep one worker busy after the others are done."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort


@pytest.fixture(scope="session", autouse=True)
def _own_broker_address_file(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test (and the processes it starts) keeps the broker address file of
    ``llmslo run``/``llmslo broker`` in its session's temporary directory, never in the
    checkout's ``var/``: a broker a test starts is not joined by another test's command."""
    os.environ[ADDRESS_FILE_ENV] = str(tmp_path_factory.mktemp("address") / "broker.address")


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """One embedded broker for the whole session (tests isolate themselves by topic prefix)."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def bus(broker: EmbeddedBroker) -> Iterator[Bus]:
    """A Bus on the session broker with a fresh topic prefix, topics created (2 partitions)."""
    config = BusConfig(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=2,
    )
    with Bus(config) as connected:
        connected.ensure_topics()
        yield connected


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh DuckDB file with llmslo's tables."""
    with Store(tmp_path / "llmslo.duckdb") as opened:
        yield opened
