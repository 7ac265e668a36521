"""Exactly once across a consumer group: a member dies between its DuckDB and Kafka
commits (deterministically, by the crash hook) and its partitions move to the others."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from pipeline.broker import EmbeddedBroker
from pipeline.bus import Bus
from pipeline.config import BusConfig
from tests.pipeline.ingest_helpers import produce_numbered, start_ingest, wait_for_log, write_config

TOTAL = 100_000
FIRST_PHASE = 10_000  # two batches of 5,000 rows for the first member alone
CRASH_AFTER_COMMIT = 3  # so its third commit comes after the others joined


@pytest.fixture
def wide_bus(broker: EmbeddedBroker) -> Iterator[Bus]:
    """Six partitions per topic, so three members each own some."""
    config = BusConfig(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=6,
    )
    with Bus(config) as connected:
        connected.ensure_topics()
        yield connected


def _union(dbs: list[Path]) -> tuple[int, int, float, float]:
    con = duckdb.connect()
    for i, db in enumerate(dbs):
        con.execute(f"ATTACH '{db}' AS member_{i} (READ_ONLY)")
    union = " UNION ALL ".join(
        f"SELECT value FROM member_{i}.engine_samples" for i in range(len(dbs))
    )
    row = con.execute(
        f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM ({union})"
    ).fetchone()
    assert row is not None
    return row


@pytest.mark.slow
@pytest.mark.parametrize("members", [2, 3], ids=["two ingesters", "three ingesters"])
def test_a_member_killed_between_its_duckdb_and_kafka_commits_doubles_nothing(
    wide_bus: Bus, tmp_path: Path, members: int
) -> None:
    bus = wide_bus
    # Batches are cut by rows only (10 messages of 500), so commit counts are deterministic.
    config = write_config(
        tmp_path / "llmslo.yaml",
        bus,
        batch_max_rows=5_000,
        batch_max_ms=10_000,
        session_timeout_ms=6_000,
        peer_stores=[str(tmp_path / "*.duckdb")],
    )
    dbs = [tmp_path / f"member-{i}.duckdb" for i in range(members)]
    logs = [tmp_path / f"member-{i}.log" for i in range(members)]
    # Member 0 dies right after its 3rd DuckDB commit, before Kafka hears of that batch.
    doomed = start_ingest(
        config,
        dbs[0],
        logs[0],
        "--exit-when-idle",
        "30",
        crash_after_commit=CRASH_AFTER_COMMIT,
    )
    wait_for_log(doomed, logs[0], "starts at offset")
    produce_numbered(bus, total=FIRST_PHASE, per_message=500)
    time.sleep(3)  # member 0 commits them (two batches) alone
    others = []
    for i in range(1, members):  # they join mid-stream: partitions move
        others.append(start_ingest(config, dbs[i], logs[i], "--exit-when-idle", "30"))
        wait_for_log(others[-1], logs[i], "starts at offset")
    produce_numbered(bus, total=TOTAL - FIRST_PHASE, per_message=500, first=FIRST_PHASE)
    doomed.wait(timeout=120)
    assert doomed.returncode == -signal.SIGKILL
    assert f"crashing after DuckDB commit {CRASH_AFTER_COMMIT}" in logs[0].read_text()
    for process, log in zip(others, logs[1:], strict=True):
        out, _ = process.communicate(timeout=180)
        assert process.returncode == 0, log.read_text()[-2000:]
        assert json.loads(out.decode().strip().splitlines()[-1])["ingest"] == "stopped"
    assert _union(dbs) == (TOTAL, TOTAL, 0, TOTAL - 1)
