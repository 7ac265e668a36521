"""Helpers to produce numbered samples and to run ``llmslo ingest`` as a real process."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from pipeline.bus import Bus
from pipeline.schema import ENGINE_SAMPLES


def numbered_samples(first: int, count: int, instance: str) -> pa.Table:
    """``count`` engine samples whose ``value`` is a unique sequence number from ``first``."""
    seq = np.arange(first, first + count, dtype=np.int64)
    return pa.table(
        {
            "ts_ms": seq,
            "instance": pa.array([instance] * count).dictionary_encode(),
            "metric": pa.array(["vllm:num_requests_running"] * count).dictionary_encode(),
            "signal": pa.array(["running"] * count).dictionary_encode(),
            "kind": pa.array(["gauge"] * count).dictionary_encode(),
            "value": seq.astype(np.float64),
        }
    )


def produce_numbered(
    bus: Bus, total: int, per_message: int, instances: int = 8, first: int = 0
) -> None:
    """Produce samples numbered ``first`` … ``first + total - 1``, ``per_message`` per message."""
    producer = bus.producer()
    for start in range(first, first + total, per_message):
        count = min(per_message, first + total - start)
        instance = f"pod-{(start // per_message) % instances}"
        producer.publish(ENGINE_SAMPLES, numbered_samples(start, count, instance))
    producer.flush()
    producer.close()


def write_config(path: Path, bus: Bus, **ingest: object) -> Path:
    # Each test gets its own consumer group: members of another test's group (even dead
    # ones, until their session times out) would otherwise join its rebalances.
    config = {
        "bus": {
            "bootstrap_servers": bus.bootstrap_servers,
            "topic_prefix": bus.prefix,
            "partitions": bus.config.partitions,
        },
        "ingest": {"group_id": f"group-{uuid.uuid4().hex[:8]}", **ingest},
    }
    path.write_text(yaml.safe_dump(config))
    return path


ROOT = Path(__file__).resolve().parents[2]
ENTRY = "tests.pipeline.crashing_ingest"

#: Every ingest process a test started; tests/pipeline/conftest.py kills survivors.
STARTED: list[subprocess.Popen[bytes]] = []


def start_ingest(
    config: Path, db: Path, log: Path, *extra: str, crash_after_commit: int | None = None
) -> subprocess.Popen[bytes]:
    """``llmslo -v ingest`` as a child process, its INFO log written to ``log``.

    With ``crash_after_commit`` the child SIGKILLs itself right after that DuckDB commit,
    before Kafka hears of it (:mod:`tests.pipeline.crashing_ingest`).
    """
    entry = ["llmslo"] if crash_after_commit is None else [ENTRY, str(crash_after_commit)]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                *entry,
                "-v",
                "ingest",
                "-c",
                str(config),
                "--db",
                str(db),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=sink,
            cwd=ROOT,  # so that ``-m tests.…`` finds the test package
        )
    STARTED.append(process)
    return process


def start_run(log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``llmslo -v run ARGS`` as a child process, its INFO log written to ``log``."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmslo", "-v", "run", *args],
            stdout=subprocess.PIPE,
            stderr=sink,
            cwd=ROOT,
        )
    STARTED.append(process)
    return process


def wait_for_log(
    process: subprocess.Popen[bytes], log: Path, needle: str, timeout_s: float = 120.0
) -> None:
    """Wait until the child's log holds ``needle``; fail if it exits or times out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise AssertionError(
                f"{log.name}: exited ({process.returncode}) before logging {needle!r}{_tail(log)}"
            )
        time.sleep(0.05)
    raise AssertionError(f"{log.name}: {needle!r} not logged within {timeout_s} s{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    """The log's last lines, for a failure message (what the child was doing instead)."""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return "\n--- last lines of " + log.name + " ---\n" + "\n".join(text)
