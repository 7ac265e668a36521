"""Benchmark: exposition parsing vs prometheus-client, and the CPU of a 200-target scrape loop.

Scrapes are realistic: a 64-engine-core vLLM pod (``engine="0".."63"``, rendered by
prometheus-client with vLLM's names and default buckets) and an 8-GPU dcgm-exporter node.
Our parser is measured warm (its series cache filled by an earlier scrape, as in the
collector's loop) and cold (a fresh parser); prometheus-client has no cache.

The scrape-loop part serves 200 static expositions (170 vLLM pods with 2 engine cores, 30
dcgm nodes) from one aiohttp server in a child process on loopback, runs the real
:class:`collectors.collector.Collector` (fetch, parse, canonicalise, one Arrow batch per
round, split by instance and Arrow-encoded as for Kafka) and reports the collector
process's CPU time per round as a share of one core at a 5 s interval.

    python bench/parse.py            # full
    python bench/parse.py --quick    # < 60 s

The last line is JSON: {"bench": "parse", "samples_per_s": …,
"prometheus_client_samples_per_s": …, "ratio": …, …}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.exposition import ExpositionParser
from pipeline.bus import split_by_key
from pipeline.codec import encode_arrow
from tests.collectors.examples import dcgm_exposition, vllm_exposition

INTERVAL_S = 5.0


def _rate(fn: object, samples: int, min_s: float) -> float:
    """Samples per second of ``fn()`` repeated for at least ``min_s``."""
    runs, started = 0, time.perf_counter()
    while True:
        fn()  # type: ignore[operator]
        runs += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_s:
            return samples * runs / elapsed


def bench_parse(min_s: float) -> dict[str, float]:
    scrapes = {
        "vllm_64_engines": vllm_exposition(engines=64),
        "dcgm_8_gpus": dcgm_exposition(gpus=8),
    }
    ours_total = pc_total = cold_total = samples_total = 0.0
    results: dict[str, float] = {}
    for name, text in scrapes.items():
        parser = ExpositionParser()
        samples = len(parser.parse(text))
        ours = _rate(lambda t=text, p=parser: p.parse(t), samples, min_s)
        cold = _rate(lambda t=text: ExpositionParser().parse(t), samples, min_s)
        theirs = _rate(lambda t=text: list(text_string_to_metric_families(t)), samples, min_s)
        print(
            f"{name:<16} {samples:>6} samples  ours warm {ours:>12,.0f}/s  cold {cold:>12,.0f}/s  "
            f"prometheus_client {theirs:>10,.0f}/s  "
            f"ratio {ours / theirs:5.1f}x (cold {cold / theirs:4.1f}x)"
        )
        # weight by time: total samples / total seconds over one scrape of each
        samples_total += samples
        ours_total += samples / ours
        cold_total += samples / cold
        pc_total += samples / theirs
    results["samples_per_s"] = samples_total / ours_total
    results["cold_samples_per_s"] = samples_total / cold_total
    results["prometheus_client_samples_per_s"] = samples_total / pc_total
    return results


def _serve(port: int, ready: object) -> None:
    from aiohttp import web

    bodies = {
        f"/t{i}": (
            vllm_exposition(engines=2, seed=i) if i < 170 else dcgm_exposition(gpus=8, seed=i)
        )
        for i in range(200)
    }

    async def handler(request: web.Request) -> web.Response:
        body = bodies.get(request.path)
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(text=body, content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response()  # an engine answers the collector's readiness probe as vLLM does

    models = '{"object": "list", "data": [{"id": "llama-3-8b", "object": "model"}]}'

    async def listed(request: web.Request) -> web.Response:
        return web.Response(text=models, content_type="application/json")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", listed)
    app.router.add_get("/{name}", handler)
    ready.set()  # type: ignore[attr-defined]
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def bench_scrape_loop(rounds: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(port, ready), daemon=True)
    server.start()
    ready.wait(30)
    time.sleep(1.0)
    encoded = [0]

    def sink(schema: object, table: object) -> None:
        for _, rows in split_by_key(schema, table):  # type: ignore[arg-type]
            encoded[0] += len(encode_arrow(schema, rows))  # type: ignore[arg-type]

    config = CollectConfig(
        targets=[TargetConfig(url=f"127.0.0.1:{port}/t{i}") for i in range(200)],
        interval_s=0.01,
        jitter_s=0.0,
        timeout_s=10,
        concurrency=64,
    )
    collector = Collector(config, sink)

    async def run() -> tuple[float, float, int]:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            await collector.scrape_round(session)  # warm: connections, caches, templates
            cpu0, wall0 = time.process_time(), time.perf_counter()
            samples = 0
            for _ in range(rounds):
                report = await collector.scrape_round(session)
                samples += sum(report.rows.values())
            return time.process_time() - cpu0, time.perf_counter() - wall0, samples

    try:
        cpu_s, wall_s, rows = asyncio.run(run())
    finally:
        server.terminate()
        server.join(10)
    up = sum(1 for h in collector.health.values() if h.up)
    cpu_per_round = cpu_s / rounds
    share = cpu_per_round / INTERVAL_S
    print(
        f"scrape loop: 200 targets ({up} up), {rows / rounds:,.0f} rows/round, "
        f"CPU {cpu_per_round * 1000:.0f} ms/round (wall {wall_s / rounds * 1000:.0f} ms) "
        f"= {share * 100:.1f} % of one core at one round every {INTERVAL_S:g} s (target <= 25 %)"
    )
    return {
        "scrape_cpu_share_of_core": round(share, 4),
        "scrape_cpu_ms_per_round": round(cpu_per_round * 1000, 1),
        "scrape_rows_per_round": rows / rounds,
        "targets_up": up,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    args = parser.parse_args()
    parse = bench_parse(min_s=1.0 if args.quick else 5.0)
    loop = bench_scrape_loop(rounds=3 if args.quick else 10)
    result = {
        "bench": "parse",
        "samples_per_s": round(parse["samples_per_s"]),
        "prometheus_client_samples_per_s": round(parse["prometheus_client_samples_per_s"]),
        "ratio": round(parse["samples_per_s"] / parse["prometheus_client_samples_per_s"], 2),
        "cold_ratio": round(
            parse["cold_samples_per_s"] / parse["prometheus_client_samples_per_s"], 2
        ),
        **loop,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
