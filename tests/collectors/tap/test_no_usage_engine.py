"""An engine that ignores ``stream_options.include_usage``: TPOT and ITL come from the chunks.

Several engines (and older versions) never send the usage chunk. The tap still saw every
token-bearing chunk, so N is counted from them (``tokens_source: chunks``) and TPOT and
ITL must equal what the client itself measures on the same stream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Iterator

import aiohttp
import pytest

from simulator import EngineConfig, Fleet, FleetConfig, NodeConfig, PodConfig
from tests.collectors.tap.fakes import tap_over

MODEL = "llama-3-8b"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    engines = {
        "no-usage": EngineConfig(honours_include_usage=False),
        "usage": EngineConfig(),
    }
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=2)],
        pods=[
            PodConfig(name=name, model=MODEL, node="node-0", gpus=[i], engine=engine)
            for i, (name, engine) in enumerate(engines.items())
        ],
        speed=2.0,
        seed=3,
    )
    with Fleet(config) as running:
        yield running


async def client_timed_stream(url: str, tokens: int) -> tuple[bytes, list[float]]:
    """Stream a chat; returns the body and when each token-bearing event arrived (perf s)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    arrivals: list[float] = []
    received = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        pending = b""
        async for piece in resp.content.iter_any():
            now = time.perf_counter()
            received += piece
            pending += piece
            *events, pending = pending.split(b"\n\n")
            for event in events:
                data = event.removeprefix(b"data: ")
                if data == b"[DONE]" or not data.startswith(b"{"):
                    continue
                choices = json.loads(data).get("choices") or []
                if any((c.get("delta") or {}).get("content") for c in choices):
                    arrivals.append(now)
    return received, arrivals


def test_tpot_and_itl_from_chunks_equal_what_the_client_measures(fleet: Fleet) -> None:
    pod = fleet.pod("no-usage")

    async def scenario() -> None:
        async with tap_over([pod.url]) as (url, sink, _):
            received, arrivals = await client_timed_stream(url, 40)
        assert b'"usage"' not in received  # the engine really sent none
        [row] = sink.requests
        assert row["outcome"] == "ok" and row["tokens_source"] == "chunks"
        assert row["completion_tokens"] == len(arrivals) == row["token_chunks"] == 40
        client_tpot = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
        client_gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert row["tpot_s"] == pytest.approx(client_tpot, rel=0.05, abs=0.002)
        # every gap as read (the summary columns keep those the tap can vouch for)
        gaps = row["itl_gaps_s"]
        assert len(gaps) == len(client_gaps) and row["itl_count"] <= len(client_gaps)
        assert statistics.fmean(gaps) == pytest.approx(statistics.fmean(client_gaps), abs=0.002)
        assert statistics.median(gaps) == pytest.approx(statistics.median(client_gaps), abs=0.003)

    asyncio.run(scenario())


def test_an_engine_that_sends_usage_is_measured_from_usage(fleet: Fleet) -> None:
    pod = fleet.pod("usage")

    async def scenario() -> None:
        async with tap_over([pod.url]) as (url, sink, _):
            received, arrivals = await client_timed_stream(url, 12)
        assert b'"usage"' not in received  # the tap asked for it and stripped it again
        [row] = sink.requests
        assert (row["tokens_source"], row["completion_tokens"]) == ("usage", 12)
        assert row["tpot_s"] == pytest.approx(
            (arrivals[-1] - arrivals[0]) / 11, rel=0.05, abs=0.002
        )

    asyncio.run(scenario())
