"""Fixtures for simulator tests: a real fleet on loopback and small HTTP helpers."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator import EngineConfig, Fleet, FleetConfig, NodeConfig, PodConfig
from simulator.dialects import make_dialect
from simulator.engine import EngineModel
from simulator.faults import FaultBoard
from simulator.traces import poisson_arrivals

MODEL = "llama-3-8b"


@dataclass(frozen=True)
class EngineScrape:
    """What a scrape of the engine model reads at ``t_s`` (virtual seconds)."""

    t_s: float
    running: int
    waiting: int
    tokens: int
    kv_usage: float
    preemptions: int


def engine_scrapes(
    fault: str,
    *,
    rate_per_s: float,
    seconds: float,
    fault_from_s: float,
    params: dict[str, Any] | None = None,
    seed: int = 3,
) -> list[EngineScrape]:
    """The engine model on a virtual clock under Poisson load (the drill's workload:
    512-token prompts and 128-token answers on average, 256-token prefill chunks), ``fault``
    set from ``fault_from_s`` on, scraped every 2 s from the start."""
    now = [0.0]
    faults = FaultBoard()
    config = EngineConfig(prefill_chunk_tokens=256)
    dialect = make_dialect("vllm", "m", config.max_model_len)
    engine = EngineModel(config, dialect, faults, lambda: now[0], seed=seed)
    arrivals = list(poisson_arrivals(rate_per_s, seconds, seed=seed, mean_output_tokens=128))
    scrapes: list[EngineScrape] = []
    index, next_scrape_s = 0, 0.0
    while now[0] < seconds:
        if fault not in faults and now[0] >= fault_from_s:
            faults.set(fault, params, now[0])
        while next_scrape_s <= now[0]:
            scrapes.append(
                EngineScrape(
                    next_scrape_s,
                    len(engine.running),
                    len(engine.waiting),
                    engine.tokens_generated,
                    engine.kv_usage(),
                    engine.preemptions,
                )
            )
            next_scrape_s += 2.0
        while index < len(arrivals) and arrivals[index].offset_s <= now[0]:
            a = arrivals[index]
            engine.add(
                engine.new_request(
                    str(index), a.prompt_tokens, a.output_tokens, lambda n, r: None, ignore_eos=True
                )
            )
            index += 1
        plan = engine.plan_step()
        if plan is None:  # nothing admissible: on to the next arrival or scrape
            upcoming = arrivals[index].offset_s if index < len(arrivals) else seconds
            now[0] = min(upcoming, next_scrape_s)
            continue
        now[0] += plan.duration_s
        engine.finish_step(plan)
    return scrapes


def post(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, bytes]:
    """POST JSON; returns (status, body) also for HTTP errors."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post_quietly(url: str, body: dict[str, Any]) -> None:
    """``post`` for background threads: the fleet may close under them at teardown."""
    with contextlib.suppress(OSError):
        post(url, body)


def get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float, str]]]:
    """``sample name → [(labels, value, family type)]`` via prometheus-client's parser."""
    status, body = get(url + "/metrics")
    assert status == 200
    out: dict[str, list[tuple[dict[str, str], float, str]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value, family.type))
    return out


def value(
    samples: dict[str, list[tuple[dict[str, str], float, str]]], name: str, **labels: str
) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    rows = [
        v for lab, v, _ in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    ]
    assert rows, f"{name}{labels} not exposed"
    return sum(rows)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def open_stream(port: int, body: dict[str, Any], route: str = "/v1/completions") -> socket.socket:
    """Start a streaming request on a raw socket and read the response head (not a byte
    more: the first events may arrive in the same segment as the head)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    head = b""
    while not head.endswith(b"\r\n\r\n"):  # the head only: body bytes stay for the caller
        byte = sock.recv(1)
        assert byte, f"connection closed inside the response head: {head[:200]!r}"
        head += byte
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def completion(
    max_tokens: int = 8, *, stream: bool = False, prompt_chars: int = 40, **extra: Any
) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": "a" * prompt_chars,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        **extra,
    }


@pytest.fixture
def make_fleet() -> Iterator[Callable[..., Fleet]]:
    """Factory: ``make_fleet(dialects, speed=..., **engine)`` → a running Fleet, closed after."""
    fleets: list[Fleet] = []

    def factory(dialects: list[str] | None = None, *, speed: float = 20.0, **engine: Any) -> Fleet:
        names = dialects or ["vllm"]
        node = NodeConfig(name="node-0", gpus=max(1, len(names)))
        pods = [
            PodConfig(
                name=f"pod-{i}",
                dialect=d,
                model=MODEL,
                node="node-0",
                gpus=[i],
                engine=EngineConfig.model_validate(engine),
            )
            for i, d in enumerate(names)
        ]
        fleet = Fleet(FleetConfig(nodes=[node], pods=pods, speed=speed, seed=7))
        fleet.start()
        fleets.append(fleet)
        return fleet

    yield factory
    for fleet in fleets:
        fleet.close()
