"""End to end on the simulator: simulated vLLM pods → the real tap → DuckDB → verdict API.

One baseline pod and one canary pod get the same streaming load through their own taps.
A canary with ``slow_prefill`` injected must fail with TTFT High (Flagger: 412); a healthy
canary must pass (Flagger: 200). Sample floors are lowered so the test stays short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.judge import JudgeConfig
from api.service import ApiConfig
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from simulator import Fleet, FleetConfig, NodeConfig, PodConfig
from tests.api.conftest import TOKEN
from tests.collectors.tap.fakes import post, tap_over
from tests.slo.factories import to_table

MODEL = "llama-3-8b"
REQUESTS_PER_POD = 60
CONCURRENCY = 6
#: A long prompt, so prefill is most of TTFT (as for real chat prompts), not step overhead.
PROMPT_WORDS = 600


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=2)],
        pods=[
            PodConfig(name=f"pod-{i}", dialect="vllm", model=MODEL, node="node-0", gpus=[i])
            for i in (0, 1)
        ],
        speed=5.0,
        seed=1,
    )
    with Fleet(config) as running:
        yield running


def _drive(fleet: Fleet) -> list[dict]:
    """The same load on both pods, each through its own tap; returns every record."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there " * PROMPT_WORDS}],
        "stream": True,
        "max_tokens": 12,
        "ignore_eos": True,
    }

    async def one_pod(pod_url: str) -> list[dict]:
        async with tap_over([pod_url]) as (url, sink, _):
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one() -> None:
                async with gate:
                    status, _, error = await post(url, body)
                    assert (status, error) == (200, None)

            await asyncio.gather(*(one() for _ in range(REQUESTS_PER_POD)))
            return list(sink.requests)

    async def both() -> list[dict]:
        parts = await asyncio.gather(*(one_pod(pod.url) for pod in fleet.pods))
        return [row for part in parts for row in part]

    return asyncio.run(both())


def _verdict(tmp_path: Path, rows: list[dict], fleet: Fleet) -> tuple[int, dict]:
    judge = JudgeConfig(min_requests=40)
    judge = judge.model_copy(
        update={
            "metrics": {
                name: cfg.model_copy(update={"min_samples": 40})
                for name, cfg in judge.metrics.items()
            }
        }
    )
    with Store(tmp_path / "e2e.duckdb") as store:
        store.commit_batch(
            {"requests": [to_table(REQUEST_RECORDS, rows)]},
            group_id="e2e",
            offsets={},
            now_ts_ms=0,
        )
        app = create_app(store.con.cursor, ApiConfig(judge=judge), token=TOKEN)
        payload = {
            "name": "llama",
            "namespace": "inference",
            "phase": "Progressing",
            "checksum": "abc",
            "metadata": {
                "token": TOKEN,
                "canary_instances": fleet.pods[1].instance,
                "baseline_instances": fleet.pods[0].instance,
                "window": "10m",
            },
        }
        with TestClient(app) as client:
            response = client.post("/api/v1/flagger/rollout", json=payload)
    return response.status_code, response.json()


@pytest.mark.slow
def test_a_canary_with_slow_prefill_fails_on_ttft(fleet: Fleet, tmp_path: Path) -> None:
    fleet.set_fault("pod-1", "slow_prefill", factor=3.0)
    try:
        rows = _drive(fleet)
    finally:
        fleet.clear_fault("pod-1", "slow_prefill")
    status, body = _verdict(tmp_path, rows, fleet)
    assert status == 412, body
    assert body["verdict"] == "fail"
    assert body["metrics"]["ttft_s"] == "High"
    assert body["canaryRequests"] == body["baselineRequests"] == REQUESTS_PER_POD


@pytest.mark.slow
def test_a_healthy_canary_passes(fleet: Fleet, tmp_path: Path) -> None:
    status, body = _verdict(tmp_path, _drive(fleet), fleet)
    assert status == 200, body
    assert body["verdict"] == "pass"
