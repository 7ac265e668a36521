"""The P/D pair: the KV transfer is fast and clean when healthy; under kv_transfer_timeout
the client gets 504 before any token, timeouts and cleanups are counted, blocks may leak."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from collectors.probe import ProbeConfig, Prober
from pipeline.errors import ConfigError
from pipeline.schema import RecordSchema
from simulator import Fleet, FleetConfig, PodConfig
from simulator.pd import PdPair
from tests.simulator.test_gateway import metric

LABELS = {"model_name": "llama-3-8b", "engine": "0"}


@pytest.fixture(scope="module")
def pair() -> Iterator[PdPair]:
    with Fleet(FleetConfig(pods=[PodConfig(name="prefill"), PodConfig(name="decode")])) as fleet:
        pd = PdPair(fleet.pods[0].url, fleet.pods[1].url)
        fleet.call(pd.start())
        pd.fleet = fleet  # type: ignore[attr-defined]
        yield pd
        fleet.call(pd.stop())


def _probe(url: str, rounds: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def sink(schema: RecordSchema, table: pa.Table) -> None:
        rows.extend(table.to_pylist())

    asyncio.run(
        Prober(ProbeConfig(url=url, interval_s=0.01, max_tokens=4, timeout_s=timeout_s), sink).run(
            rounds=rounds
        )
    )
    return rows


def test_a_healthy_pair_streams_and_transfers_fast_with_nothing_timed_out(pair: PdPair) -> None:
    rows = _probe(pair.url, 3)
    assert [r["outcome"] for r in rows] == ["ok"] * 3 and all(
        r["completion_tokens"] == 4 for r in rows
    )
    assert metric(pair.url, "vllm:nixl_xfer_time_seconds_count", **LABELS) == 3
    assert metric(pair.url, "vllm:nixl_xfer_time_seconds_sum", **LABELS) < 0.1
    assert metric(pair.url, "vllm:nixl_num_failed_transfers_total", **LABELS) == 0


def test_kv_transfer_timeout_fails_before_the_first_token_and_may_leak_blocks(pair: PdPair) -> None:
    fleet: Fleet = pair.fleet  # type: ignore[attr-defined]
    before = metric(pair.url, "vllm:nixl_num_failed_transfers_total", **LABELS)
    pair.set_fault("kv_transfer_timeout", {"timeout_s": 0.5, "cleanup_fail_fraction": 1.0})
    try:
        rows = _probe(pair.url, 2)
    finally:
        assert pair.clear_fault("kv_transfer_timeout")
    assert [(r["outcome"], r["error_kind"]) for r in rows] == [
        ("error_before_first_token", "http_504")
    ] * 2
    assert all(r["e2e_s"] >= 0.5 for r in rows)
    assert metric(pair.url, "vllm:nixl_num_failed_transfers_total", **LABELS) == before + 2
    assert metric(pair.url, "llmslo_sim_pd_kv_transfer_cleanup_failures_total") == 2
    assert metric(pair.url, "llmslo_sim_pd_kv_transfer_leaked_blocks") >= 2
    assert _probe(pair.url, 1)[0]["outcome"] == "ok"  # off again: served
    assert fleet.pods[1].faults.snapshot() == {}


def test_an_unknown_pd_fault_is_refused(pair: PdPair) -> None:
    with pytest.raises(ConfigError, match="unknown"):
        pair.set_fault("stall")
