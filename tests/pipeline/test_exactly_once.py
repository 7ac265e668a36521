"""Nothing lost, nothing doubled: SIGKILL at random moments, and two ingesters in one group."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import duckdb
import pytest

from pipeline.bus import Bus
from tests.pipeline.ingest_helpers import produce_numbered, start_ingest, wait_for_log, write_config

TOTAL = 200_000


def _produce_slowly(bus: Bus, total: int, per_message: int, seconds: float) -> threading.Thread:
    """Produce ``total`` numbered samples spread over about ``seconds`` in a background thread."""

    def run() -> None:
        steps = 20
        for step in range(steps):
            first = step * total // steps
            count = (step + 1) * total // steps - first
            produce_numbered(bus, total=count, per_message=per_message, first=first)
            time.sleep(seconds / steps)

    thread = threading.Thread(target=run, name="producer")
    thread.start()
    return thread


def _stored_values(*dbs: Path) -> tuple[int, int, float, float]:
    con = duckdb.connect()
    union = " UNION ALL ".join(
        f"SELECT value FROM read_db_{i}.engine_samples" for i in range(len(dbs))
    )
    for i, db in enumerate(dbs):
        con.execute(f"ATTACH '{db}' AS read_db_{i} (READ_ONLY)")
    row = con.execute(
        f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM ({union})"
    ).fetchone()
    assert row is not None
    return row


def _finish(process, log: Path) -> dict:
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, log.read_text()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_doubles_nothing(bus: Bus, tmp_path: Path) -> None:
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_rows=3_000, batch_max_ms=50)
    db = tmp_path / "crash.duckdb"
    rng = random.Random(20261129)
    # Production lasts about as long as the kill loop: each restart rejoins the group in
    # ~10 s (the embedded broker holds a JoinGroup 5 s and a SyncGroup 3 s, static membership
    # or not); the last kills may come after ingest caught up (the check below allows it).
    producer = _produce_slowly(bus, TOTAL, per_message=500, seconds=90)
    stored_after_kill = []
    for attempt in range(8):
        log = tmp_path / f"ingest-{attempt}.log"
        process = start_ingest(config, db, log, "--instance-id", "crash-test")
        wait_for_log(process, log, "starts at offset")
        time.sleep(rng.uniform(0.05, 2.5))  # somewhere in fetch, decode or a DuckDB commit
        process.send_signal(signal.SIGKILL)
        process.wait()
        stored_after_kill.append(_stored_values(db)[0] if db.exists() else 0)
    producer.join()
    log = tmp_path / "ingest-final.log"
    final = start_ingest(config, db, log, "--instance-id", "crash-test", "--exit-when-idle", "4")
    _finish(final, log)

    count, distinct, low, high = _stored_values(db)
    assert (count, distinct, low, high) == (TOTAL, TOTAL, 0, TOTAL - 1)
    # The kills landed while ingest was under way, not before it started or after it ended.
    progress = [n for n in stored_after_kill if 0 < n < TOTAL]
    assert len(set(progress)) >= 3, stored_after_kill


@pytest.mark.slow
def test_two_ingesters_in_one_group_store_everything_exactly_once(bus: Bus, tmp_path: Path) -> None:
    config = write_config(tmp_path / "llmslo.yaml", bus, batch_max_rows=5_000, batch_max_ms=100)
    dbs = [tmp_path / "ingest-a.duckdb", tmp_path / "ingest-b.duckdb"]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    first = start_ingest(config, dbs[0], logs[0], "--exit-when-idle", "15")
    wait_for_log(first, logs[0], "starts at offset")
    produce_numbered(bus, total=50_000, per_message=500)
    # The second member joins while the first is consuming: partitions move between them.
    # (Idle exits wait 15 s: a rebalance on the embedded broker pauses consumption ~5 s.)
    second = start_ingest(config, dbs[1], logs[1], "--exit-when-idle", "15")
    wait_for_log(second, logs[1], "starts at offset")
    produce_numbered(bus, total=50_000, per_message=500, first=50_000)
    summaries = [_finish(first, logs[0]), _finish(second, logs[1])]

    assert all(summary["rows"] > 0 for summary in summaries), summaries  # both did a share
    assert _stored_values(*dbs) == (100_000, 100_000, 0, 99_999)
