"""Ingest benchmark: samples/s from produce to committed in DuckDB, with the embedded broker.

Measured side by side in one run:

* **llmslo**: a producer process publishes Arrow batches (one message per pod scrape of a
  64-engine-core vLLM pod, ~2,000 samples) while ``llmslo ingest`` runs as its own process;
  the clock runs from the first send until the ingester's ``/metrics`` reports every row
  committed. Peak RSS of the ingester process is sampled throughout.
* **naive**: one JSON message per sample, consumed and inserted row by row.
* **ceiling**: the same Arrow tables committed straight through the store (series split and
  DuckDB Arrow append, no Kafka at all): what ingest could reach with a free bus.

The last line printed is one JSON object (see DESIGN §8 for the targets).
With ``--ingesters N`` it also runs N ingesters in one consumer group (each its own
DuckDB file and process) on the same workload: aggregate samples/s, the speed-up over one,
each ingester's peak RSS, and the machine's cores (N ingesters need N free cores to scale).

Usage: ``python bench/ingest.py [--quick] [--ingesters 2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import psutil
import pyarrow as pa
import yaml
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipeline.broker import EmbeddedBroker, free_port
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.schema import ENGINE_SAMPLES
from pipeline.store import Store

ENGINES_PER_POD = 64
PODS = 256
METRICS = [
    ("vllm:num_requests_running", "running", "gauge"),
    ("vllm:num_requests_waiting", "waiting", "gauge"),
    ("vllm:kv_cache_usage_perc", "kv_usage", "gauge"),
    ("vllm:num_preemptions_total", "preemptions", "counter"),
    ("vllm:prompt_tokens_total", "prompt_tokens", "counter"),
    ("vllm:generation_tokens_total", "generation_tokens", "counter"),
] + [("vllm:time_to_first_token_seconds_bucket", "ttft", "bucket")] * 25


def pod_scrape(pod: int, ts_ms: int, rng: np.random.Generator) -> pa.Table:
    """One scrape of a 64-engine-core vLLM pod as canonical engine samples (~2,000 rows)."""
    n = ENGINES_PER_POD * len(METRICS)
    metric_idx = np.tile(np.arange(len(METRICS), dtype=np.int32), ENGINES_PER_POD)
    engine_idx = np.repeat(np.arange(ENGINES_PER_POD, dtype=np.int32), len(METRICS))
    labels = [
        json.dumps({"engine": str(e), "model_name": "llama-3-70b"}) for e in range(ENGINES_PER_POD)
    ]
    le = np.where(metric_idx >= 6, 0.001 * 2.0 ** (metric_idx - 6), np.nan)

    def one(value: str) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(np.zeros(n, np.int32), [value])

    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, ts_ms, np.int64)),
            one(f"10.1.{pod // 250}.{pod % 250}:8000"),
            one("llama-3-70b"),
            one("vllm"),
            one("llama-3-70b"),
            pa.DictionaryArray.from_arrays(engine_idx, [str(e) for e in range(ENGINES_PER_POD)]),
            pa.DictionaryArray.from_arrays(metric_idx, [m for m, _, _ in METRICS]),
            pa.DictionaryArray.from_arrays(metric_idx, [s for _, s, _ in METRICS]),
            pa.DictionaryArray.from_arrays(metric_idx, [k for _, _, k in METRICS]),
            pa.array(le, mask=np.isnan(le)),
            pa.DictionaryArray.from_arrays(engine_idx, labels),
            pa.array(rng.random(n) * 1000),
            one(f"10.1.{pod // 250}.{pod % 250}:8000"),  # address
        ],
        schema=ENGINE_SAMPLES.arrow,
    )


def produce_arrow(bootstrap: str, prefix: str, messages: int, pods: int) -> None:
    bus = Bus(BusConfig(bootstrap_servers=bootstrap, topic_prefix=prefix))
    producer = bus.producer()
    rng = np.random.default_rng(1)
    for i in range(messages):
        producer.publish(ENGINE_SAMPLES, pod_scrape(i % pods, 1_700_000_000_000 + i * 1000, rng))
    producer.flush()
    producer.close()


def rows_committed(metrics_url: str) -> float:
    try:
        text = urllib.request.urlopen(metrics_url, timeout=1).read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmslo_ingest_rows_total{")
    )


@dataclass(frozen=True)
class IngestRun:
    samples_per_s: float  # all ingesters together
    peak_rss_mb: list[float]  # of each ingester
    cpu_s_per_million: float  # ingester CPU (user + sys): robust to other load on the machine


def _start_ingester(config: Path, db: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "llmslo", "-v", "ingest", "-c", str(config), "--db", str(db)],
            stderr=log,
            stdout=subprocess.DEVNULL,
        )


def run_llmslo(
    broker: EmbeddedBroker, workdir: Path, messages: int, ingesters: int = 1
) -> IngestRun:
    """``ingesters`` processes in one consumer group, each with its own file and /metrics."""
    prefix = f"b{time.time_ns()}."
    bus = Bus(
        BusConfig(bootstrap_servers=broker.bootstrap_servers, topic_prefix=prefix, partitions=8)
    ).start()
    bus.ensure_topics()
    ports = [free_port() for _ in range(ingesters)]
    group = f"bench-{prefix}"
    processes, logs = [], []
    for i, port in enumerate(ports):
        config = workdir / f"ingest-{i}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "bus": {"bootstrap_servers": broker.bootstrap_servers, "topic_prefix": prefix},
                    "ingest": {"metrics_port": port, "group_id": group},
                }
            )
        )
        logs.append(workdir / f"ingest-{i}.log")
        processes.append(_start_ingester(config, workdir / f"bench-{i}.duckdb", logs[-1]))
    procs = [psutil.Process(p.pid) for p in processes]
    peak_rss = [0] * ingesters
    urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]

    def committed() -> float:
        return sum(rows_committed(url) for url in urls)

    def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
                raise SystemExit(f"bench: the ingesters' {what} failed; see {workdir}/ingest-*.log")
            for i, proc in enumerate(procs):
                peak_rss[i] = max(peak_rss[i], proc.memory_info().rss)
            time.sleep(0.02)

    def joined() -> bool:
        return all("starts at offset" in log.read_text(errors="replace") for log in logs)

    wait_until(joined, "join")
    # Warm-up: one scrape of every pod, so the ingesters know the fleet's series (a running
    # ingester does); the first sight of ~500k new series costs extra, once. Peak RSS
    # counts it too. It also lets the group settle after the last member joined.
    produce_arrow(broker.bootstrap_servers, prefix, PODS, PODS)
    warm = PODS * ENGINES_PER_POD * len(METRICS)
    wait_until(lambda: committed() >= warm, "warm-up")
    total = warm + messages * ENGINES_PER_POD * len(METRICS)
    cpu_before = sum(sum(proc.cpu_times()[:2]) for proc in procs)
    started = time.perf_counter()
    producer = multiprocessing.Process(
        target=produce_arrow, args=(broker.bootstrap_servers, prefix, messages, PODS)
    )
    producer.start()
    wait_until(lambda: committed() >= total, "run")
    elapsed = time.perf_counter() - started
    cpu_s = sum(sum(proc.cpu_times()[:2]) for proc in procs) - cpu_before
    producer.join()
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=60)
    return IngestRun(
        (total - warm) / elapsed,
        [rss / 2**20 for rss in peak_rss],
        cpu_s / ((total - warm) / 1e6),
    )


def run_naive(broker: EmbeddedBroker, workdir: Path, samples: int) -> float:
    """One JSON message per sample, consumed and inserted one row at a time."""
    topic = f"naive{int(time.time())}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5)
    table = pod_scrape(0, 1_700_000_000_000, np.random.default_rng(2))
    rows = table.to_pylist()
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    con = duckdb.connect(str(workdir / "naive.duckdb"))
    con.execute(
        "CREATE TABLE samples (ts_ms BIGINT, instance VARCHAR, metric VARCHAR, labels_json VARCHAR, value DOUBLE)"
    )
    started = time.perf_counter()
    for i in range(samples):
        row = rows[i % len(rows)]
        producer.send(topic, json.dumps(row).encode(), key=row["instance"].encode())
    producer.flush()
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    stored = 0
    while stored < samples:
        for records in consumer.poll(timeout_ms=200).values():
            for record in records:
                row = json.loads(record.value)
                con.execute(
                    "INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                    [
                        row["ts_ms"],
                        row["instance"],
                        row["metric"],
                        row["labels_json"],
                        row["value"],
                    ],
                )
                stored += 1
    elapsed = time.perf_counter() - started
    producer.close()
    consumer.close()
    return samples / elapsed


def run_ceiling(workdir: Path, messages: int) -> float:
    """Arrow tables appended straight into DuckDB through the store, batch by batch."""
    rng = np.random.default_rng(3)
    tables = [pod_scrape(i % PODS, i, rng) for i in range(PODS + messages)]
    batch = 120  # ~250k rows per commit, like the ingester's default
    with Store(workdir / "ceiling.duckdb", memory_limit="192MB") as store:
        store.commit_batch(
            {"engine_samples": tables[:PODS]}, group_id="ceiling", offsets={}, now_ts_ms=0
        )  # warm-up
        tables = tables[PODS:]
        started = time.perf_counter()
        for first in range(0, len(tables), batch):
            store.commit_batch(
                {"engine_samples": tables[first : first + batch]},
                group_id="ceiling",
                offsets={},
                now_ts_ms=0,
            )
        elapsed = time.perf_counter() - started
    return sum(t.num_rows for t in tables) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small run (< 60 s)")
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs of each measurement (median reported)"
    )
    parser.add_argument(
        "--ingesters",
        type=int,
        default=1,
        help="also measure this many ingesters in one group (aggregate samples/s, each RSS)",
    )
    args = parser.parse_args()
    messages = 1_000 if args.quick else 5_000
    repeat = args.repeat or (1 if args.quick else 3)
    naive_samples = 5_000 if args.quick else 20_000
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        workdir = Path(tmp)
        runs = []
        for attempt in range(repeat):
            (workdir / f"run{attempt}").mkdir()
            runs.append(run_llmslo(broker, workdir / f"run{attempt}", messages))
        group_runs = []
        if args.ingesters > 1:
            for attempt in range(repeat):
                (workdir / f"group{attempt}").mkdir()
                group_runs.append(
                    run_llmslo(broker, workdir / f"group{attempt}", messages, args.ingesters)
                )
        naive = statistics.median(run_naive(broker, workdir, naive_samples) for _ in range(1))
        ceiling = statistics.median(run_ceiling(workdir, messages) for _ in range(repeat))
    rates = [run.samples_per_s for run in runs]
    samples_per_s = statistics.median(rates)
    peak_rss = max(max(run.peak_rss_mb) for run in runs)
    group: dict[str, object] = {}
    if group_runs:
        group_rate = statistics.median(run.samples_per_s for run in group_runs)
        group = {
            "ingesters": args.ingesters,
            "group_samples_per_s": round(group_rate),
            "group_speedup": round(
                group_rate / statistics.median(r.samples_per_s for r in runs), 2
            ),
            "group_peak_rss_mb": [
                round(max(mb)) for mb in zip(*(r.peak_rss_mb for r in group_runs), strict=True)
            ],
        }
        print(
            f"{args.ingesters} ingesters     : {group_rate:>12,.0f} samples/s together; peak RSS "
            f"{group['group_peak_rss_mb']} MB; cores: {os.cpu_count()}"
        )
    cpu_per_million = statistics.median(run.cpu_s_per_million for run in runs)
    print(
        f"llmslo ingest   : {samples_per_s:>12,.0f} samples/s  (runs: {', '.join(f'{r:,.0f}' for r in rates)})"
    )
    print(f"naive baseline  : {naive:>12,.0f} samples/s  (JSON per sample, row inserts)")
    print(
        f"store ceiling   : {ceiling:>12,.0f} rows/s     (Store.commit_batch: series split + DuckDB Arrow append, no Kafka)"
    )
    print(
        f"ingester peak RSS: {peak_rss:,.0f} MB; ingester CPU {cpu_per_million:.2f} s per million samples"
    )
    print(
        json.dumps(
            {
                "bench": "ingest",
                "samples_per_s": round(samples_per_s),
                "naive_samples_per_s": round(naive),
                "ceiling_rows_per_s": round(ceiling),
                "ratio_vs_naive": round(samples_per_s / naive, 1),
                "peak_rss_mb": round(peak_rss),
                "ingester_cpu_s_per_million": round(cpu_per_million, 2),
                "cores": os.cpu_count(),
                **group,
            }
        )
    )


if __name__ == "__main__":
    main()
