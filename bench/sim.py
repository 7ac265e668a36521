"""Benchmark: how many pods one simulator process sustains under streaming load.

The fleet (all pods, one event loop) runs in this process; the load generator runs in a
child process (Poisson arrivals, streaming chat, include_usage) so the two share the
machine's 2 cores like a real drill. Throughput is what clients actually received.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import Fleet, simple_fleet
from simulator.load import LoadConfig, run_load_sync
from simulator.traces import TraceRequest, poisson_arrivals


def _client(
    targets: list[str], rate: float, duration: float, out_tokens: int, queue: mp.Queue
) -> None:
    requests = [
        TraceRequest(
            r.offset_s, min(r.prompt_tokens, 1024), max(10, min(r.output_tokens, 2 * out_tokens))
        )
        for r in poisson_arrivals(
            rate, duration, seed=1, mean_prompt_tokens=256, mean_output_tokens=out_tokens
        )
    ]
    config = LoadConfig(targets=targets, concurrency=4096, request_timeout_s=120)
    report = run_load_sync(config, requests)
    summary = report.summary()
    # steady state: completions (and their tokens) inside [warmup, end of arrivals]
    warmup = min(3.0, duration / 4)
    done = [
        r
        for r in report.results
        if r.outcome == "ok" and r.e2e_s is not None and warmup <= r.sent_s + r.e2e_s <= duration
    ]
    window = duration - warmup
    summary["steady"] = {
        "window_s": window,
        "req_per_s": len(done) / window,
        "tokens_per_s": sum(r.completion_tokens for r in done) / window,
    }
    queue.put(summary)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--rate", type=float, default=280.0, help="offered requests/s")
    parser.add_argument("--out-tokens", type=int, default=65, help="mean output tokens")
    parser.add_argument("--duration", type=float, help="seconds of arrivals (default 15 quick, 60)")
    args = parser.parse_args()
    duration = args.duration or (15.0 if args.quick else 60.0)
    dialects = ["vllm", "sglang", "trtllm", "vllm-legacy"]
    with Fleet(simple_fleet(args.pods, dialects, seed=0)) as fleet:
        targets = [p.url for p in fleet.pods]
        queue: mp.Queue = mp.get_context("spawn").Queue()
        child = mp.get_context("spawn").Process(
            target=_client, args=(targets, args.rate, duration, args.out_tokens, queue)
        )
        cpu0 = time.process_time()
        t0 = time.monotonic()
        child.start()
        summary = queue.get(timeout=duration + 300)
        child.join(timeout=30)
        wall = time.monotonic() - t0
        sim_cpu = time.process_time() - cpu0
    print(json.dumps({"client": summary}, default=float), flush=True)
    ok = summary["outcomes"].get("ok", 0)
    result = {
        "bench": "sim",
        "pods": args.pods,
        "req_per_s": round(summary["steady"]["req_per_s"], 1),
        "tokens_per_s": round(summary["steady"]["tokens_per_s"], 1),
        "overall_req_per_s": round(ok / summary["wall_s"], 1),
        "offered_req_per_s": args.rate,
        "ok_fraction": round(ok / max(1, summary["requests"]), 4),
        "ttft_p99_s": summary["ttft_s"]["p99"],
        "itl_p99_s": summary["itl_s"]["p99"],
        "sim_cpu_s_per_wall_s": round(sim_cpu / wall, 3),
        "sim_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
