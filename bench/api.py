"""Benchmark: canary verdict latency over 30 days × 64 instances of request records.

Fills a DuckDB file (through ``pipeline.store.Store``) with request records of 64 instances
over 30 days (``--per-hour`` requests per instance and hour; ``--quick`` uses fewer), then
times, in the same run, a verdict for 4 canary instances against the other 60 over the last
``--window``:

* **api**: ``POST /api/v1/verdict`` through the FastAPI app (TestClient, no network),
  including validation, judging and storing the verdict;
* **in_process**: :func:`api.cohorts.load_samples` for both sides + :func:`api.judge.judge`;
* **duckdb**: the same SQL (counts and latency samples per side) straight through DuckDB.

Target (DESIGN §8): verdict p99 ≤ 50 ms. The last line printed is one JSON object.
Usage: ``python bench/api.py [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from fastapi.testclient import TestClient

# Run as ``python bench/api.py``, this folder comes first on sys.path and this file's name
# would shadow the ``api`` package it measures: drop that entry before importing it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from api.app import create_app  # noqa: E402
from api.cohorts import LATENCY_METRICS, Cohort, SampleOptions, TimeRange, load_samples  # noqa: E402
from api.judge import JudgeConfig, judge  # noqa: E402
from api.params import parse_duration_ms  # noqa: E402
from api.service import ApiConfig  # noqa: E402
from pipeline.schema import REQUEST_RECORDS  # noqa: E402
from pipeline.store import Store  # noqa: E402

INSTANCES = [f"10.0.{i // 256}.{i % 256}:8000" for i in range(64)]
CANARY, BASELINE = INSTANCES[:4], INSTANCES[4:]
DAYS = 30
END_MS = 1_790_000_000_000 // 3_600_000 * 3_600_000
TOKEN = "bench"


def records(instance_index: int, per_hour: int, rng: np.random.Generator) -> pa.Table:
    """``per_hour`` requests an hour for 30 days on one instance, storage schema."""
    n = DAYS * 24 * per_hour
    start = END_MS - DAYS * 86_400_000
    received = start + np.sort(rng.integers(0, DAYS * 86_400_000, n))
    ttft = rng.lognormal(-1.0, 0.3, n)
    tpot = rng.lognormal(-3.5, 0.2, n)
    outcome = np.where(rng.random(n) < 0.002, "error_before_first_token", "ok")
    columns = {
        "request_id": [f"i{instance_index}-{k}" for k in range(n)],
        "attempt": np.ones(n, dtype=np.int16),
        "instance": [INSTANCES[instance_index]] * n,
        "pool": ["llama-3-70b"] * n,
        "received_ts_ms": received,
        "outcome": outcome,
        "streamed": np.ones(n, dtype=bool),
        "ttft_s": ttft,
        "tpot_s": tpot,
        "itl_p99_s": tpot * 1.5,
        "itl_max_s": tpot * 2.0,
        "e2e_s": ttft + 200 * tpot,
        "client_disconnected": np.zeros(n, dtype=bool),
    }
    schema = REQUEST_RECORDS.storage_arrow
    arrays = [
        pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def fill(store: Store, per_hour: int) -> int:
    """Commit every instance's records in time order, a day at a time, as ingest would."""
    rng = np.random.default_rng(42)
    table = pa.concat_tables(records(i, per_hour, rng) for i in range(len(INSTANCES)))
    table = table.sort_by("received_ts_ms")
    received = table.column("received_ts_ms").to_numpy()
    start = END_MS - DAYS * 86_400_000
    bounds = np.searchsorted(received, [start + day * 86_400_000 for day in range(DAYS + 1)])
    for low, high in itertools.pairwise(bounds):
        part = table.slice(int(low), int(high - low))
        store.commit_batch({"requests": [part]}, group_id="bench", offsets={}, now_ts_ms=0)
    return table.num_rows


def timed(run: Callable[[], object], repeat: int) -> dict[str, float]:
    run()  # warm-up: DuckDB caches, FastAPI routing
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        durations.append((time.perf_counter() - started) * 1000)
    durations.sort()
    return {
        "p50_ms": round(statistics.median(durations), 2),
        "p99_ms": round(durations[min(len(durations) - 1, int(len(durations) * 0.99))], 2),
    }


def direct_sql(store: Store, cohort: list[str], time_range: TimeRange, limit: int) -> None:
    """The API's two queries for one side, straight through DuckDB."""
    con = store.con.cursor()
    where = "received_ts_ms >= ? AND received_ts_ms < ? AND list_contains(?, instance)"
    params = [time_range.start_ms, time_range.end_ms, cohort]
    con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE outcome = 'ok') FROM requests WHERE {where}",
        params,
    ).fetchall()
    con.execute(
        f"SELECT ttft_s, tpot_s, itl_p99_s, e2e_s FROM requests WHERE {where} AND outcome = 'ok'"
        " ORDER BY hash(request_id), request_id LIMIT ?",
        [*params, limit],
    ).fetchnumpy()
    con.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and runs (< 60 s)")
    parser.add_argument("--per-hour", type=int, help="requests per instance and hour")
    parser.add_argument("--window", default="1h", help="verdict look-back (default 1h)")
    parser.add_argument("--repeat", type=int, help="timed runs per variant")
    args = parser.parse_args(argv)
    per_hour = args.per_hour or (60 if args.quick else 600)
    repeat = args.repeat or (30 if args.quick else 200)
    window_ms = parse_duration_ms(args.window)
    time_range = TimeRange(start_ms=END_MS - window_ms, end_ms=END_MS)
    options = SampleOptions()
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.duckdb") as store:
        started = time.perf_counter()
        rows = fill(store, per_hour)
        fill_s = time.perf_counter() - started
        config = ApiConfig(samples=options)
        app = create_app(store.con.cursor, config, clock=lambda: END_MS / 1000, token=TOKEN)
        body = {
            "canary_instances": CANARY,
            "baseline_instances": BASELINE,
            "window": args.window,
            "min_requests": "10",
        }
        with TestClient(app) as client:

            def via_api() -> None:
                response = client.post(
                    "/api/v1/verdict", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
                )
                assert response.status_code == 200, response.text

            api = timed(via_api, repeat)
            verdict = client.post(
                "/api/v1/verdict", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
            ).json()["summary"]

        def in_process() -> None:
            con = store.con.cursor()
            canary = load_samples(con, Cohort(instances=tuple(CANARY)), time_range, options)
            baseline = load_samples(con, Cohort(instances=tuple(BASELINE)), time_range, options)
            judge(canary, baseline, JudgeConfig(min_requests=10))
            con.close()

        def duckdb_only() -> None:
            direct_sql(store, CANARY, time_range, options.max_samples)
            direct_sql(store, BASELINE, time_range, options.max_samples)

        local = timed(in_process, repeat)
        raw = timed(duckdb_only, repeat)
    result = {
        "bench": "api",
        "instances": len(INSTANCES),
        "days": DAYS,
        "rows": rows,
        "window": args.window,
        "fill_s": round(fill_s, 2),
        "verdict": verdict["verdict"],
        "canary_requests": verdict["canaryRequests"],
        "baseline_requests": verdict["baselineRequests"],
        "latency_metrics": len(LATENCY_METRICS),
        "api": api,
        "in_process": local,
        "duckdb": raw,
        "api_overhead_p50_ms": round(api["p50_ms"] - raw["p50_ms"], 2),
        "target_p99_ms": 50,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
