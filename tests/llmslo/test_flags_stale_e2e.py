"""The SLO jobs die while Kafka stays up: the taps fail open and the API says stale.

``llmslo run``'s own wiring (:class:`llmslo.run.Pipeline`: ingester and jobs over one
DuckDB file, on the real embedded broker), the HTTP API over that file and an in-process
tap following the ``flags`` topic. A pool is at L2, the jobs heartbeat every 0.5 s; then
the jobs stop (the ingester and the broker do not) and the test measures the staleness
timeline: jobs death → API ``stale`` → tap at L0 (``fail_open``). Staleness 3 s instead
of 60 s.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from api.app import create_app
from api.service import ApiConfig
from collectors.tap import ListSink, TapConfig, TapProxy
from collectors.tap.degradation import FlagFollower
from collectors.tap.flagsource import KafkaFlagSource
from llmslo.run import Pipeline, load_model
from llmslo.sections import parse_config
from pipeline.bus import Bus
from pipeline.schema import ENGINE_SAMPLES, FLAG_TRANSITIONS
from slo.flags import FlagTransition, transitions_table
from tests.collectors.tap.fakes import ScriptedUpstream, stream_script
from tests.pipeline.ingest_helpers import numbered_samples

POOL = "llama"
STALENESS_S = 3.0
INTERVAL_S = 0.5
LONG_BODY = (
    b'{"model":"m","stream":true,"messages":[{"role":"user","content":"' + (b"x" * 70_000) + b'"}]}'
)


async def ask(url: str) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url + "/v1/chat/completions",
            data=LONG_BODY,
            headers={"content-type": "application/json"},
        ) as resp,
    ):
        await resp.read()
        return resp.status


def test_jobs_death_with_kafka_up_fails_taps_open_and_the_api_says_stale(
    bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = parse_config(
        {
            "bus": bus.config.model_dump(),
            "store": {"path": str(tmp_path / "run.duckdb")},
            "slo": {"interval_s": INTERVAL_S},
        },
        source="test",
    )
    producer = bus.producer()
    producer.publish(ENGINE_SAMPLES, numbered_samples(int(time.time() * 1000), 1, "pod-0"))
    level_2 = FlagTransition(
        int(time.time() * 1000), "pool", POOL, POOL, 0, 2, 0.03, "kv_free_below_l2", {}
    )
    producer.publish(FLAG_TRANSITIONS, transitions_table([level_2]))
    producer.flush(10)
    producer.close()
    pipeline = Pipeline(config, load_model(None)).start()
    api = create_app(
        pipeline.store.con.cursor,
        ApiConfig(flags_tick_s=0.1, flags_staleness_s=STALENESS_S),
        token="t",
    )
    registry = CollectorRegistry()
    follower = FlagFollower(
        KafkaFlagSource(bus, probe_timeout_s=1.0),
        poll_s=0.2,
        staleness_s=STALENESS_S,
        registry=registry,
    ).start()

    async def scenario(client: TestClient) -> dict[str, float]:
        upstream = ScriptedUpstream(lambda _: stream_script(2))
        tap_config = TapConfig(
            listen="127.0.0.1:0",
            upstreams=[await upstream.start()],
            kafka=False,
            pool=POOL,
            degradation={"follow_flags": True, "staleness_s": STALENESS_S},
        )
        sink = ListSink()
        proxy = TapProxy(tap_config, sink, flags=follower.current)
        url = f"http://127.0.0.1:{await proxy.start()}"
        try:
            deadline = time.monotonic() + 30
            while (await ask(url)) != 429:  # heartbeats arrive: the tap sheds at L2
                assert time.monotonic() < deadline, "the tap never enforced L2"
                await asyncio.sleep(0.1)
            deadline = time.monotonic() + 30
            while (body := client.get("/api/v1/flags").json())["stale"]:
                assert time.monotonic() < deadline, "the API never answered fresh"
                await asyncio.sleep(0.1)
            assert [r["to_level"] for r in body["data"]] == [2]
            last_beat_s = time.time()
            await asyncio.to_thread(pipeline.final_cycle)  # the jobs stop; ingest and Kafka stay
            died_s = time.monotonic()
            timeline: dict[str, float] = {}
            while len(timeline) < 2:
                elapsed = time.monotonic() - died_s
                assert elapsed < STALENESS_S + 10, f"not stale after {elapsed:.1f} s: {timeline}"
                if "api" not in timeline and client.get("/api/v1/flags").json()["stale"]:
                    timeline["api"] = elapsed
                if "tap" not in timeline and (await ask(url)) == 200:
                    timeline["tap"] = elapsed
                await asyncio.sleep(0.05)
            assert sink.requests[-1]["enforced_action"] == "fail_open"
            assert pipeline.ingester is not None and not pipeline._stopping.is_set()
            answer = client.get("/api/v1/flags").json()
            assert (answer["stale_reason"], [r["to_level"] for r in answer["data"]]) == (
                "heartbeat_old",
                [2],
            )
            timeline["since_last_beat_s"] = time.time() - last_beat_s
            return timeline
        finally:
            await proxy.stop()
            await upstream.stop()

    try:
        with TestClient(api) as client:
            timeline = asyncio.run(scenario(client))
    finally:
        follower.stop()
        pipeline.stop()
    # Within staleness_s (+ one jobs interval, + the API tick / the tap's poll).
    assert STALENESS_S - INTERVAL_S <= timeline["api"] <= STALENESS_S + INTERVAL_S + 1.0
    assert STALENESS_S - INTERVAL_S <= timeline["tap"] <= STALENESS_S + INTERVAL_S + 1.0
    assert registry.get_sample_value("llmslo_tap_flags_stale", {"reason": "heartbeat_old"}) == 1
    assert (
        registry.get_sample_value(
            "llmslo_tap_flags_stale_transitions_total", {"reason": "heartbeat_old"}
        )
        == 1
    )
    with capsys.disabled():
        print(f"\nstaleness timeline (s after jobs death): {timeline}")
