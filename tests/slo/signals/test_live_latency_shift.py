"""Slow prefill, slow decode and a hot instance by tokens on live data: simulator pods
behind the real stream tap (one tap per pod, so the test decides where each request goes),
its request records into DuckDB, the detectors on them. Each mode is found on the faulty pod
only, and the same traffic against a healthy fleet finds nothing."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

import pytest

import simulator
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from slo.signals.detectors import DetectorConfig, detect_all
from slo.signals.snapshot import load_snapshot
from tests.collectors.tap.fakes import post, tap_over
from tests.slo.factories import to_table

MODEL = "llama-3-8b"
PER_POD = 30


def _chat(rng: random.Random, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * rng.randint(1200, 1600)}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


def _records(fleet: simulator.Fleet, max_tokens: list[int]) -> list[dict[str, Any]]:
    """PER_POD streamed requests to each pod, through its own tap (8 in flight in all)."""
    rng = random.Random(4)

    async def scenario() -> list[dict[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            taps = [await stack.enter_async_context(tap_over([p.url])) for p in fleet.pods]
            gate = asyncio.Semaphore(8)

            async def one(index: int) -> None:
                async with gate:
                    body = _chat(rng, max_tokens[index])
                    status, _, error = await post(taps[index][0], body)
                    assert (status, error) == (200, None)

            order = [i for _ in range(PER_POD) for i in range(len(taps))]
            await asyncio.gather(*(one(i) for i in order))
            return [row for _, sink, _ in taps for row in sink.requests]

    return asyncio.run(scenario())


def _findings(
    tmp_path: Any, setup: Callable[[simulator.Fleet], None], max_tokens: list[int]
) -> dict[str, set[str]]:
    node = simulator.NodeConfig(name="node-0", gpus=4)
    pods = [
        simulator.PodConfig(name=f"pod-{i}", dialect="vllm", model=MODEL, node="node-0", gpus=[i])
        for i in range(4)
    ]
    config = simulator.FleetConfig(nodes=[node], pods=pods, speed=2.0, seed=9)
    with simulator.Fleet(config) as fleet:
        setup(fleet)
        rows = _records(fleet, max_tokens)
        names = {p.instance: p.name for p in fleet.pods}
    with Store(tmp_path / "tap.duckdb") as store:
        table = to_table(REQUEST_RECORDS, rows)
        store.commit_batch({"requests": [table]}, group_id="t", offsets={}, now_ts_ms=0)
        # a lookback that just holds the run, so both of its halves see traffic
        first, last = (f(r["received_ts_ms"] for r in rows) for f in (min, max))
        lookback_ms = last - first + 2_000
        snap = load_snapshot(store.con, last + 1_000, lookback_ms)
        found: dict[str, set[str]] = {}
        for f in detect_all(snap, DetectorConfig(lookback_s=lookback_ms / 1000)):
            found.setdefault(f.signal, set()).add(names.get(f.scope_id, f.scope_id))
    return found


@pytest.mark.slow
def test_slow_prefill_slow_decode_and_hot_tokens_are_found_on_their_pod_only(
    tmp_path: Any,
) -> None:
    def faults(fleet: simulator.Fleet) -> None:
        fleet.set_fault("pod-1", "slow_prefill", factor=4.0)
        fleet.set_fault("pod-2", "slow_decode", factor=3.0)

    # pod-3 serves as many requests as the others, with 6× the output tokens
    found = _findings(tmp_path / "faulty", faults, [24, 24, 24, 144])
    hot = found.get("hot_instance")
    assert hot == {"pod-3"}
    assert found.get("slow_prefill") == {"pod-1"}
    # the simulator prefills whole prompts in one step (no chunked prefill yet), so a slow
    # prefill also stalls the decode of the requests beside it, as on a real engine without
    # chunked prefill: pod-1's TPOT may shift too. The healthy pods never.
    assert "pod-2" in found.get("slow_decode", set())
    assert found["slow_decode"] <= {"pod-1", "pod-2"}
    # Likewise the long prefill steps interleaved with decodes widen pod-1's ITL tail: the
    # stutter itl_jitter looks for. Longer streams alone (pod-3) never raise it.
    assert found.get("itl_jitter", set()) <= {"pod-1", "pod-2"}
    assert set(found) - {"itl_jitter"} == {"hot_instance", "slow_prefill", "slow_decode"}
    healthy = _findings(tmp_path / "healthy", lambda _: None, [24, 24, 24, 24])
    assert healthy == {}
