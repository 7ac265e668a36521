"""The ingester's batches are bounded in bytes, not only in rows (what bounds its RSS)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.bus import Bus
from pipeline.codec import headers_for
from pipeline.config import INGEST_BASELINE_MB, IngestConfig
from pipeline.ingest import Ingester
from pipeline.schema import ENGINE_SAMPLES
from pipeline.store import Store
from tests.pipeline.ingest_helpers import produce_numbered

MiB = 1024 * 1024


def _unbounded_but_bytes(bus: Bus, batch_max_bytes: int) -> IngestConfig:
    # Rows and age never make a batch due here: only its size in bytes can.
    return IngestConfig(
        group_id=bus.prefix,
        batch_max_rows=10**9,
        batch_max_ms=10**9,
        batch_max_bytes=batch_max_bytes,
    )


def test_a_batch_is_committed_once_its_decoded_rows_reach_batch_max_bytes(
    bus: Bus, store: Store
) -> None:
    # 20 messages of 50,000 samples: ~3 MB each once decoded, ~60 MB in all.
    produce_numbered(bus, total=1_000_000, per_message=50_000)
    ingester = Ingester(bus, store, _unbounded_but_bytes(bus, 8 * MiB))
    ingester.run(max_idle_s=2.0)
    assert store.count("engine_samples") == 1_000_000
    # A batch holds ≤ 2 × 8 MiB + one message while the previous commit is in flight (about
    # 5 messages), so ≥ 3 commits; one poll returning every message must not make one batch.
    assert ingester.stats.commits >= 3


def test_dead_letter_payloads_count_toward_the_batch_bytes(bus: Bus, store: Store) -> None:
    producer = bus.producer()
    for i in range(12):
        producer.send_raw(
            "engine", b"\x00" * MiB, key=f"k{i}".encode(), headers=headers_for(ENGINE_SAMPLES)
        )
    producer.flush()
    producer.close()
    ingester = Ingester(bus, store, _unbounded_but_bytes(bus, 2 * MiB))
    ingester.run(max_idle_s=2.0)
    assert store.count("deadletter") == 12
    # Batches of ≥ 2 MiB, ≤ 4 MiB while a commit is in flight: 2 + 4 + 4 < 12, so ≥ 3 commits.
    assert ingester.stats.commits >= 3


@pytest.mark.parametrize("memory_mb", [256, 512, 2048], ids=lambda mb: f"{mb} MB")
def test_memory_mb_sets_every_byte_setting_within_the_budget(memory_mb: int) -> None:
    config = IngestConfig(memory_mb=memory_mb)
    duckdb_bytes = int(config.duckdb_memory_limit.removesuffix("MB")) * 1_000_000
    held = (
        INGEST_BASELINE_MB * MiB
        + config.fetch_max_bytes
        + 4 * config.batch_max_bytes  # two batches in hand at twice the limit each
        + duckdb_bytes
    )
    assert held <= memory_mb * MiB
    assert config.max_decoded_bytes <= 4 * config.batch_max_bytes


def test_a_smaller_budget_gives_smaller_settings_and_explicit_ones_win() -> None:
    small, default = IngestConfig(memory_mb=256), IngestConfig()
    assert default.memory_mb == 512
    assert small.fetch_max_bytes < default.fetch_max_bytes
    assert small.batch_max_bytes < default.batch_max_bytes
    assert small.max_decoded_bytes < default.max_decoded_bytes
    explicit = IngestConfig(memory_mb=256, batch_max_bytes=8 * MiB, duckdb_memory_limit="1GB")
    assert (explicit.batch_max_bytes, explicit.duckdb_memory_limit) == (8 * MiB, "1GB")


def test_a_budget_below_the_baseline_is_refused() -> None:
    with pytest.raises(ValidationError, match="memory_mb"):
        IngestConfig(memory_mb=100)
