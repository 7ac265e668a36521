"""Stored offsets know the log they index: a new log (the embedded broker's log lost
between runs, a topic deleted and re-created) is read from its beginning, logged and
counted, never skipped; the same log kept across a restart is resumed."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import duckdb
from kafka.admin import KafkaAdminClient, NewTopic

from pipeline.broker import free_port
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.ingest import BEYOND_END_RECHECK_S
from pipeline.schema import ENGINE_SAMPLES
from tests.pipeline.ingest_helpers import (
    produce_numbered,
    start_ingest,
    start_run,
    wait_for_log,
    write_config,
)

RESETS = "llmslo_ingest_log_resets_total{"
ROWS = 'llmslo_ingest_rows_total{table="engine_samples"}'


def _metric(port: int, prefix: str) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.decode().splitlines()
        if line.startswith(prefix)
    )


def _wait_for_metric(port: int, prefix: str, at_least: float, timeout_s: float) -> float:
    """The metric's value once it reaches ``at_least``, or whatever it is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (value := _metric(port, prefix)) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def _stored(db: Path) -> tuple[int, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT count(*), count(DISTINCT value) FROM engine_samples").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _stored_partitions(db: Path, topic: str | None = None) -> int:
    query = "SELECT count(*) FROM ingest_offsets" + (" WHERE topic = ?" if topic else "")
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute(query, [topic] if topic else []).fetchone()
    assert row is not None
    return int(row[0])


def _stop(process: subprocess.Popen[bytes], log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 0, log.read_text()[-3000:]


def _run_embedded(db: Path, log: Path, first: int, total: int) -> float:
    """``llmslo run`` on the embedded broker (its log in ``<db>.broker/``): publish ``total``
    numbered samples from ``first``, wait until ingested (or 40 s), stop it; returns the
    log resets it counted."""
    port = free_port()
    process = start_run(
        log,
        "--bootstrap-servers",
        "embedded",
        "--db",
        str(db),
        "--no-api",
        "--metrics-port",
        str(port),
    )
    wait_for_log(process, log, "starts at offset")
    found = re.search(r"embedded broker ready on tcp://(\S+)", log.read_text())
    assert found, log.read_text()[-2000:]
    with Bus(BusConfig(bootstrap_servers=found.group(1))) as bus:
        produce_numbered(bus, total=total, per_message=250, first=first)
    _wait_for_metric(port, ROWS, total, timeout_s=40)
    resets = _metric(port, RESETS)
    _stop(process, log)
    return resets


def test_a_restart_on_the_kept_embedded_log_resumes_it(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    assert _run_embedded(db, tmp_path / "run-1.log", first=0, total=6_000) == 0
    assert _stored(db) == (6_000, 6_000)
    assert (tmp_path / "r.duckdb.broker").is_dir()

    resets = _run_embedded(db, tmp_path / "run-2.log", first=6_000, total=6_000)

    # Twice the records, none twice: the second run resumed the same log where it stopped.
    assert _stored(db) == (12_000, 12_000)
    assert resets == 0
    assert "is a new log" not in (tmp_path / "run-2.log").read_text()


def test_a_restart_after_the_embedded_log_was_lost_ingests_the_new_log(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    assert _run_embedded(db, tmp_path / "run-1.log", first=0, total=6_000) == 0
    assert _stored(db) == (6_000, 6_000)
    partitions_stored = _stored_partitions(db)
    # As after a wiped volume or a move to another machine: the DuckDB file without its log.
    shutil.rmtree(tmp_path / "r.duckdb.broker")

    resets = _run_embedded(db, tmp_path / "run-2.log", first=6_000, total=6_000)

    # Twice the records, none twice: the new broker's log was read from its beginning.
    assert _stored(db) == (12_000, 12_000)
    # Every partition the first run stored offsets for belonged to the lost log.
    assert resets == partitions_stored
    logged = (tmp_path / "run-2.log").read_text().count("is a new log")
    assert logged == partitions_stored


def _recreate(bus: Bus, topic: str) -> None:
    admin = KafkaAdminClient(**bus.client_settings())
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while topic in admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} was not deleted"
            time.sleep(0.2)
        admin.create_topics([NewTopic(topic, bus.config.partitions, 1)])
    finally:
        admin.close()


def test_a_topic_re_created_while_ingesting_is_read_from_its_beginning(
    bus: Bus, tmp_path: Path
) -> None:
    topic = bus.prefix + ENGINE_SAMPLES.topic
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_ms=100)
    db, log, port = tmp_path / "ingest.duckdb", tmp_path / "ingest.log", free_port()
    process = start_ingest(config, db, log, "--metrics-port", str(port))
    wait_for_log(process, log, "starts at offset")
    produce_numbered(bus, total=10_000, per_message=250)
    assert _wait_for_metric(port, ROWS, 10_000, timeout_s=60) == 10_000

    _recreate(bus, topic)
    # More than the old log held, so a stale position inside the new log would skip some.
    produce_numbered(bus, total=15_000, per_message=250, first=10_000)
    _wait_for_metric(port, ROWS, 25_000, timeout_s=60)
    resets = _metric(port, RESETS)
    _stop(process, log)

    assert _stored(db) == (25_000, 25_000)
    assert resets == _stored_partitions(db, topic) == bus.config.partitions


def test_offsets_stored_without_an_identity_beyond_a_new_logs_end_restart_it(
    bus: Bus, tmp_path: Path
) -> None:
    """A file from before offsets carried their log (or a broker that names none) falls
    back on the end offset: a stored offset still beyond it after a re-check is a new log."""
    topic = bus.prefix + ENGINE_SAMPLES.topic
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_ms=100)
    db = tmp_path / "old.duckdb"
    produce_numbered(bus, total=8_000, per_message=250)
    first = start_ingest(config, db, tmp_path / "first.log", "--exit-when-idle", "3")
    first.communicate(timeout=120)
    assert first.returncode == 0
    with duckdb.connect(str(db)) as con:  # what an older release wrote
        con.execute("ALTER TABLE ingest_offsets DROP COLUMN IF EXISTS topic_id")
        con.execute("ALTER TABLE ingest_offsets DROP COLUMN IF EXISTS cluster_id")

    _recreate(bus, topic)
    produce_numbered(bus, total=3_000, per_message=250, first=8_000)
    log, port = tmp_path / "second.log", free_port()
    second = start_ingest(config, db, log, "--metrics-port", str(port))
    wait_for_log(second, log, "starts at offset")
    _wait_for_metric(port, ROWS, 3_000, timeout_s=40)
    resets = _metric(port, RESETS)
    _stop(second, log)

    assert _stored(db) == (11_000, 11_000)
    assert resets == bus.config.partitions


def test_offsets_stored_without_an_identity_at_the_logs_end_are_the_logs(
    bus: Bus, tmp_path: Path
) -> None:
    """The same fallback on an unchanged log reads nothing twice. The end it checks against
    is the consumer's fetch high watermark: the embedded broker answers ListOffsets with
    its last record batch's base offset + 1, short of the end when producers batch."""
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_ms=100)
    db = tmp_path / "old.duckdb"
    produce_numbered(bus, total=8_000, per_message=50)  # one flush: batched records
    first = start_ingest(config, db, tmp_path / "first.log", "--exit-when-idle", "3")
    first.communicate(timeout=120)
    assert first.returncode == 0
    assert _stored(db) == (8_000, 8_000)
    with duckdb.connect(str(db)) as con:  # what an older release wrote
        con.execute("ALTER TABLE ingest_offsets DROP COLUMN IF EXISTS topic_id")
        con.execute("ALTER TABLE ingest_offsets DROP COLUMN IF EXISTS cluster_id")

    log, port = tmp_path / "second.log", free_port()
    second = start_ingest(config, db, log, "--metrics-port", str(port))
    wait_for_log(second, log, "starts at offset")
    time.sleep(2 * BEYOND_END_RECHECK_S + 2)  # both checks are behind it
    assert _metric(port, RESETS) == 0, log.read_text()[-2000:]
    produce_numbered(bus, total=1_000, per_message=250, first=8_000)
    _wait_for_metric(port, ROWS, 1_000, timeout_s=40)
    _stop(second, log)

    assert _stored(db) == (9_000, 9_000)
