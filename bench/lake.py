"""Benchmark: the Iceberg lake (``store.lake: iceberg``) beside today's local Parquet lake.

One run, side by side, on a loopback S3 server (moto's, started here) with a SQLite
catalog, and on a local warehouse directory as a second row:

* **append**: an ingester's commit path without Kafka: per batch (120 scrapes of a
  64-core vLLM pod, ~250k engine samples, the ingester's default batch) one Iceberg commit
  (:meth:`~pipeline.iceberg.lake.IcebergLake.append_batch`, Kafka offsets in the snapshot)
  then the DuckDB commit (:meth:`~pipeline.store.Store.commit_batch`), as
  :class:`~pipeline.ingest.Ingester` does: the next batch's append overlaps this one's DuckDB
  commit (and, for comparison, one after the other). Samples/s of one ingester, and of 2 ingester
  processes appending to the same table at once (their commits conflict and retry);
  Iceberg commit latency p50/p99; bytes per sample in the lake's Parquet files; CPU seconds
  per million samples of the one ingester's process (every thread: lake append, Parquet
  encoding, DuckDB commit) and of the S3 server beside it (on the same cores), with the
  1-minute load average before and after. "End to end" here is batch decoded → Iceberg
  commit (Parquet on S3, offsets in the snapshot) → DuckDB commit. Kafka is left out:
  ``bench/ingest.py`` measures the path from the broker (with the same commit).
* **SLO cycle**: ``--instances`` engine instances in 8 pools × ``config/slo.example.yaml``
  over 30 days. Raw rows (requests at ``--rps`` per instance, an SGLang TTFT histogram and
  KV gauges every 15 s) are generated for the last ``--tail-min`` minutes only and go
  through the product's path: into the Iceberg lake, then the jobs' mirror
  (:class:`~pipeline.iceberg.mirror.IcebergMirror`), then the rollups. The 30 days before
  are **synthetic rollup rows** (``slo_hour``/``slo_day`` for every key the raw tail made,
  ``slo_minute`` where the windows' edges read it): 30 days of raw minutes at 4,096
  instances would take hours to generate. A cycle (timed) is what the jobs do every
  ``slo.interval_s`` (15 s) for the SLOs: load the commits of the last 15 s from the lake
  (mirror refresh: between cycles the jobs fetch and store the new commits every second,
  as ``llmslo.roles`` does, so the refresh reads and stores the last second's and reports
  them all to the rollups), recompute the rollups' new minutes, evaluate every SLO and window
  from the kept window sums (:class:`~slo.window_sums.WindowSums`), write the statuses;
  then, after the timed cycle (as ``llmslo.roles`` does between cycles), checkpoint the
  jobs' file, so DuckDB's automatic checkpoint never lands in a cycle's commits (timed
  apart), the startup heap frozen as the role freezes it after its first cycle.
  Beside the cycle, timed apart, the request rollup (``request_minute`` and the latency
  digests, for the dashboards), which ``SloJobs.run_once`` also runs every cycle: one
  :class:`~slo.rollups.requests.RequestRollup` kept across cycles, told each refresh's
  rows as the SLO rollups are (``SloJobs.note_written``); the cycle with it is the **jobs
  cycle** figure (without the signal detectors and flags, below). ``--baseline`` also times, in the same cycles, a second mirror that fetches nothing ahead
  and the full evaluation (the path before both), and checks both evaluations agree. The same cycle runs over the local lake (hourly Parquet,
  :func:`pipeline.lake.create_lake_views`) with the same rollups (there, not told what was
  written, each update recomputes the settle window). The signal detectors
  and flags (the rest of ``SloJobs.run_once``) are not in it: ``bench/signals.py`` times
  them over the same fleet's shape.
* **1-hour raw query**: per-instance requests and p99 TTFT over the last hour, from the
  Iceberg table (pyiceberg scan pruned by hour, into DuckDB) and from the local lake.

Medians of ``--repeat`` runs. ``--quick`` (< 60 s; 37 s of CPU): 256 instances, 4 batches, 3 cycles.
The last line is one JSON object. Usage:
``python bench/lake.py [--quick] [--cycle-only | --append-only] [--baseline]
[--instances 4096] [--rps 0.5] [--tail-min 25]`` (``--cycle-only``: the SLO cycle and the 1-hour query, no append figures;
``--append-only``: the append figures alone).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from llmslo.roles import FOLLOW_EVERY_S, JOBS_CHECKPOINT_THRESHOLD  # noqa: E402
from pipeline._offsets import LogIdentity, StoredOffset  # noqa: E402
from pipeline.broker import free_port  # noqa: E402
from pipeline.codec import conform  # noqa: E402
from pipeline.iceberg.config import IcebergConfig  # noqa: E402
from pipeline.iceberg.lake import IcebergLake  # noqa: E402
from pipeline.iceberg.mirror import IcebergMirror  # noqa: E402
from pipeline.iceberg.tables import lake_topics  # noqa: E402
from pipeline.lake import create_lake_views, export_hours  # noqa: E402
from pipeline.processes import freeze_startup_heap  # noqa: E402
from pipeline.schema import ENGINE_SAMPLES, REQUEST_RECORDS  # noqa: E402
from pipeline.store import Store  # noqa: E402
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS  # noqa: E402
from slo.evaluate import evaluate  # noqa: E402
from slo.rollups.counts import Rollup  # noqa: E402
from slo.rollups.requests import RequestRollup  # noqa: E402
from slo.sinks import create_output_tables, write_status  # noqa: E402
from slo.spec import load_spec  # noqa: E402
from slo.spec.model import SloModel, build_model  # noqa: E402
from slo.tables import REQUEST_ROLLUP_TABLES, ROLLUP_TABLES  # noqa: E402
from slo.window_sums import WindowSums  # noqa: E402

PREFIX = "bench."
LOG = LogIdentity("bench-cluster", "bench-topic")
POOLS = 8
INTERVAL_MS = 15_000
#: Mid-hour on purpose: the windows' edges cut hours and days.
NOW_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS + 37 * MINUTE_MS
BUCKETS = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, float("inf")]
SCRAPES_PER_BATCH = 120


# --- object store ------------------------------------------------------------------------


@contextmanager
def moto_s3() -> Iterator[tuple[str, int]]:
    """moto's S3 server on a free loopback port with bucket ``lake``; yields its endpoint
    and process id."""
    import boto3

    binary = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if binary is None:
        raise SystemExit("bench: moto_server is missing: pip install 'moto[server]'")
    port = free_port()
    process = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
                    Bucket="lake"
                )
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield endpoint, process.pid
    finally:
        process.kill()
        process.wait()


def lake_config(where: str, tmp: Path, name: str) -> IcebergConfig:
    """An S3 warehouse on moto (``where`` its endpoint) or a local one (``where == "local"``)."""
    catalog = f"sqlite:///{tmp / name}-catalog.db"
    if where == "local":
        return IcebergConfig(catalog_uri=catalog, warehouse=str(tmp / f"{name}-warehouse"))
    return IcebergConfig(catalog_uri=catalog, warehouse=f"s3://lake/{name}", s3_endpoint=where)


# --- append ------------------------------------------------------------------------------


def scrape_batch(first: int) -> pa.Table:
    """120 scrapes of 64-core vLLM pods (bench/ingest.py's messages) as one batch."""
    from bench.ingest import PODS, pod_scrape

    rng = np.random.default_rng(first)
    return pa.concat_tables(
        pod_scrape((first + i) % PODS, 1_790_000_000_000 + (first + i) * 1000, rng)
        for i in range(SCRAPES_PER_BATCH)
    )


def append_run(
    config: IcebergConfig,
    db: Path,
    batches: int,
    partition: int,
    *,
    overlap: bool = True,
    server_pids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """One ingester's commit path over ``batches`` batches: lake, then DuckDB. With
    ``overlap`` as :class:`~pipeline.ingest.Ingester` commits: batch N+1's lake append (on
    a thread of its own) overlaps batch N's DuckDB commit; without it one after the other
    (the ingester before the overlap). Its wall and CPU seconds (every thread of this
    process, and of ``server_pids``: the S3 server's)."""
    lake = IcebergLake(config, group_id="bench", topics=lake_topics(PREFIX))
    topic = PREFIX + ENGINE_SAMPLES.topic
    data = [scrape_batch(i * SCRAPES_PER_BATCH) for i in range(batches + 1)]
    latencies, conflicts, rows = [], 0, 0
    with Store(db) as store:
        store.commit_batch(  # warm-up: the pods' series are known, as a running ingester's are
            {"engine_samples": [data[0]]}, group_id="bench", offsets={}, now_ts_ms=0
        )
        times: dict[str, float] = {}
        with timed(times, "append", *server_pids), ThreadPoolExecutor(1) as lake_thread:
            pending: dict[str, Any] | None = None  # the DuckDB commit of the batch before
            for n, batch in enumerate(data[1:]):
                offsets = {(topic, partition): StoredOffset(n + 1, LOG)}
                appending = lake_thread.submit(
                    lake.append_batch, {"engine_samples": [batch]}, offsets
                )
                if not overlap:
                    appending.result()
                if pending is not None:
                    store.commit_batch(**pending)
                report = appending.result()
                pending = {"rows": {"engine_samples": [batch]}, "offsets": offsets}
                pending |= {"group_id": "bench", "now_ts_ms": 0}
                latencies.append(report.seconds)
                conflicts += report.conflicts
                rows += batch.num_rows
            if pending is not None:
                store.commit_batch(**pending)
    return {
        "rows": rows,
        "seconds": times["append_s"],
        "cpu_s": times["append_cpu_s"],
        "s3_cpu_s": times["append_s3_cpu_s"],
        "latencies": latencies,
        "conflicts": conflicts,
    }


def _append_child(config: IcebergConfig, db: Path, batches: int, partition: int, out: Any) -> None:
    out.put(append_run(config, db, batches, partition))


def bytes_per_sample(config: IcebergConfig) -> float:
    lake = IcebergLake(config, group_id="bench", topics=lake_topics(PREFIX))
    table = lake.table("engine_samples")
    files = [task.file for task in table.scan().plan_files()]
    return sum(f.file_size_in_bytes for f in files) / max(1, sum(f.record_count for f in files))


def measure_append(
    where: str, tmp: Path, batches: int, server_pids: tuple[int, ...] = ()
) -> dict[str, Any]:
    """One ingester (its lake appends overlapping its DuckDB commits, then one after the
    other for comparison), then two processes at once, on a fresh table each. CPU seconds
    per million samples: the ingester process's (all its threads: lake, Parquet, DuckDB)
    and the S3 server's (``server_pids``) while the one ingester ran."""
    load_before = os.getloadavg()[0]
    one = append_run(
        lake_config(where, tmp, "one"), tmp / "one.duckdb", batches, 0, server_pids=server_pids
    )
    load_after = os.getloadavg()[0]
    serial = append_run(
        lake_config(where, tmp, "serial"), tmp / "serial.duckdb", batches, 0, overlap=False
    )
    two_config = lake_config(where, tmp, "two")
    IcebergLake(two_config, group_id="bench", topics=lake_topics(PREFIX))  # table created once
    queue: Any = multiprocessing.get_context("fork").Queue()
    children = [
        multiprocessing.get_context("fork").Process(
            target=_append_child, args=(two_config, tmp / f"two-{i}.duckdb", batches, i, queue)
        )
        for i in range(2)
    ]
    for child in children:
        child.start()
    results = [queue.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    lat = sorted(one["latencies"])
    millions = one["rows"] / 1e6
    return {
        "samples_per_s": one["rows"] / one["seconds"],
        "cpu_s_per_m_samples": one["cpu_s"] / millions,
        "s3_server_cpu_s_per_m_samples": one["s3_cpu_s"] / millions,
        "load_1m_before": load_before,
        "load_1m_after": load_after,
        "serial_samples_per_s": serial["rows"] / serial["seconds"],
        "two_samples_per_s": sum(r["rows"] for r in results) / max(r["seconds"] for r in results),
        "two_conflicts": sum(r["conflicts"] for r in results),
        "commit_p50_s": float(np.percentile(lat, 50)),
        "commit_p99_s": float(np.percentile(lat, 99)),
        "bytes_per_sample": bytes_per_sample(lake_config(where, tmp, "one")),
        "batch_rows": one["rows"] // batches,
    }


# --- the fleet's raw tail ------------------------------------------------------------------


def _names(instances: int) -> list[str]:
    return [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000" for i in range(instances)]


def _dict(indices: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), values)


def tap_records(
    t0: int,
    instances: int,
    inst: np.ndarray,
    bad: np.ndarray,
    received_ts: np.ndarray,
    ttft: np.ndarray,
    tpot: np.ndarray,
    jitter: np.ndarray,
    prompts: np.ndarray | None = None,
) -> pa.Table:
    """Tap request records from drawn columns: instance index, failed (502 before the first
    token), receive time, TTFT, TPOT, ITL jitter and, if given, prompt tokens (else not
    reported); 200 tokens each, ids from ``t0``."""
    n = len(inst)
    ids = pc.binary_join_element_wise(
        "r", pa.array(np.arange(n) + t0 * 10_000).cast(pa.string()), ""
    )
    pools = [f"pool-{p}" for p in range(POOLS)]
    columns = {
        "request_id": ids,
        "original_request_id": ids,
        "attempt": pa.array(np.ones(n, np.int16)),
        "instance": _dict(inst, _names(instances)),
        "pool": _dict(inst % POOLS, pools),
        "route": _dict(np.zeros(n), ["/v1/chat/completions"]),
        "streamed": pa.array(np.ones(n, bool)),
        "received_ts_ms": pa.array(received_ts.astype(np.int64)),
        "http_status": pa.array(np.where(bad, 502, 200).astype(np.int16)),
        "outcome": _dict(bad.astype(np.int32), ["ok", "error_before_first_token"]),
        "ttft_s": pa.array(ttft, mask=bad),
        "tpot_s": pa.array(tpot, mask=bad),
        "e2e_s": pa.array(ttft + tpot * 200, mask=bad),
        "completion_tokens": pa.array(np.full(n, 200, np.int32)),
        "token_chunks": pa.array(np.full(n, 200, np.int32)),
        "itl_count": pa.array(np.full(n, 199, np.int32)),
        "itl_p99_s": pa.array(tpot * 1.5, mask=bad),
        "itl_jitter_s": pa.array(jitter, mask=bad),
    }
    if prompts is not None:
        columns["prompt_tokens"] = pa.array(prompts.astype(np.int32))
    return conform(REQUEST_RECORDS, pa.table(columns))


def fleet_requests(
    t0: int, t1: int, instances: int, rps: float, rng: np.random.Generator
) -> pa.Table:
    """Tap records received in [t0, t1): 0.3 % failed, log-normal TTFT and TPOT."""
    n = int(instances * rps * (t1 - t0) / 1000)
    inst = rng.integers(0, instances, n)
    bad = rng.random(n) < 0.003
    ttft = rng.lognormal(np.log(0.4), 0.6, n)
    tpot = rng.lognormal(np.log(0.03), 0.4, n)
    received = np.sort(rng.integers(t0, t1, n))
    return tap_records(t0, instances, inst, bad, received, ttft, tpot, tpot * 0.5)


def fleet_engine(t0: int, t1: int, instances: int) -> pa.Table:
    """Every instance's scrapes in [t0, t1), one per 15 s: an SGLang TTFT histogram (buckets
    and count, cumulative) and its KV usage and running gauges."""
    scrapes = np.arange(t0 + (-t0) % INTERVAL_MS, t1, INTERVAL_MS)  # from the first at or after t0
    per = len(BUCKETS) + 3
    signal = ["ttft"] * (len(BUCKETS) + 1) + ["kv_usage", "running"]
    kind = ["bucket"] * len(BUCKETS) + ["count", "gauge", "gauge"]
    metric = ["sglang:time_to_first_token_seconds_bucket"] * len(BUCKETS)
    metric += ["sglang:time_to_first_token_seconds_count", "sglang:token_usage"]
    metric += ["sglang:num_running_reqs"]
    n = len(scrapes) * instances * per
    ts = scrapes[np.repeat(np.arange(len(scrapes)), instances * per)]
    inst = np.tile(np.repeat(np.arange(instances), per), len(scrapes))
    m = np.tile(np.arange(per), len(scrapes) * instances)
    count = (0.5 + (inst % 7) * 0.1) * (ts - 1_700_000_000_000) / 1000
    share = np.array([0.05, 0.3, 0.7, 0.95, 0.995, 0.999, 1.0, 1.0, 1.0, 0, 0])
    value = np.where(m <= len(BUCKETS), np.floor(count * share[m]), 0.0)
    value = np.where(m == per - 2, 0.4 + 0.1 * np.sin(ts / 6e5 + inst), value)
    value = np.where(m == per - 1, 8.0, value)
    le = np.array([*BUCKETS, 0, 0, 0])[m]
    pools = [f"pool-{p}" for p in range(POOLS)]
    return conform(
        ENGINE_SAMPLES,
        pa.table(
            {
                "ts_ms": pa.array(ts.astype(np.int64)),
                "instance": _dict(inst, _names(instances)),
                "address": _dict(inst, _names(instances)),
                "pool": _dict(inst % POOLS, pools),
                "dialect": _dict(np.zeros(n), ["sglang"]),
                "model": _dict(inst % POOLS, pools),
                "engine": _dict(np.zeros(n), [""]),
                "metric": _dict(m, metric),
                "signal": _dict(m, signal),
                "kind": _dict(m, kind),
                "le": pa.array(le, mask=m >= len(BUCKETS)),
                "labels_json": _dict(np.zeros(n), ['{"model_name":"m"}']),
                "value": pa.array(value),
            }
        ),
    )


class Fleet:
    """The raw rows of [t0, t1), appended to an Iceberg lake in ``commits`` commits."""

    def __init__(self, instances: int, rps: float) -> None:
        self.instances, self.rps = instances, rps
        self.rng = np.random.default_rng(7)
        self.offset = 0

    def rows(self, t0: int, t1: int) -> dict[str, pa.Table]:
        return {
            "requests": fleet_requests(t0, t1, self.instances, self.rps, self.rng),
            "engine_samples": fleet_engine(t0, t1, self.instances),
        }

    def append(
        self,
        lake: IcebergLake,
        t0: int,
        t1: int,
        commits: int,
        after_commit: Callable[[int], object] | None = None,
    ) -> dict[str, pa.Table]:
        """``after_commit(k)`` after the k-th commit (from 1)."""
        rows = self.rows(t0, t1)
        step = -(-(t1 - t0) // commits)
        for a in range(t0, t1, step):
            self.offset += 1
            part = {}
            for name, table in rows.items():
                column = "received_ts_ms" if name == "requests" else "ts_ms"
                ts = table.column(column)
                mask = pc.and_(pc.greater_equal(ts, a), pc.less(ts, min(t1, a + step)))
                part[name] = [table.filter(mask)]
            offsets = {
                (PREFIX + schema.topic, 0): StoredOffset(self.offset, LOG)
                for schema in (REQUEST_RECORDS, ENGINE_SAMPLES)
            }
            lake.append_batch(part, offsets)
            if after_commit is not None:
                after_commit((a - t0) // step + 1)
        return rows


# --- the SLO cycle -------------------------------------------------------------------------


def synthesize_history(con: duckdb.DuckDBPyConnection, tail_start_ms: int, days: int) -> None:
    """30 days of rollup rows before the raw tail, for every key the tail's rollups made:
    hours and days everywhere, minutes where the windows' edges read them (the 2 hours
    before the tail, and the hours where the 1 d, 3 d, 28 d and 30 d windows start)."""
    first_hour = tail_start_ms // HOUR_MS * HOUR_MS
    counts = "(SELECT slo_id, key_id, 20 + key_id % 13 AS t FROM slo_keys) k"
    con.execute(
        f"""INSERT INTO slo_hour SELECT slo_id, key_id, h, 60 * t, 60 * t // 500
            FROM {counts}, range({first_hour - (days + 1) * DAY_MS}, {first_hour},
                                 {HOUR_MS}) r(h) ORDER BY h"""
    )
    con.execute("DELETE FROM slo_day")
    con.execute(
        f"""INSERT INTO slo_day SELECT slo_id, key_id, ts_ms // {DAY_MS} * {DAY_MS} AS d,
            sum(total), sum(bad) FROM slo_hour GROUP BY ALL ORDER BY d"""
    )
    edges = [(first_hour - 2 * HOUR_MS, tail_start_ms)]
    edges += [
        ((NOW_MS - w) // HOUR_MS * HOUR_MS, (NOW_MS - w) // HOUR_MS * HOUR_MS + 2 * HOUR_MS)
        for w in (DAY_MS, 3 * DAY_MS, 28 * DAY_MS, 30 * DAY_MS)
    ]
    for a, b in edges:
        con.execute(
            f"""INSERT INTO slo_minute SELECT slo_id, key_id, m, t, t // 500
                FROM {counts}, range({a}, {b}, {MINUTE_MS}) r(m) ORDER BY m"""
        )
    con.execute("CHECKPOINT")


def slo_cycle(
    con: duckdb.DuckDBPyConnection,
    model: SloModel,
    rollup: Rollup,
    now_ms: int,
    request_rollup: RequestRollup,
    sums: WindowSums | None = None,
    baseline: bool = False,
) -> dict[str, float]:
    """The SLO part of a jobs cycle: the rollups' new minutes, every window, the statuses,
    and, timed apart, the request rollup (the dashboards' latency digests, not the SLOs',
    also in every cycle of ``SloJobs.run_once``). With ``sums`` the evaluation reads the
    kept window sums (as the jobs do); ``baseline`` also times the full evaluation (the
    jobs' before them) and checks both agree."""
    times: dict[str, float] = {}
    with timed(times, "rollup"):
        rollup.update(now_ms)
    with timed(times, "request_rollup"):
        request_rollup.update(now_ms)
    if sums is not None:
        sums.note_changes(rollup.take_changes())
    with timed(times, "evaluate"):
        statuses = evaluate(con, model, now_ms, sums)
    if baseline:
        with timed(times, "evaluate_full"):
            full = evaluate(con, model, now_ms)
        if [(s.slo.id, s.group, s.windows) for s in full] != [
            (s.slo.id, s.group, s.windows) for s in statuses
        ]:
            raise SystemExit(f"bench: kept window sums differ from the full evaluation at {now_ms}")
    with timed(times, "write"):
        write_status(con, statuses)
    times["statuses"] = len(statuses)
    return times


@contextmanager
def timed(times: dict[str, float], step: str, *pids: int) -> Iterator[None]:
    """Wall seconds of the block as ``times[step + "_s"]``, CPU seconds of this process's
    threads as ``times[step + "_cpu_s"]`` and of the processes ``pids`` (the S3 server) as
    ``times[step + "_s3_cpu_s"]``: on a host shared with other work the CPU time is what
    the step would take alone (up to its parallelism)."""
    procs = [psutil.Process(pid) for pid in pids]

    def s3_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    wall, used, s3_used = time.perf_counter(), time.process_time(), s3_cpu()
    yield
    times[f"{step}_s"] = time.perf_counter() - wall
    times[f"{step}_cpu_s"] = time.process_time() - used
    times[f"{step}_s3_cpu_s"] = s3_cpu() - s3_used


def copy_rollups(source: Path, con: duckdb.DuckDBPyConnection) -> None:
    """The rollup tables of the jobs file ``source`` into ``con`` (the local lake's jobs)."""
    con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
    for doc in (*ROLLUP_TABLES.values(), *REQUEST_ROLLUP_TABLES.values()):
        doc.create(con)
        con.execute(f"INSERT INTO {doc.name} SELECT * FROM src.{doc.name}")
    con.execute("DETACH src")
    create_output_tables(con)


def hour_query_iceberg(lake: IcebergLake, now_ms: int) -> int:
    table = lake.table("requests")
    table.refresh()
    scan = table.scan(
        row_filter=f"received_ts_ms >= {now_ms - HOUR_MS}",
        selected_fields=("instance", "ttft_s", "received_ts_ms"),
    )
    with duckdb.connect() as con:
        con.register("rows", scan.to_arrow())
        got = con.execute(
            "SELECT instance, count(*), quantile_disc(ttft_s, 0.99) FROM rows "
            f"WHERE received_ts_ms >= {now_ms - HOUR_MS} GROUP BY instance"
        ).fetchall()
    return len(got)


def hour_query_local(con: duckdb.DuckDBPyConnection, now_ms: int) -> int:
    return len(
        con.execute(
            "SELECT instance, count(*), quantile_disc(ttft_s, 0.99) FROM requests "
            "WHERE received_ts_ms >= ? GROUP BY instance",
            [now_ms - HOUR_MS],
        ).fetchall()
    )


def measure_cycle(
    where: str,
    tmp: Path,
    instances: int,
    rps: float,
    tail_min: int,
    cycles: int,
    commits: int,
    s3_pid: int,
    baseline: bool = False,
) -> dict[str, Any]:
    model = build_model(load_spec(ROOT / "config" / "slo.example.yaml"))
    config = lake_config(where, tmp, "fleet")
    lake = IcebergLake(config, group_id="bench", topics=lake_topics(PREFIX))
    fleet = Fleet(instances, rps)
    tail_start = NOW_MS - tail_min * MINUTE_MS
    ingester = Store(tmp / "ingester.duckdb")
    started = time.perf_counter()
    for a in range(tail_start, NOW_MS, 5 * MINUTE_MS):  # the tail, a few large commits
        rows = fleet.append(lake, a, min(NOW_MS, a + 5 * MINUTE_MS), 1)
        ingester.commit_batch({k: [v] for k, v in rows.items()}, group_id="b", offsets={},
                              now_ts_ms=0)  # fmt: skip
    print(f"raw tail of {tail_min} min in both lakes: {time.perf_counter() - started:.1f} s",
          file=sys.stderr)  # fmt: skip
    jobs_path = tmp / "jobs-iceberg.duckdb"
    jobs = Store(jobs_path)
    create_output_tables(jobs.con)
    mirror = IcebergMirror(lake, jobs, window_ms=2 * DAY_MS)
    mirror.refresh(NOW_MS)
    first = Rollup(jobs.con, model), RequestRollup(jobs.con)
    slo_cycle(jobs.con, model, first[0], NOW_MS - INTERVAL_MS, first[1])  # the first build
    synthesize_history(jobs.con, tail_start, 31)
    keys = jobs.con.execute("SELECT count(*) FROM slo_keys").fetchone()
    hours = jobs.con.execute("SELECT count(*) FROM slo_hour").fetchone()
    jobs.close()
    local_dir = tmp / "local-lake"
    local_con = duckdb.connect(str(tmp / "jobs-local.duckdb"))
    copy_rollups(jobs_path, local_con)
    # As llmslo.roles opens it: the jobs checkpoint after each cycle, never inside one.
    jobs = Store(jobs_path, checkpoint_threshold=JOBS_CHECKPOINT_THRESHOLD)
    mirror = IcebergMirror(lake, jobs, window_ms=2 * DAY_MS)
    # The jobs' rollups are told what each refresh loaded (llmslo.roles does the same); the
    # local lake's are not (its views have no such report): they recompute the settle window.
    rollup, local_rollup = Rollup(jobs.con, model), Rollup(local_con, model)
    # One request rollup each, kept across cycles as SloJobs keeps it (told, as the rollup).
    request_rollup, local_request_rollup = RequestRollup(jobs.con), RequestRollup(local_con)
    for told in (rollup, request_rollup):
        told.note_written({})  # from here on told every refresh's rows
        told.update(NOW_MS - INTERVAL_MS)  # a process's first update: its settle window
    # The jobs' kept window sums, filled by a first evaluation (a process's first cycle).
    sums, local_sums = WindowSums(jobs.con, model), WindowSums(local_con, model)
    rollup.take_changes()
    evaluate(jobs.con, model, NOW_MS - INTERVAL_MS, sums)
    evaluate(local_con, model, NOW_MS - INTERVAL_MS, local_sums)
    # The baseline's mirror fetches nothing ahead: its refresh reads the 15 s of commits.
    base_store = Store(tmp / "jobs-baseline.duckdb") if baseline else None
    base_mirror = IcebergMirror(lake, base_store, window_ms=2 * DAY_MS) if base_store else None
    if base_mirror is not None:
        base_mirror.refresh(NOW_MS)
    # Between cycles the jobs follow the lake (llmslo.roles: a fetch every FOLLOW_EVERY_S):
    # one fetch a second of commits, the last second's left to the cycle's refresh.
    per_fetch = max(1, round(FOLLOW_EVERY_S * 1000 * commits / INTERVAL_MS))
    fetches: list[float] = []

    def follow(k: int) -> None:
        if k % per_fetch == 0 and k + per_fetch <= commits:
            mark = time.perf_counter()
            mirror.fetch(now - INTERVAL_MS + k * INTERVAL_MS // commits)
            fetches.append(time.perf_counter() - mark)

    freeze_startup_heap()  # as llmslo.roles does after the jobs' first cycle
    iceberg_times, local_times, hour_ice, hour_local = [], [], [], []
    baseline_times: list[float] = []
    steps: list[dict[str, float]] = []
    local_steps: list[dict[str, float]] = []
    for k in range(cycles):
        now = NOW_MS + k * INTERVAL_MS
        rows = fleet.append(lake, now - INTERVAL_MS, now, commits, follow)  # the last 15 s
        ingester.commit_batch({n: [t] for n, t in rows.items()}, group_id="b", offsets={},
                              now_ts_ms=0)  # fmt: skip
        export_hours(ingester, local_dir, "ingester-a", now_ts_ms=now, include_open=True)
        times: dict[str, float] = {}
        with timed(times, "refresh", s3_pid):
            report = mirror.refresh(now)
            rollup.note_written(report.changed_from_ms)
            request_rollup.note_written(report.changed_from_ms)  # as SloJobs.note_written
        times.update(slo_cycle(jobs.con, model, rollup, now, request_rollup, sums, baseline))
        parts = ("refresh", "rollup", "evaluate", "write")
        times["cycle_cpu_s"] = sum(times[f"{p}_cpu_s"] for p in parts)
        times["cycle_s3_cpu_s"] = times["refresh_s3_cpu_s"]
        iceberg_times.append(sum(times[f"{p}_s"] for p in parts))
        # The whole jobs cycle's rollups and writes: the SLO cycle and the request rollup.
        times["jobs_cycle_s"] = iceberg_times[-1] + times["request_rollup_s"]
        times["jobs_cycle_cpu_s"] = times["cycle_cpu_s"] + times["request_rollup_cpu_s"]
        with timed(times, "checkpoint"):  # between cycles, as llmslo.roles does
            jobs.checkpoint()
        if base_mirror is not None:
            with timed(times, "refresh_full", s3_pid):
                base_mirror.refresh(now)
            baseline_times.append(
                iceberg_times[-1]
                - times["refresh_s"]
                + times["refresh_full_s"]
                - times["evaluate_s"]
                + times["evaluate_full_s"]
            )
        refresh = times["refresh_s"]
        steps.append(times)
        create_lake_views(local_con, local_dir)
        local = slo_cycle(local_con, model, local_rollup, now, local_request_rollup, local_sums)
        local["cycle_cpu_s"] = sum(local[f"{p}_cpu_s"] for p in ("rollup", "evaluate", "write"))
        local_times.append(local["rollup_s"] + local["evaluate_s"] + local["write_s"])
        local_steps.append(local)
        print(
            f"cycle {k}: iceberg {iceberg_times[-1]:.3f} s (refresh {refresh:.3f} s of "
            f"{report.files} files, {len(report.planned)} tables planned whole, rollup {times['rollup_s']:.3f}, evaluate "
            f"{times['evaluate_s']:.3f}"
            + (
                f" (full {times['evaluate_full_s']:.3f}; baseline refresh "
                f"{times['refresh_full_s']:.3f}, CPU {times['refresh_full_cpu_s']:.3f})"
                if baseline
                else ""
            )
            + f", write {times['write_s']:.3f}; {times['statuses']:.0f} "
            f"statuses; request rollup {times['request_rollup_s']:.3f} s (CPU "
            f"{times['request_rollup_cpu_s']:.3f}) beside it, jobs cycle with it "
            f"{times['jobs_cycle_s']:.3f} s (CPU {times['jobs_cycle_cpu_s']:.3f}); CPU "
            f"{times['cycle_cpu_s']:.3f} s: refresh {times['refresh_cpu_s']:.3f} (and the S3 "
            f"server's {times['refresh_s3_cpu_s']:.3f}), "
            f"rollup {times['rollup_cpu_s']:.3f}, evaluate {times['evaluate_cpu_s']:.3f}, "
            f"write {times['write_cpu_s']:.3f}); checkpoint after it {times['checkpoint_s']:.3f} "
            f"s (CPU {times['checkpoint_cpu_s']:.3f}); local lake {local_times[-1]:.3f} s (rollup "
            f"{local['rollup_s']:.3f}, evaluate {local['evaluate_s']:.3f}; CPU "
            f"{local['cycle_cpu_s']:.3f} s)",
            file=sys.stderr,
        )
        mark = time.perf_counter()
        hour_query_iceberg(lake, now)
        hour_ice.append(time.perf_counter() - mark)
        mark = time.perf_counter()
        hour_query_local(local_con, now)
        hour_local.append(time.perf_counter() - mark)
    jobs.close()
    ingester.close()
    local_con.close()
    if base_store is not None:
        base_store.close()
    return {
        "cycle_s": statistics.median(iceberg_times),
        **{
            f"cycle_{key}": statistics.median(t[key] for t in steps)
            for key in (
                *(f"{p}_s" for p in ("refresh", "rollup", "evaluate", "write")),
                *(f"{p}_cpu_s" for p in ("refresh", "rollup", "evaluate", "write")),
            )
        },
        "cycle_cpu_s": statistics.median(t["cycle_cpu_s"] for t in steps),
        "cycle_s3_server_cpu_s": statistics.median(t["cycle_s3_cpu_s"] for t in steps),
        **{
            key: statistics.median(t[key] for t in steps)
            for key in (
                "request_rollup_s",
                "request_rollup_cpu_s",
                "jobs_cycle_s",
                "jobs_cycle_cpu_s",
            )
        },
        "request_rollup_local_lake_cpu_s": statistics.median(
            t["request_rollup_cpu_s"] for t in local_steps
        ),
        "checkpoint_after_s": statistics.median(t["checkpoint_s"] for t in steps),
        "checkpoint_after_cpu_s": statistics.median(t["checkpoint_cpu_s"] for t in steps),
        "fetch_ahead_s": statistics.median(fetches) if fetches else 0.0,
        "fetches_per_cycle": len(fetches) / cycles,
        **(
            {
                "cycle_baseline_s": statistics.median(baseline_times),
                "cycle_evaluate_full_s": statistics.median(t["evaluate_full_s"] for t in steps),
                "cycle_refresh_full_s": statistics.median(t["refresh_full_s"] for t in steps),
                "cycle_refresh_full_cpu_s": statistics.median(
                    t["refresh_full_cpu_s"] for t in steps
                ),
                "cycle_baseline_cpu_s": statistics.median(
                    t["cycle_cpu_s"]
                    - t["refresh_cpu_s"]
                    + t["refresh_full_cpu_s"]
                    - t["evaluate_cpu_s"]
                    + t["evaluate_full_cpu_s"]
                    for t in steps
                ),
                "cycle_evaluate_full_cpu_s": statistics.median(
                    t["evaluate_full_cpu_s"] for t in steps
                ),
            }
            if baseline
            else {}
        ),
        "cycle_local_lake_s": statistics.median(local_times),
        "cycle_local_lake_cpu_s": statistics.median(t["cycle_cpu_s"] for t in local_steps),
        "hour_query_s": statistics.median(hour_ice),
        "hour_query_local_lake_s": statistics.median(hour_local),
        "rollup_keys": int(keys[0]) if keys else 0,
        "slo_hour_rows": int(hours[0]) if hours else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="256 instances, 4 batches, 3 cycles (< 60 s)"
    )
    parser.add_argument("--instances", type=int, default=None, help="default 4096")
    parser.add_argument("--rps", type=float, default=0.5, help="requests/s per instance")
    parser.add_argument("--tail-min", type=int, default=25, help="minutes of raw rows")
    parser.add_argument("--batches", type=int, default=None, help="appended per ingester")
    parser.add_argument("--cycles", type=int, default=None, help="timed cycles (median)")
    parser.add_argument(
        "--commits",
        type=int,
        default=None,
        help="Iceberg commits per 15 s (default 30: 0.5 s batches)",
    )
    parser.add_argument("--cycle-only", action="store_true",
                        help="only the SLO cycle and the 1-hour query (no append figures)")  # fmt: skip
    parser.add_argument("--append-only", action="store_true",
                        help="only the append figures (no SLO cycle, no hour query)")  # fmt: skip
    parser.add_argument("--baseline", action="store_true",
                        help="also time each cycle's full evaluation (the path before the kept "
                        "window sums) and check both agree")  # fmt: skip
    parser.add_argument("--local-warehouse", action="store_true",
                        help="also the append figures over a local warehouse directory")  # fmt: skip
    args = parser.parse_args(argv)
    if args.cycle_only and args.append_only:
        parser.error("--cycle-only and --append-only exclude each other")
    instances = args.instances or (256 if args.quick else 4096)
    batches = args.batches or (4 if args.quick else 20)
    cycles = args.cycles or (3 if args.quick else 5)
    commits = args.commits or (5 if args.quick else 30)
    tail_min = 12 if args.quick and args.tail_min == 25 else args.tail_min
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    result: dict[str, Any] = {"bench": "lake", "cores": os.cpu_count(), "instances": instances}
    with moto_s3() as (endpoint, s3_pid), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if not args.cycle_only:
            measure_appends(endpoint, tmp, batches, args.local_warehouse, result, (s3_pid,))
        if args.append_only:
            print(json.dumps(result))
            return 0
        (tmp / "cycle").mkdir()
        cycle = measure_cycle(
            endpoint,
            tmp / "cycle",
            instances,
            args.rps,
            tail_min,
            cycles,
            commits,
            s3_pid,
            args.baseline,
        )
        result.update({k: round(v, 4) for k, v in cycle.items()})
    print(
        f"SLO cycle, 30 d x {instances} instances x example spec: {cycle['cycle_s']:.3f} s "
        f"over Iceberg (mirror refresh {cycle['cycle_refresh_s']:.3f} s; CPU "
        f"{cycle['cycle_cpu_s']:.3f} s and the S3 server's {cycle['cycle_s3_server_cpu_s']:.3f}"
        f" s), {cycle['cycle_local_lake_s']:.3f} s over the local "
        f"lake (CPU {cycle['cycle_local_lake_cpu_s']:.3f} s); with the request rollup (CPU "
        f"{cycle['request_rollup_cpu_s']:.3f} s) the jobs cycle {cycle['jobs_cycle_s']:.3f} s "
        f"(CPU {cycle['jobs_cycle_cpu_s']:.3f} s; over the local lake the request rollup's CPU "
        f"{cycle['request_rollup_local_lake_cpu_s']:.3f} s); 1-hour raw query "
        f"{cycle['hour_query_s']:.3f} s vs {cycle['hour_query_local_lake_s']:.3f} s",
        file=sys.stderr,
    )
    if args.baseline:
        print(
            f"baseline (full evaluation, same cycles): {cycle['cycle_baseline_s']:.3f} s, "
            f"evaluation {cycle['cycle_evaluate_full_s']:.3f} s vs "
            f"{cycle['cycle_evaluate_s']:.3f} s from the kept sums, refresh "
            f"{cycle['cycle_refresh_full_s']:.3f} s vs {cycle['cycle_refresh_s']:.3f} s after "
            f"fetching ahead ({cycle['fetches_per_cycle']:.0f} fetches a cycle, median "
            f"{cycle['fetch_ahead_s']:.3f} s each)",
            file=sys.stderr,
        )
    print(json.dumps(result))
    return 0


def measure_appends(
    endpoint: str,
    tmp: Path,
    batches: int,
    local_warehouse: bool,
    result: dict[str, Any],
    server_pids: tuple[int, ...] = (),
) -> None:
    """The append figures on moto's S3 (and on a local warehouse with ``local_warehouse``)."""
    (tmp / "s3").mkdir()
    s3 = measure_append(endpoint, tmp / "s3", batches, server_pids)
    print(
        f"append, S3 (moto) + SQLite: one ingester {s3['samples_per_s']:,.0f} samples/s "
        f"(CPU {s3['cpu_s_per_m_samples']:.2f} s per million samples, the S3 server's "
        f"{s3['s3_server_cpu_s_per_m_samples']:.2f} s; load {s3['load_1m_before']:.1f}"
        f"-{s3['load_1m_after']:.1f}) "
        f"({s3['serial_samples_per_s']:,.0f} with lake and DuckDB one after the other), "
        f"two together {s3['two_samples_per_s']:,.0f} ({s3['two_conflicts']} conflicts); "
        f"commit p50 {s3['commit_p50_s']:.3f} s p99 {s3['commit_p99_s']:.3f} s; "
        f"{s3['bytes_per_sample']:.2f} B/sample; {s3['batch_rows']:,} rows a batch",
        file=sys.stderr,
    )
    result["append_s3"] = {k: round(v, 4) for k, v in s3.items()}
    if local_warehouse:
        (tmp / "local").mkdir()
        local = measure_append("local", tmp / "local", batches)
        result["append_local_warehouse"] = {k: round(v, 4) for k, v in local.items()}
        print(f"append, local warehouse: {local}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
