"""Exactly once across a consumer group through the Iceberg lake alone (no ``peer_stores``):
members join mid-stream (partitions move), and one is SIGKILLed between its Iceberg commit
and its Kafka commit. The table must hold exactly the produced samples."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.broker import EmbeddedBroker
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.iceberg.config import IcebergConfig
from pipeline.iceberg.lake import IcebergLake
from pipeline.iceberg.tables import lake_topics
from tests.pipeline.ingest_helpers import produce_numbered, start_ingest, wait_for_log, write_config
from tests.pipeline.lake_servers import BUCKET, S3Server, postgres, s3_server

__all__ = ["postgres", "s3_server"]  # fixtures

TOTAL = 12 * 5_000  # rows: twelve batches of 5,000
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


def _lake_config(
    path: Path, bus: Bus, s3: S3Server, catalog_uri: str
) -> tuple[Path, IcebergConfig]:
    write_config(path, bus, batch_max_rows=5_000, batch_max_ms=10_000, session_timeout_ms=6_000)
    iceberg = IcebergConfig(
        catalog_uri=catalog_uri,
        warehouse=f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}",
        s3_endpoint=s3.endpoint,
        credentials_file=s3.credentials_file(path.with_name("credentials")),
    )
    config = yaml.safe_load(path.read_text())
    config["store"] = {"lake": "iceberg", "iceberg": iceberg.model_dump(mode="json")}
    path.write_text(yaml.safe_dump(config))
    return path, iceberg


@pytest.mark.slow
@pytest.mark.parametrize("members", [2, 3], ids=["two ingesters", "three ingesters"])
def test_a_member_killed_after_its_iceberg_commit_doubles_nothing_in_the_table(
    wide_bus: Bus, s3_server: S3Server, postgres: str, tmp_path: Path, members: int
) -> None:
    bus = wide_bus
    config, iceberg = _lake_config(tmp_path / "llmslo.yaml", bus, s3_server, postgres)
    group_id = yaml.safe_load(config.read_text())["ingest"]["group_id"]
    dbs = [tmp_path / f"member-{i}.duckdb" for i in range(members)]
    logs = [tmp_path / f"member-{i}.log" for i in range(members)]
    # Member 0 dies right after its 3rd commit (Iceberg, then DuckDB), before Kafka's.
    doomed = start_ingest(
        config, dbs[0], logs[0], "--exit-when-idle", "120", crash_after_commit=CRASH_AFTER_COMMIT
    )
    wait_for_log(doomed, logs[0], "starts at offset")
    produce_numbered(bus, total=FIRST_PHASE, per_message=500)
    time.sleep(3)  # member 0 commits them (two batches) alone
    others = []
    for i in range(1, members):  # they join mid-stream: partitions move
        others.append(start_ingest(config, dbs[i], logs[i], "--exit-when-idle", "45"))
        wait_for_log(others[-1], logs[i], "starts at offset")
    produce_numbered(bus, total=TOTAL - FIRST_PHASE, per_message=500, first=FIRST_PHASE)
    doomed.wait(timeout=180)
    assert doomed.returncode == -signal.SIGKILL, logs[0].read_text()[-2000:]
    assert f"crashing after DuckDB commit {CRASH_AFTER_COMMIT}" in logs[0].read_text()
    for process, log in zip(others, logs[1:], strict=True):
        out, _ = process.communicate(timeout=240)
        assert process.returncode == 0, log.read_text()[-2000:]
        assert json.loads(out.decode().strip().splitlines()[-1])["ingest"] == "stopped"
    lake = IcebergLake(iceberg, group_id=group_id, topics=lake_topics(bus.prefix))
    values = lake.table("engine_samples").scan(selected_fields=("value",)).to_arrow()["value"]
    assert len(values) == TOTAL  # nothing doubled (the killed member's last batch included)…
    assert sorted(values.to_pylist()) == [float(v) for v in range(TOTAL)]  # …nothing lost
    # The table's offsets say the group stands where the log ends (every message read).
    offsets = lake.read_offsets()
    assert sum(o.next_offset for o in offsets.values()) == TOTAL // 500
