"""Benchmark: the signal detectors and flags of one jobs cycle at fleet scale.

``SloJobs.run_once`` does more than the SLO cycle (``bench/lake.py``): it reads a snapshot
of the last ``detectors.lookback_s`` (600 s) of raw rows (:func:`slo.signals.snapshot.load_snapshot`),
runs every detector of the signal catalog (:func:`slo.signals.detectors.detect_all`) and
steps the L0–L3 flags (``SloJobs._step_flags``). This bench times those three steps of
:meth:`SloJobs.judge <slo.jobs.SloJobs.judge>` on ``--instances`` SGLang instances in 8
pools, fed the raw rows of the lookback into one DuckDB store:

* tap request records at ``--rps`` per instance (log-normal TTFT, TPOT and ITL jitter,
  prompt lengths, 0.3 % failed), every 97th instance slow (TTFT ×3, TPOT ×2) so the latency
  detectors have findings to make;
* engine scrapes every 15 s: ``running``, ``waiting``, ``kv_usage`` gauges,
  ``generation_tokens`` and ``preemptions`` counters, and a ``target_health`` row.

Each timed cycle reads a fresh snapshot (as each jobs cycle does) and runs ``detect_all``
and the flags as the jobs run them (the figure); then, apart and on another fresh snapshot,
the breakdown: the snapshot read, the pool baselines (the serving rule several detectors
share), each detector of the catalog (``DETECTORS``) and the suspects. Times are CPU
seconds of this process (``time.process_time``: every thread, DuckDB's too, robust to
other load on the machine) and wall seconds; medians of ``--cycles`` cycles. The last line
is one JSON object (with the 1-minute load average at the end).

Usage: ``python bench/signals.py [--quick] [--instances 4096] [--cycles 3] [--rps 0.5]``
(``--quick``: 256 instances, ~10 s; 4,096 instances take 1–2 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.lake import _dict, _names, tap_records  # noqa: E402
from pipeline.codec import conform  # noqa: E402
from pipeline.schema import ENGINE_SAMPLES, TARGET_HEALTH  # noqa: E402
from pipeline.store import Store  # noqa: E402
from slo.jobs import JobsConfig, SloJobs  # noqa: E402
from slo.signals._serving import pool_baselines  # noqa: E402
from slo.signals.detectors import DETECTORS, detect_all, suspected_causes  # noqa: E402
from slo.signals.snapshot import load_snapshot  # noqa: E402
from slo.spec import load_spec  # noqa: E402
from slo.spec.model import build_model  # noqa: E402

POOLS = 8
SCRAPE_MS = 15_000
#: Mid-hour, as bench/lake.py's.
NOW_MS = 1_790_000_000_000 // 3_600_000 * 3_600_000 + 37 * 60_000
#: Every this many instances one is slow (TTFT ×3, TPOT ×2).
SLOW_EVERY = 97


def fleet_requests(
    t0: int, t1: int, instances: int, rps: float, rng: np.random.Generator
) -> pa.Table:
    """Tap records received in [t0, t1): 0.3 % failed, log-normal latencies, prompt lengths."""
    n = int(instances * rps * (t1 - t0) / 1000)
    inst = rng.integers(0, instances, n)
    bad = rng.random(n) < 0.003
    slow = inst % SLOW_EVERY == 5
    prompts = rng.integers(50, 4000, n)
    ttft = rng.lognormal(np.log(0.4), 0.4, n) * (0.5 + prompts / 2000) * np.where(slow, 3, 1)
    tpot = rng.lognormal(np.log(0.03), 0.3, n) * np.where(slow, 2, 1)
    jitter = rng.lognormal(np.log(0.004), 0.5, n)
    received = np.sort(rng.integers(t0, t1, n))
    return tap_records(t0, instances, inst, bad, received, ttft, tpot, jitter, prompts)


#: (signal, kind) of each instance's scrape.
_SIGNALS = (
    ("running", "gauge"),
    ("waiting", "gauge"),
    ("kv_usage", "gauge"),
    ("generation_tokens", "counter"),
    ("preemptions", "counter"),
)


def fleet_engine(t0: int, t1: int, instances: int) -> pa.Table:
    """Every instance's scrapes in [t0, t1), one per 15 s (:data:`_SIGNALS`)."""
    scrapes = np.arange(t0 + (-t0) % SCRAPE_MS, t1, SCRAPE_MS)
    per = len(_SIGNALS)
    n = len(scrapes) * instances * per
    ts = scrapes[np.repeat(np.arange(len(scrapes)), instances * per)]
    inst = np.tile(np.repeat(np.arange(instances), per), len(scrapes))
    m = np.tile(np.arange(per), len(scrapes) * instances)
    since = (ts - 1_700_000_000_000) / 1000
    value = np.select(
        [m == 0, m == 1, m == 2, m == 3, m == 4],
        [
            8.0 + inst % 5,
            (inst % 3).astype(float),
            0.4 + 0.1 * np.sin(ts / 6e5 + inst),
            np.floor(since * (40 + inst % 7)),
            np.floor(since / 600),
        ],
    )
    names = _names(instances)
    pools = [f"pool-{p}" for p in range(POOLS)]
    return conform(
        ENGINE_SAMPLES,
        pa.table(
            {
                "ts_ms": pa.array(ts.astype(np.int64)),
                "instance": _dict(inst, names),
                "address": _dict(inst, names),
                "pool": _dict(inst % POOLS, pools),
                "dialect": _dict(np.zeros(n), ["sglang"]),
                "model": _dict(inst % POOLS, pools),
                "engine": _dict(np.zeros(n), [""]),
                "metric": _dict(m, [f"sglang:{s}" for s, _ in _SIGNALS]),
                "signal": _dict(m, [s for s, _ in _SIGNALS]),
                "kind": _dict(m, [k for _, k in _SIGNALS]),
                "labels_json": _dict(np.zeros(n), ["{}"]),
                "value": pa.array(value),
            }
        ),
    )


def fleet_health(t0: int, t1: int, instances: int) -> pa.Table:
    """Every scrape's outcome: up."""
    scrapes = np.arange(t0 + (-t0) % SCRAPE_MS, t1, SCRAPE_MS)
    n = len(scrapes) * instances
    inst = np.tile(np.arange(instances), len(scrapes))
    names = _names(instances)
    return conform(
        TARGET_HEALTH,
        pa.table(
            {
                "ts_ms": pa.array(np.repeat(scrapes, instances).astype(np.int64)),
                "instance": pa.array([names[i] for i in inst]),
                "target": pa.array([f"http://{names[i]}/metrics" for i in inst]),
                "pool": pa.array([f"pool-{i % POOLS}" for i in inst]),
                "dialect": pa.array(["sglang"] * n),
                "up": pa.array(np.ones(n, bool)),
                "http_status": pa.array(np.full(n, 200, np.int16)),
                "duration_s": pa.array(np.full(n, 0.01)),
                "counter_resets": pa.array(np.zeros(n, np.int32)),
            }
        ),
    )


def fill(store: Store, instances: int, rps: float, seconds: int) -> None:
    """The raw rows of the last ``seconds`` before :data:`NOW_MS` (and a scrape past it)."""
    t0, t1 = NOW_MS - seconds * 1000, NOW_MS + 1
    rng = np.random.default_rng(7)
    store.commit_batch(
        {
            "requests": [fleet_requests(t0, t1, instances, rps, rng)],
            "engine_samples": [fleet_engine(t0, t1, instances)],
            "target_health": [fleet_health(t0, t1, instances)],
        },
        group_id="bench",
        offsets={},
        now_ts_ms=0,
    )
    store.checkpoint()


@contextmanager
def timed(times: dict[str, float], step: str) -> Iterator[None]:
    """CPU seconds of this process (every thread) as ``times[step + "_cpu_s"]``, wall
    seconds as ``times[step + "_s"]``."""
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        yield
    finally:
        times[f"{step}_cpu_s"] = time.process_time() - cpu
        times[f"{step}_s"] = time.perf_counter() - wall


def breakdown(jobs: SloJobs) -> dict[str, float]:
    """One snapshot's read, its pool baselines, each detector and the suspects, timed apart."""
    cfg = jobs.config.detectors
    times: dict[str, float] = {}
    with timed(times, "snapshot"):
        snap = jobs._snapshot(NOW_MS)
    with timed(times, "pool_baselines"):
        pool_baselines(snap, cfg)
    for name, detector in DETECTORS.items():
        with timed(times, f"detector:{name}"):
            detector(snap, cfg)
    with timed(times, "suspects"):
        suspected_causes(snap, cfg)
    return times


def judged(jobs: SloJobs) -> tuple[dict[str, float], int]:
    """What a jobs cycle runs after the SLOs: snapshot, ``detect_all``, flags; and the
    number of findings."""
    times: dict[str, float] = {}
    with timed(times, "snapshot"):
        snap = load_snapshot(
            jobs.con,
            NOW_MS,
            int(jobs.config.detectors.lookback_s * 1000),
            int(jobs.config.detectors.ghost_grace_s * 1000),
        )
    with timed(times, "detect_all"):
        findings = detect_all(snap, jobs.config.detectors)
    with timed(times, "flags"):
        jobs._step_flags(snap, findings)
    for key in ("_s", "_cpu_s"):
        times[f"total{key}"] = sum(times[f"{p}{key}"] for p in ("snapshot", "detect_all", "flags"))
    return times, len(findings)


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="256 instances")
    parser.add_argument("--instances", type=int, default=None, help="default 4096")
    parser.add_argument("--rps", type=float, default=0.5, help="requests/s per instance")
    parser.add_argument("--cycles", type=int, default=3, help="timed cycles (median)")
    parser.add_argument(
        "--no-breakdown", action="store_true", help="time detect_all and the flags only"
    )
    args = parser.parse_args(argv)
    instances = args.instances or (256 if args.quick else 4096)
    config = JobsConfig()
    model = build_model(load_spec(ROOT / "config" / "slo.example.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "jobs.duckdb")
        started = time.perf_counter()
        fill(store, instances, args.rps, int(config.detectors.lookback_s) + 60)
        print(f"filled in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        jobs = SloJobs(store.con, model, config)
        cycles: list[dict[str, float]] = []
        parts: list[dict[str, float]] = []
        findings = 0
        for k in range(args.cycles):
            times, findings = judged(jobs)
            cycles.append(times)
            print(
                f"cycle {k}: snapshot + detectors + flags {times['total_s']:.2f} s (CPU "
                f"{times['total_cpu_s']:.2f} s: snapshot {times['snapshot_cpu_s']:.2f}, "
                f"detect_all {times['detect_all_cpu_s']:.2f}, flags {times['flags_cpu_s']:.2f}); "
                f"{findings} findings",
                file=sys.stderr,
            )
            if not args.no_breakdown:
                parts.append(breakdown(jobs))
        store.close()
    cycle = median_of(cycles)
    result: dict[str, Any] = {
        "bench": "signals",
        "cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "instances": instances,
        "findings": findings,
        **{k: round(v, 4) for k, v in cycle.items()},
    }
    if parts:
        part = median_of(parts)
        slowest = sorted(
            (k for k in part if k.endswith("_cpu_s")), key=lambda k: part[k], reverse=True
        )
        for key in slowest[:12]:
            step = key.removesuffix("_cpu_s")
            print(
                f"  {step}: CPU {part[key]:.3f} s, wall {part[step + '_s']:.3f} s",
                file=sys.stderr,
            )
        result["breakdown_cpu_s"] = {
            k.removesuffix("_cpu_s"): round(part[k], 4) for k in slowest if part[k] >= 0.001
        }
    print(
        f"signals, {instances} instances: snapshot + detectors + flags {cycle['total_s']:.2f} s "
        f"wall, {cycle['total_cpu_s']:.2f} s CPU (snapshot {cycle['snapshot_cpu_s']:.2f}, "
        f"detect_all {cycle['detect_all_cpu_s']:.2f}, flags {cycle['flags_cpu_s']:.2f}), "
        f"{findings} findings; load average {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
