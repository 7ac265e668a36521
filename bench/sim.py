"""Benchmark: how many pods one simulator process sustains under streaming load.

The fleet (all pods, one event loop, one thread) runs in this process; the load generator
runs in ``--clients`` child processes (Poisson arrivals split round-robin, streaming chat
with include_usage), sharing the machine's cores like a real drill. Throughput is what
clients actually received during the steady window (after warm-up, until arrivals end).
Last line: ``{"bench": "sim", "pods": …, "req_per_s": …, "tokens_per_s": …}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import Fleet, simple_fleet
from simulator.load import LoadConfig, run_load_sync
from simulator.traces import TraceRequest, poisson_arrivals


def _client(targets: list[str], args: dict[str, Any], part: int, queue: mp.Queue) -> None:
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
    config = LoadConfig(targets=targets, concurrency=4096, request_timeout_s=120, seed=part)
    report = run_load_sync(config, mine)
    duration, warmup = args["duration"], min(3.0, args["duration"] / 4)
    done = [
        r
        for r in report.results
        if r.outcome == "ok" and r.e2e_s is not None and warmup <= r.sent_s + r.e2e_s <= duration
    ]
    queue.put(
        {
            "requests": len(report.results),
            "ok": sum(r.outcome == "ok" for r in report.results),
            "steady_requests": len(done),
            "steady_tokens": sum(r.completion_tokens for r in done),
            "window_s": duration - warmup,
            "ttft": [r.ttft_s for r in report.results if r.ttft_s is not None],
            "itl": [g for r in report.results for g in r.itl_s[::4]],
            "lateness": [r.sent_s - r.scheduled_s for r in report.results],
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--rate", type=float, default=280.0, help="offered requests/s")
    parser.add_argument("--out-tokens", type=int, default=65, help="mean output tokens")
    parser.add_argument("--duration", type=float, help="seconds of arrivals (default 15 quick, 60)")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
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
        targets = [p.url for p in fleet.pods]
        queue: mp.Queue = ctx.Queue()
        children = [
            ctx.Process(target=_client, args=(targets, params, k, queue))
            for k in range(args.clients)
        ]
        cpu0, t0 = time.process_time(), time.monotonic()
        for child in children:
            child.start()
        parts = [queue.get(timeout=duration + 300) for _ in children]
        for child in children:
            child.join(timeout=30)
        wall, sim_cpu = time.monotonic() - t0, time.process_time() - cpu0
    window = parts[0]["window_s"]
    ttft = np.array([x for p in parts for x in p["ttft"]])
    itl = np.array([x for p in parts for x in p["itl"]])
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
        "itl_p50_s": round(float(np.percentile(itl, 50)), 4),
        "itl_p99_s": round(float(np.percentile(itl, 99)), 4),
        "arrival_lateness_p99_s": round(float(np.percentile(late, 99)), 4),
        "sim_cpu_s_per_wall_s": round(sim_cpu / wall, 3),
        "sim_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
