"""Failure detectors on live data: simulator pods behind the real stream tap (one tap per pod), the
taps' records and in-flight gauges and the real collector's scrapes in DuckDB, the
detectors on them.

- a pod failing before the first token raises ``prefill_failure`` there, a pod cutting
  streams after three tokens raises ``stream_interrupted`` there; a healthy pod and a
  healthy pod whose clients hang up mid-stream raise nothing, and one pod's retries are no
  pool ``retry_storm``;
- clients that leave after 1 s: the pod with the ``ghost`` fault (the engine keeps
  generating) raises ``ghost_requests``, the healthy pod with the same clients (its engine
  aborts) does not. The tap publishes its gauge every second and the collector scrapes every
  0.5 s, so no engine sample and tap sample share a timestamp.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pyarrow as pa
import pytest

import simulator
from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS, RecordSchema
from pipeline.store import Store
from slo.signals.detectors import DetectorConfig, detect_all
from slo.signals.snapshot import load_snapshot
from tests.collectors.tap.fakes import post, tap_over
from tests.slo.factories import to_table

MODEL = "llama-3-8b"


def _fleet(names: list[str], speed: float) -> simulator.Fleet:
    node = simulator.NodeConfig(name="node-0", gpus=len(names))
    pods = [
        simulator.PodConfig(name=name, dialect="vllm", model=MODEL, node="node-0", gpus=[i])
        for i, name in enumerate(names)
    ]
    return simulator.Fleet(simulator.FleetConfig(nodes=[node], pods=pods, speed=speed, seed=3))


def _chat(max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 200}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


async def _leave_after(url: str, body: dict[str, Any], *, chunks: int = 0, seconds: float = 0):
    """Read a stream until ``chunks`` body pieces or ``seconds`` have passed, then hang up."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body) as resp,
    ):
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        seen = 0
        async for _ in resp.content.iter_any():
            seen += 1
            if (chunks and seen >= chunks) or (seconds and loop.time() >= until):
                break
        resp.close()  # the connection goes: the tap sees a client disconnect


def _findings(
    engine: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    names: dict[str, str],
    cfg: DetectorConfig,
    tmp_path: Any,
) -> dict[str, set[str]]:
    with Store(tmp_path / "live.duckdb") as store:
        tables = {"requests": [to_table(REQUEST_RECORDS, requests)]}
        if engine:
            tables["engine_samples"] = [to_table(ENGINE_SAMPLES, engine)]
        store.commit_batch(tables, group_id="t", offsets={}, now_ts_ms=0)
        last = max(r["received_ts_ms"] for r in requests)
        if engine:
            last = max(last, max(r["ts_ms"] for r in engine))
        snap = load_snapshot(store.con, last + 1_000, int(cfg.lookback_s * 1000))
        found: dict[str, set[str]] = {}
        for f in detect_all(snap, cfg):
            found.setdefault(f.signal, set()).add(names.get(f.scope_id, f.scope_id))
    return found


@pytest.mark.slow
def test_prefill_failure_and_cut_streams_are_found_on_their_pod_only(tmp_path: Any) -> None:
    names = ["healthy", "prefill", "cut", "cancels"]
    per_pod = 30
    with _fleet(names, speed=2.0) as fleet:
        fleet.set_fault("prefill", "prefill_failure", fraction=0.4)
        fleet.set_fault("cut", "failure_after_first_token", fraction=0.4, after_tokens=3)

        async def scenario() -> list[dict[str, Any]]:
            async with contextlib.AsyncExitStack() as stack:
                taps = [await stack.enter_async_context(tap_over([p.url])) for p in fleet.pods]
                gate = asyncio.Semaphore(8)

                async def one(index: int) -> None:
                    async with gate:
                        if names[index] == "cancels":  # the client leaves after a few chunks
                            await _leave_after(taps[index][0], _chat(24), chunks=3)
                        else:
                            await post(taps[index][0], _chat(24))

                await asyncio.gather(*(one(i) for _ in range(per_pod) for i in range(4)))
                return [row for _, sink, _ in taps for row in sink.requests]

        rows = asyncio.run(scenario())
        by_instance = {p.instance: p.name for p in fleet.pods}
    outcomes = {(by_instance[r["instance"]], r["outcome"]) for r in rows}
    assert ("cancels", "client_cancelled") in outcomes  # the control is what it says
    span_s = (max(r["received_ts_ms"] for r in rows) - min(r["received_ts_ms"] for r in rows)) / 1e3
    # failures are judged over the second half of the lookback: let that half hold the run
    found = _findings([], rows, by_instance, DetectorConfig(lookback_s=2 * (span_s + 5)), tmp_path)
    assert found.get("prefill_failure") == {"prefill"}
    assert found.get("stream_interrupted") == {"cut"}
    assert "retry_storm" not in found
    everything = set().union(*found.values())
    assert not everything & {"healthy", "cancels"}


Scenario = Callable[[list[str]], Awaitable[None]]


@pytest.mark.slow
def test_ghosts_are_found_on_the_pod_whose_engine_keeps_generating_only(tmp_path: Any) -> None:
    names = ["ghost", "healthy"]
    seconds = 14
    engine: list[dict[str, Any]] = []
    with _fleet(names, speed=1.0) as fleet:
        fleet.set_fault("ghost", "ghost")

        def sink(schema: RecordSchema, table: pa.Table) -> None:
            if schema.table == "engine_samples":
                engine.extend(table.to_pylist())

        async def scenario() -> list[dict[str, Any]]:
            collect = CollectConfig(
                targets=[TargetConfig(url=p.url) for p in fleet.pods],
                interval_s=0.5,
                jitter_s=0,
                timeout_s=2.0,
            )
            collector = asyncio.create_task(Collector(collect, sink).run(rounds=seconds * 2))
            async with contextlib.AsyncExitStack() as stack:
                taps = [
                    await stack.enter_async_context(tap_over([p.url], gauge_interval_s=1.0))
                    for p in fleet.pods
                ]
                rng = random.Random(7)
                clients = []
                loop = asyncio.get_running_loop()
                end = loop.time() + seconds - 3
                while loop.time() < end:  # 2 new clients a second per pod, each gone after 1 s
                    for url, _, _ in taps:
                        clients.append(
                            asyncio.create_task(_leave_after(url, _chat(300), seconds=1.0))
                        )
                    await asyncio.sleep(rng.expovariate(2.0))
                await asyncio.gather(*clients, return_exceptions=True)
                await collector
                return [r for _, s, _ in taps for r in s.requests] + [
                    r for _, s, _ in taps for r in s.samples
                ]

        rows = asyncio.run(scenario())
        by_instance = {p.instance: p.name for p in fleet.pods}
    requests = [r for r in rows if "request_id" in r]
    engine += [r for r in rows if "request_id" not in r]
    for instance in by_instance:  # the point: scrapes and tap gauges rarely coincide
        running = {
            r["ts_ms"] for r in engine if (r["instance"], r["signal"]) == (instance, "running")
        }
        tap = {
            r["ts_ms"]
            for r in engine
            if (r["instance"], r["signal"]) == (instance, "tap_in_flight")
        }
        assert len(running & tap) < len(running) / 4
    found = _findings(engine, requests, by_instance, DetectorConfig(lookback_s=30), tmp_path)
    assert found.get("ghost_requests") == {"ghost"}
    assert "healthy" not in set().union(*found.values())
