"""Flags that act, end to end on the real broker: engine KV → flag state machine → Kafka
``flags`` topic → the tap's follower → 429 / fallback / fail open, against simulator pods.

The flag driver here scrapes the pod's real ``/metrics`` (``vllm:kv_cache_usage_perc``) and
feeds :class:`slo.flags.FlagBoard` — the state machine the SLO jobs run — publishing its
transitions through the jobs' own :class:`slo.sinks.BusTransitionSink`. (The collector →
ingest → jobs leg is covered by ``tests/slo/test_live_e2e.py``.) Time is compressed: dwell
2 s instead of 120 s, scrape every 0.2 s, staleness 3 s instead of 60 s.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.tap import ListSink, TapConfig, TapProxy
from collectors.tap.degradation import FlagFollower
from collectors.tap.flagsource import KafkaFlagSource
from pipeline.broker import EmbeddedBroker
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.publisher import Publisher
from simulator import EngineConfig, Fleet, FleetConfig, NodeConfig, PodConfig
from slo.flags import FlagBoard, FlagPolicy
from slo.sinks import BusTransitionSink, JobsHeartbeat

MODEL = "llama-3-8b"
SMALL_MODEL = "llama-3.2-1b"  # the small-model replica L3 falls back to
DWELL_S = 2.0
LONG_PROMPT = "word " * 14_000  # 70 KB: ~17.5K tokens estimated, over the 16K default
SHORT_PROMPT = "hello there"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    engine = EngineConfig(num_gpu_blocks=4096)
    config = FleetConfig(
        nodes=[NodeConfig(name="node-0", gpus=2)],
        pods=[
            PodConfig(name="big", model=MODEL, node="node-0", gpus=[0], engine=engine),
            PodConfig(name="small", model=SMALL_MODEL, node="node-0", gpus=[1], engine=engine),
        ],
        speed=20.0,
        seed=5,
    )
    with Fleet(config) as running:
        yield running


def chat(prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
    }


async def ask(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/chat/completions", json=body) as resp,
    ):
        await resp.read()
        return resp.status, dict(resp.headers)


@dataclass
class FlaggedTap:
    url: str
    sink: ListSink
    proxy: TapProxy
    follower: FlagFollower
    drops: list[str]  # flags messages the source skipped, by reason


class Publishing:
    """A thread that calls :meth:`step` every ``every_s`` and publishes through the jobs' sink."""

    every_s = 0.3

    def __init__(self, bus: Bus) -> None:
        self.sink = BusTransitionSink(Publisher(bus.producer, component="test-flags"), 10.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sink.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.every_s)

    def step(self) -> None:
        raise NotImplementedError


class Heartbeats(Publishing):
    """Stands in for the SLO jobs' liveness: a jobs heartbeat on the flags topic every 0.3 s."""

    def step(self) -> None:
        now_ms = int(time.time() * 1000)
        self.sink.beat(JobsHeartbeat(now_ms, now_ms, "test-jobs", self.every_s))


@asynccontextmanager
async def flagged_tap(bus: Bus, upstream: str, **degradation: Any) -> AsyncIterator[FlaggedTap]:
    """A tap over ``upstream`` following ``bus``'s flags topic."""
    config = TapConfig(
        listen="127.0.0.1:0",
        upstreams=[upstream],
        kafka=False,
        pool=MODEL,
        first_token_timeout_s=10.0,
        degradation={"follow_flags": True, "staleness_s": 3.0, **degradation},
    )
    drops: list[str] = []
    source = KafkaFlagSource(bus, probe_timeout_s=1.0, on_drop=drops.append)
    follower = FlagFollower(source, poll_s=0.2).start()
    sink = ListSink()
    proxy = TapProxy(config, sink, flags=follower.current)
    port = await proxy.start()
    try:
        yield FlaggedTap(f"http://127.0.0.1:{port}", sink, proxy, follower, drops)
    finally:
        await proxy.stop()
        await asyncio.to_thread(follower.stop)


def kv_usage(text: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:kv_cache_usage_perc":
                return float(sample.value)
    raise AssertionError("no vllm:kv_cache_usage_perc in the scrape")


class FlagDriver(Publishing):
    """Scrapes one pod's KV usage every 0.2 s into a FlagBoard; publishes its transitions."""

    every_s = 0.2

    def __init__(self, bus: Bus, pod_url: str, instance: str) -> None:
        super().__init__(bus)
        self.board = FlagBoard(FlagPolicy(dwell_s=DWELL_S))
        self.url, self.instance = pod_url, instance
        self.levels: list[tuple[float, int]] = []

    def step(self) -> None:
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            usage = kv_usage(resp.read().decode())
        now = time.time()
        change = self.board.observe(int(now * 1000), "instance", self.instance, MODEL, 1.0 - usage)
        if change is not None:
            self.levels.append((time.monotonic(), change.to_level))
            self.sink.write([change])


async def wait_for_level(follower: FlagFollower, instance: str, level: int) -> None:
    """Until the tap's follower holds ``level`` for ``instance`` (or its pool)."""
    deadline = time.monotonic() + 15
    while follower.current().level(MODEL, [instance], time.perf_counter(), 3.0) != level:
        assert time.monotonic() < deadline, f"the tap never saw L{level}"
        await asyncio.sleep(0.05)


async def wait_for_status(url: str, body: dict[str, Any], status: int, within_s: float) -> float:
    """Ask until the answer is ``status``; returns when it was (monotonic s)."""
    deadline = time.monotonic() + within_s
    while True:
        got, _ = await ask(url, body)
        if got == status:
            return time.monotonic()
        assert time.monotonic() < deadline, f"still {got}, wanted {status}"
        await asyncio.sleep(0.1)


def test_kv_leak_sheds_long_prompts_at_l2_until_it_recovers(fleet: Fleet, bus: Bus) -> None:
    pod = fleet.pod("big")

    async def scenario(driver: FlagDriver) -> None:
        async with flagged_tap(bus, pod.url) as tap:
            url, sink, proxy, follower = tap.url, tap.sink, tap.proxy, tap.follower
            assert (await ask(url, chat(LONG_PROMPT)))[0] == 200  # healthy: everything passes
            # 97 % of the pool leaks away: KV free 3 % → L2 (below 5 %, above 1 %).
            fleet.set_fault("big", "kv_leak", blocks_per_s=20_000, max_fraction=0.97)
            await wait_for_level(follower, pod.instance, 2)
            status, headers = await ask(url, chat(LONG_PROMPT))
            assert status == 429 and headers["Retry-After"] == "30"
            assert (await ask(url, chat(SHORT_PROMPT)))[0] == 200  # short prompts pass
            assert (await ask(url, chat(SHORT_PROMPT, max_tokens=8000)))[0] == 429
            assert max(level for _, level in driver.levels) == 2
            # The leak stops: the level holds for the dwell time (hysteresis), then clears.
            fleet.clear_fault("big", "kv_leak")
            cleared_s = time.monotonic()
            assert (await ask(url, chat(LONG_PROMPT)))[0] == 429
            passed_s = await wait_for_status(url, chat(LONG_PROMPT), 200, within_s=15)
            assert passed_s - cleared_s >= DWELL_S
            assert driver.levels[-1][1] == 0
            actions = [(r["degradation_level"], r["enforced_action"]) for r in sink.requests]
            assert (2, "rejected_long_prompt") in actions
            assert (2, "rejected_max_tokens") in actions
            assert (2, "degradation_header") in actions  # the short prompt, passed with L2
            rejected = [r for r in sink.requests if r["enforced_action"] == "rejected_long_prompt"]
            assert {(r["outcome"], r["http_status"]) for r in rejected} == {("rejected", 429)}
            assert sink.requests[-1]["degradation_level"] == 0
            counted = proxy.metrics.degradation_actions.labels("L2", "rejected_long_prompt")
            assert counted._value.get() == len(rejected)

    with Heartbeats(bus), FlagDriver(bus, pod.url, pod.instance) as driver:
        asyncio.run(scenario(driver))


def publish_level(bus: Bus, scope: str, scope_id: str, kv_free: float) -> None:
    board = FlagBoard(FlagPolicy())
    change = board.observe(int(time.time() * 1000), scope, scope_id, MODEL, kv_free)
    assert change is not None
    sink = BusTransitionSink(Publisher(bus.producer, component="test-flags"), 10.0)
    sink.write([change])
    sink.close()


def test_l3_serves_from_the_fallback_upstream_in_economy_mode(fleet: Fleet, bus: Bus) -> None:
    big, small = fleet.pod("big"), fleet.pod("small")

    async def scenario() -> None:
        async with flagged_tap(
            bus, big.url, fallback_upstream=small.url, fallback_model=SMALL_MODEL
        ) as tap:
            url, sink, f = tap.url, tap.sink, tap.follower
            status, headers = await ask(url, chat(SHORT_PROMPT))
            assert status == 200 and "x-llmslo-degraded" not in headers
            producer = bus.producer()
            producer.send_raw("flags", b"\x00 not a flag transition")  # skipped and counted
            producer.flush(10)
            producer.close()
            publish_level(bus, "pool", MODEL, kv_free=0.005)  # below 1 %: L3
            await wait_for_level(f, big.instance, 3)
            status, headers = await ask(url, chat(LONG_PROMPT))
            assert status == 200 and headers["x-llmslo-degraded"] == "economy"
            last = sink.requests[-1]
            assert (last["instance"], last["outcome"]) == (small.instance, "ok")
            assert (last["degradation_level"], last["enforced_action"]) == (3, "fallback_upstream")
            assert (
                last["model"] == MODEL
            )  # the client's name; the replica got SMALL_MODEL (else 404)
            assert sink.requests[0]["instance"] == big.instance
            assert tap.drops == ["undecodable_flag"]

    with Heartbeats(bus):
        asyncio.run(scenario())


@pytest.fixture
def own_broker() -> Iterator[tuple[EmbeddedBroker, Bus]]:
    """A broker of this test's own, so that it can be stopped (an outage)."""
    broker = EmbeddedBroker().start()
    bus = Bus(BusConfig(bootstrap_servers=broker.bootstrap_servers, partitions=1)).start()
    bus.ensure_topics()
    try:
        yield broker, bus
    finally:
        bus.stop()
        broker.stop()


def test_a_flags_outage_fails_open_after_the_staleness_bound(
    fleet: Fleet, own_broker: tuple[EmbeddedBroker, Bus]
) -> None:
    broker, bus = own_broker
    pod = fleet.pod("big")

    async def scenario() -> None:
        async with flagged_tap(bus, pod.url) as tap:
            url, sink, follower = tap.url, tap.sink, tap.follower
            publish_level(bus, "instance", pod.instance, kv_free=0.03)  # L2
            await wait_for_level(follower, pod.instance, 2)
            assert (await ask(url, chat(LONG_PROMPT)))[0] == 429
            await asyncio.to_thread(broker.stop)
            # Staleness runs from the follower's last poll that reached the broker, which is
            # up to one poll before the broker stopped, or from the newest jobs heartbeat's
            # send time, which is older still on a busy host: whichever comes first (all
            # on CLOCK_MONOTONIC).
            snapshot = follower.snapshot
            assert snapshot.heard_s is not None and snapshot.beat_s is not None
            assert (await ask(url, chat(LONG_PROMPT)))[0] == 429  # within the bound: still L2
            passed_s = await wait_for_status(url, chat(LONG_PROMPT), 200, within_s=20)
            assert passed_s - min(snapshot.heard_s, snapshot.beat_s) >= 3.0  # staleness_s
            assert sink.requests[-1]["enforced_action"] == "fail_open"
            assert sink.requests[-1]["degradation_level"] is None

    with Heartbeats(bus):
        asyncio.run(scenario())
