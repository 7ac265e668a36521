"""Benchmark: how many pods one simulator process sustains under streaming load.

The fleet (all pods, one event loop, one thread) runs in this process; the load generator
runs in ``--clients`` child processes (Poisson arrivals split round-robin, streaming chat on
raw asyncio connections so the client is cheap; a token counts only if its chunk arrived and
the stream ended with ``[DONE]`` carrying exactly ``max_tokens`` tokens). Throughput is what
clients actually received during the steady window (after warm-up, until arrivals end).
Last line: ``{"bench": "sim", "pods": …, "req_per_s": …, "tokens_per_s": …}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import Fleet, simple_fleet
from simulator.traces import TraceRequest, poisson_arrivals


async def _stream_one(
    host: str, port: int, body: bytes, stats: dict[str, Any], req: TraceRequest
) -> None:
    """One streaming chat request on a raw connection; counts token chunks as they arrive."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    received = bytearray()
    first = last = None
    while True:
        data = await reader.read(65536)
        if not data:
            break
        now = time.monotonic()
        received += data
        if first is None and received.count(b'"content": "') > received.count(b'"content": ""'):
            first = now
        last = now
        if received.endswith(b"data: [DONE]\n\n\r\n") or b"0\r\n\r\n" in data[-5:]:
            break
    writer.close()
    tokens = received.count(b'"content": "') - received.count(b'"content": ""')
    ok = b"data: [DONE]" in received and tokens == req.output_tokens
    stats["results"].append(
        (
            t0 - stats["t0"],
            now - t0 if first else None,
            (first - t0) if first else None,
            tokens,
            ok,
            (last - first) / max(1, tokens - 1) if first and last else None,
        )
    )


def _client(ports: list[int], args: dict[str, Any], part: int, queue: mp.Queue) -> None:
    """A lean load generator (raw asyncio streams) so the client is not the bottleneck."""
    arrivals = poisson_arrivals(
        args["rate"],
        args["duration"],
        seed=1,
        mean_prompt_tokens=256,
        mean_output_tokens=args["out_tokens"],
    )
    mine = [
        TraceRequest(
            r.offset_s,
            min(r.prompt_tokens, 1024),
            max(10, min(r.output_tokens, 2 * args["out_tokens"])),
        )
        for i, r in enumerate(arrivals)
        if i % args["clients"] == part
    ]

    async def run() -> dict[str, Any]:
        stats: dict[str, Any] = {"results": [], "t0": time.monotonic(), "late": []}
        tasks = []
        for k, req in enumerate(mine):
            due = stats["t0"] + req.offset_s
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            stats["late"].append(time.monotonic() - due)
            body = json.dumps(
                {
                    "model": "llama-3-8b",
                    "messages": [{"role": "user", "content": "abcd" * req.prompt_tokens}],
                    "max_tokens": req.output_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
            ).encode()
            port = ports[(k * args["clients"] + part) % len(ports)]
            tasks.append(asyncio.create_task(_stream_one("127.0.0.1", port, body, stats, req)))
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        stats["errors"] = len(errors)
        if errors:
            print(f"client {part}: {len(errors)} errors, e.g. {errors[0]}", file=sys.stderr)
        return stats

    stats = asyncio.run(run())
    duration, warmup = args["duration"], min(3.0, args["duration"] / 4)
    results = stats["results"]
    done = [r for r in results if r[4] and r[1] is not None and warmup <= r[0] + r[1] <= duration]
    queue.put(
        {
            "requests": len(mine),
            "ok": sum(1 for r in results if r[4]),
            "steady_requests": len(done),
            "steady_tokens": sum(r[3] for r in done),
            "window_s": duration - warmup,
            "ttft": [r[2] for r in results if r[2] is not None],
            "tpot": [r[5] for r in results if r[5] is not None],
            "lateness": stats["late"],
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--rate", type=float, default=280.0, help="offered requests/s")
    parser.add_argument("--out-tokens", type=int, default=65, help="mean output tokens")
    parser.add_argument("--duration", type=float, help="seconds of arrivals (default 15 quick, 60)")
    parser.add_argument("--clients", type=int, default=1, help="load generator processes")
    args = parser.parse_args()
    duration = args.duration or (15.0 if args.quick else 60.0)
    params = {
        "rate": args.rate,
        "duration": duration,
        "out_tokens": args.out_tokens,
        "clients": args.clients,
    }
    ctx = mp.get_context("spawn")
    with Fleet(
        simple_fleet(args.pods, ["vllm", "sglang", "trtllm", "vllm-legacy"], seed=0)
    ) as fleet:
        ports = [p.port for p in fleet.pods]
        queue: mp.Queue = ctx.Queue()
        children = [
            ctx.Process(target=_client, args=(ports, params, k, queue)) for k in range(args.clients)
        ]
        load_start = os.getloadavg()[0]
        cpu0, t0 = time.process_time(), time.monotonic()
        for child in children:
            child.start()
        parts = [queue.get(timeout=duration + 300) for _ in children]
        for child in children:
            child.join(timeout=30)
        wall, sim_cpu = time.monotonic() - t0, time.process_time() - cpu0
    window = parts[0]["window_s"]
    ttft = np.array([x for p in parts for x in p["ttft"]])
    tpot = np.array([x for p in parts for x in p["tpot"]])
    late = np.array([x for p in parts for x in p["lateness"]])
    requests = sum(p["requests"] for p in parts)
    result = {
        "bench": "sim",
        "pods": args.pods,
        "req_per_s": round(sum(p["steady_requests"] for p in parts) / window, 1),
        "tokens_per_s": round(sum(p["steady_tokens"] for p in parts) / window, 1),
        "offered_req_per_s": args.rate,
        "requests": requests,
        "ok_fraction": round(sum(p["ok"] for p in parts) / max(1, requests), 4),
        "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
        "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
        "tpot_p50_s": round(float(np.percentile(tpot, 50)), 4),
        "tpot_p99_s": round(float(np.percentile(tpot, 99)), 4),
        "arrival_lateness_p99_s": round(float(np.percentile(late, 99)), 4),
        "sim_cpu_s_per_wall_s": round(sim_cpu / wall, 3),
        "sim_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        # the machine is shared: a 1-min load average above the core count starves the sim
        "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "cores": os.cpu_count(),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
