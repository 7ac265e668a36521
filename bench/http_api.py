"""Benchmark: the HTTP API over 30 days × 64 instances of request records.

Fills a DuckDB file (through ``pipeline.store.Store``) with request records of 64 instances
over 30 days (``--per-hour`` requests per instance and hour; ``--quick`` uses fewer) and a
level per instance and pool, then measures in the same run:

1. a verdict for 4 canary instances against the other 60 over the last ``--window``:
   **api** (``POST /api/v1/verdict`` through the FastAPI app, TestClient, no network,
   including validation, judging and storing), **in_process** (``load_samples`` + ``judge``)
   and **duckdb** (the same SQL straight through DuckDB);
2. read endpoints against the same :mod:`slo.queries` call made directly (the API's
   overhead): JSON and Arrow IPC answers, TestClient;
3. ``GET /api/v1/flags`` served by a real ``llmslo api`` process on loopback to 200
   concurrent pollers: conditional polls (``If-None-Match`` → 304, the gateways' steady
   state) and full answers, requests/s and p99; and 200 long-polls (``wait=``) woken by one
   override: the time from the change to each poller's answer;
4. ``served``: a read-only ``llmslo api`` process (uvicorn on loopback) and a read-only
   connection here, on the same file. The same verdict (``VerdictService.evaluate``, what
   the route calls) run directly and through ``POST /api/v1/verdict``, alternately: p50/p99
   of both and the API's overhead, alone (median of 3 repeats) and while ``READERS``
   unauthenticated clients hammer the read routes back to back (bounded by ``--seconds``
   and ``MAX_READS``; with ``/healthz`` probed every 20 ms; reads answered and shed with
   503 counted). The load runs in processes of its own (this script with ``--load``), so
   it shares no interpreter with the timings. Then one unauthenticated 1 GiB
   ``POST /api/v1/silences`` from a generator of 1 MiB chunks: the status, the time to it,
   how much was sent, and the API process's peak RSS over its RSS before (``VmRSS``
   sampled every 5 ms).

Targets (DESIGN §8): verdict p99 ≤ 50 ms; the API adds ≤ 5 ms p50 to the verdict alone.
The last line printed is one JSON object.
Usage: ``python bench/http_api.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import duckdb
import httpx
import numpy as np
import pyarrow as pa
from fastapi.testclient import TestClient

from api.app import create_app
from api.cohorts import LATENCY_METRICS, Cohort, SampleOptions, TimeRange, load_samples
from api.judge import JudgeConfig, judge
from api.params import parse_duration_ms
from api.reads import ARROW_STREAM
from api.service import ApiConfig, VerdictService
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from slo import queries
from slo.flags import FlagTransition
from slo.sinks import StoreTransitionSink

ROOT = Path(__file__).resolve().parents[1]
POLLERS = 200
#: Unauthenticated readers of the read routes while verdicts are timed, and their bound.
READERS = 200
MAX_READS = 200_000
BIG_BODY_BYTES = 1 << 30

INSTANCES = [f"10.0.{i // 256}.{i % 256}:8000" for i in range(64)]
CANARY, BASELINE = INSTANCES[:4], INSTANCES[4:]
DAYS = 30
END_MS = 1_790_000_000_000 // 3_600_000 * 3_600_000
TOKEN = "bench"


def records(instance_index: int, day: int, per_hour: int, rng: np.random.Generator) -> pa.Table:
    """``per_hour`` requests an hour on one instance during day ``day`` (0 is the first of
    the 30), storage schema."""
    n = 24 * per_hour
    start = END_MS - (DAYS - day) * 86_400_000
    received = start + np.sort(rng.integers(0, 86_400_000, n))
    ttft = rng.lognormal(-1.0, 0.3, n)
    tpot = rng.lognormal(-3.5, 0.2, n)
    outcome = np.where(rng.random(n) < 0.002, "error_before_first_token", "ok")
    columns = {
        "request_id": [f"i{instance_index}-d{day}-{k}" for k in range(n)],
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
    """Commit every instance's records in time order, a day at a time, as ingest would
    (one day is built at a time, so memory stays bounded at 600 requests an hour)."""
    rng = np.random.default_rng(42)
    rows = 0
    for day in range(DAYS):
        part = pa.concat_tables(records(i, day, per_hour, rng) for i in range(len(INSTANCES)))
        part = part.sort_by("received_ts_ms")
        store.commit_batch({"requests": [part]}, group_id="bench", offsets={}, now_ts_ms=0)
        rows += part.num_rows
    return rows


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


def percentiles(durations_ms: list[float]) -> dict[str, float]:
    ordered = sorted(durations_ms)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
    }


def bench_reads(store: Store, client: TestClient, repeat: int) -> dict[str, object]:
    """Read routes vs the same ``slo.queries`` call straight on a cursor."""
    day = {"start_ms": END_MS - 86_400_000, "end_ms": END_MS}
    cases: dict[str, tuple[str, Callable[..., Any], dict[str, Any]]] = {
        "latency_ttft_1d_5m_by_pool": (
            "/api/v1/latency",
            queries.latency_percentiles,
            {"metric": "ttft", **day, "bucket_ms": 300_000},
        ),
        "outcomes_1d_10m_by_instance": (
            "/api/v1/outcomes",
            queries.outcome_counts,
            {**day, "bucket_ms": 600_000, "by": "instance"},
        ),
    }
    results: dict[str, object] = {}
    for name, (path, function, kwargs) in cases.items():

        def direct(function: Callable[..., Any] = function, kwargs: dict = kwargs) -> None:
            con = store.con.cursor()
            function(con, **kwargs)
            con.close()

        def as_json(path: str = path, kwargs: dict = kwargs) -> None:
            assert client.get(path, params=kwargs).status_code == 200

        def as_arrow(path: str = path, kwargs: dict = kwargs) -> None:
            answer = client.get(path, params=kwargs, headers={"Accept": ARROW_STREAM})
            assert answer.status_code == 200

        rows = client.get(path, params=kwargs).json()["count"]
        raw, json_, arrow = timed(direct, repeat), timed(as_json, repeat), timed(as_arrow, repeat)
        results[name] = {
            "rows": rows,
            "duckdb": raw,
            "api_json": json_,
            "api_arrow": arrow,
            "overhead_arrow_p50_ms": round(arrow["p50_ms"] - raw["p50_ms"], 2),
            "overhead_json_p50_ms": round(json_["p50_ms"] - raw["p50_ms"], 2),
        }
    return results


def add_flags(store: Store) -> None:
    """A level for every instance and the pool, as the SLO jobs would have left them."""
    transitions = [
        FlagTransition(END_MS - 3_600_000, "instance", instance, "llama-3-70b", 0, i % 3, 0.05,
                       "kv_free_below_l1", {"kv_free_ratio": 0.05})
        for i, instance in enumerate(INSTANCES)
    ]  # fmt: skip
    transitions.append(
        FlagTransition(
            END_MS - 3_600_000, "pool", "llama-3-70b", "llama-3-70b", 0, 1, 0.08, "kv", {}
        )
    )
    StoreTransitionSink(store.con).write(transitions)


async def _poll(url: str, etag: str | None, seconds: float) -> tuple[int, list[float]]:
    """``POLLERS`` clients GET /api/v1/flags back to back for ``seconds`` (aiohttp: a
    lighter client than httpx, so the figures are the server's more than the client's)."""
    headers = {"If-None-Match": etag} if etag else {}
    durations: list[float] = []
    connector = aiohttp.TCPConnector(limit=POLLERS)
    async with aiohttp.ClientSession(url, connector=connector) as client:
        deadline = time.perf_counter() + seconds

        async def poller() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with client.get("/api/v1/flags", headers=headers) as answer:
                    await answer.read()
                    assert answer.status == (304 if etag else 200), answer.status
                durations.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(poller() for _ in range(POLLERS)))
        elapsed = time.perf_counter() - started
    return round(len(durations) / elapsed), durations


async def _long_polls(url: str, etag: str) -> list[float]:
    """``POLLERS`` long-polls; one override wakes them; ms from the change to each answer."""
    answered: list[float] = []
    connector = aiohttp.TCPConnector(limit=POLLERS + 1)
    async with aiohttp.ClientSession(url, connector=connector) as client:

        async def waiter() -> None:
            async with client.get(
                "/api/v1/flags", params={"wait": "30"}, headers={"If-None-Match": etag}
            ) as answer:
                await answer.read()
                assert answer.status == 200, answer.status
            answered.append(time.perf_counter())

        tasks = [asyncio.create_task(waiter()) for _ in range(POLLERS)]
        await asyncio.sleep(2.0)  # every poller is parked
        changed = time.perf_counter()
        override = {"scope": "pool", "scope_id": "llama-3-70b", "level": 3,
                    "expires_in_s": 60, "reason": "bench"}  # fmt: skip
        async with client.post(
            "/api/v1/flags/overrides", json=override, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as made:
            assert made.status == 201, await made.text()
        await asyncio.gather(*tasks)
    return [(t - changed) * 1000 for t in answered]


def start_api(db: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """A real ``llmslo api`` process on ``db`` (loopback, any free port) and its URL."""
    env = {**os.environ, "LLMSLO_API_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "llmslo", "api", "--db", str(db), "--api-port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert process.stdout is not None
    found = re.search(r"on (http://\S+) ", process.stdout.readline())
    if not found:
        stop(process)
        raise RuntimeError("llmslo api did not start")
    return process, found[1]


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then wait (bounded) for the process to finish."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def bench_flags(db: Path, seconds: float) -> dict[str, object]:
    """Flags from a real ``llmslo api`` process (the file is closed here first)."""
    process, url = start_api(db)
    try:
        first = httpx.get(f"{url}/api/v1/flags", timeout=10)
        etag = first.headers["etag"]
        conditional_rps, conditional = asyncio.run(_poll(url, etag, seconds))
        full_rps, full = asyncio.run(_poll(url, None, seconds))
        woken = asyncio.run(_long_polls(url, etag))
    finally:
        stop(process)
    return {
        "pollers": POLLERS,
        "flags_rows": first.json()["count"],
        "conditional_304": {"requests_per_s": conditional_rps, **percentiles(conditional)},
        "full_200": {"requests_per_s": full_rps, **percentiles(full)},
        "long_poll_wake": {"woken": len(woken), **percentiles(woken)},
    }


def verdict_body(window: str) -> dict[str, object]:
    """The Argo verdict request of every phase: 4 canaries against 60, ending at ``END_MS``."""
    end = datetime.fromtimestamp(END_MS / 1000, UTC).isoformat().replace("+00:00", "Z")
    return {
        "canary_instances": CANARY,
        "baseline_instances": BASELINE,
        "window": window,
        "at": end,
        "min_requests": "10",
    }


class VerdictPair:
    """The same verdict two ways, alternately: ``api.service`` called in this process on a
    read-only connection, and ``POST /api/v1/verdict`` to the API process (keep-alive)."""

    def __init__(self, db: Path, url: str, window: str) -> None:
        self.con = duckdb.connect(str(db), read_only=True)
        self.service = VerdictService(self.con.cursor, ApiConfig(), time.time, store_verdicts=False)
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        )
        self.body = verdict_body(window)
        self.direct_ms: list[float] = []
        self.api_ms: list[float] = []

    def direct(self) -> dict[str, Any]:
        started = time.perf_counter()
        document, _ = self.service.evaluate(self.body, "argo")
        self.direct_ms.append((time.perf_counter() - started) * 1000)
        return document

    def api(self) -> dict[str, Any]:
        started = time.perf_counter()
        answer = self.client.post("/api/v1/verdict", json=self.body)
        self.api_ms.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.text[:500]
        document: dict[str, Any] = answer.json()
        return document

    def run(self, count: int | None = None, until: float | None = None) -> dict[str, Any]:
        """Alternate (order flipped each round) ``count`` rounds or until ``until``
        (``perf_counter``); the percentiles of both and the API's overhead."""
        self.direct_ms, self.api_ms = [], []
        rounds = itertools.count()
        for k in rounds:
            if (count is not None and k >= count) or (until and time.perf_counter() >= until):
                break
            first, second = (self.direct, self.api) if k % 2 else (self.api, self.direct)
            first()
            second()
        return summarise_pair(self.direct_ms, self.api_ms)

    def close(self) -> None:
        self.client.close()
        self.con.close()


def summarise_pair(direct_ms: list[float], api_ms: list[float]) -> dict[str, Any]:
    """Both sides' percentiles and the overhead: the difference of the p50s and p99s, and
    the median of each round's own difference (``paired``: on a busy host the two runs of
    one round see the same load, so this is the steadiest of the three)."""
    direct, api = percentiles(direct_ms), percentiles(api_ms)
    paired = statistics.median(a - d for a, d in zip(api_ms, direct_ms, strict=True))
    return {
        "runs": len(api_ms),
        "direct": direct,
        "api": api,
        "overhead_p50_ms": round(api["p50_ms"] - direct["p50_ms"], 2),
        "overhead_p99_ms": round(api["p99_ms"] - direct["p99_ms"], 2),
        "overhead_paired_p50_ms": round(paired, 2),
    }


def median_of(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number of ``repeats`` (dicts of the same shape) replaced by its median."""
    first = repeats[0]
    merged: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            merged[key] = median_of([r.get(key) or {} for r in repeats])
            continue
        numbers = [r[key] for r in repeats if isinstance(r.get(key), int | float)]
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        merged[key] = round(statistics.median(numbers), 2) if is_number else value
    return merged


def spawn_load(role: str, url: str, seconds: float) -> subprocess.Popen[str]:
    """This script as a load process (``--load readers|health``), so the load shares no
    interpreter (and no GIL) with the verdict timings."""
    return subprocess.Popen(
        [sys.executable, __file__, "--load", role, "--url", url, "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def collect(process: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, f"load process failed: {out[-500:]}"
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def bench_under_load(pair: VerdictPair, url: str, seconds: float) -> dict[str, Any]:
    """Verdicts (API and direct, alternately) and ``/healthz`` while ``READERS`` clients
    hammer the read routes for ``seconds``."""
    readers = spawn_load("readers", url, seconds + 1.5)
    health = spawn_load("health", url, seconds)
    time.sleep(1.5)  # the readers are connected and the read lane is full
    verdicts = pair.run(until=time.perf_counter() + seconds)
    load = collect(readers, seconds + 60)
    probes = collect(health, seconds + 60)
    return {"verdict": verdicts, "healthz": probes, "reads": load}


def _reader_paths() -> list[tuple[str, dict[str, str | int]]]:
    day = {"start_ms": END_MS - 86_400_000, "end_ms": END_MS}
    return [
        ("/api/v1/latency", {"metric": "ttft", **day, "bucket_ms": 300_000}),
        ("/api/v1/outcomes", {**day, "bucket_ms": 600_000, "by": "instance"}),
        ("/api/v1/meta", {}),
        ("/api/v1/verdicts", {"limit": 50}),
    ]


async def _readers(url: str, seconds: float) -> dict[str, object]:
    """``READERS`` unauthenticated clients GET read routes back to back until ``seconds``
    pass or ``MAX_READS`` are answered; counts by status and the 200s' and 503s' latency."""
    statuses: dict[int, int] = {}
    by_status: dict[int, list[float]] = {200: [], 503: []}
    retry_after: set[str] = set()
    paths = _reader_paths()
    connector = aiohttp.TCPConnector(limit=READERS)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as client:
        deadline = time.perf_counter() + seconds

        async def reader(k: int) -> None:
            for path, params in itertools.islice(itertools.cycle(paths), k % len(paths), None):
                if time.perf_counter() >= deadline or sum(statuses.values()) >= MAX_READS:
                    return
                started = time.perf_counter()
                async with client.get(path, params=params) as answer:
                    await answer.read()
                    status = answer.status
                    if status == 503:
                        retry_after.add(answer.headers.get("Retry-After", ""))
                statuses[status] = statuses.get(status, 0) + 1
                by_status.setdefault(status, []).append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(reader(k) for k in range(READERS)))
        elapsed = time.perf_counter() - started
    return {
        "readers": READERS,
        "answered": sum(statuses.values()),
        "per_s": round(sum(statuses.values()) / elapsed),
        "ok_200": statuses.get(200, 0),
        "shed_503": statuses.get(503, 0),
        "other": {str(k): v for k, v in statuses.items() if k not in (200, 503)},
        "retry_after": sorted(retry_after),
        "ok_p99_ms": percentiles(by_status[200])["p99_ms"] if by_status[200] else None,
        "shed_p99_ms": percentiles(by_status[503])["p99_ms"] if by_status[503] else None,
    }


def _health(url: str, seconds: float) -> dict[str, object]:
    """``GET /healthz`` every 20 ms for ``seconds``, one connection, as a liveness probe."""
    durations: list[float] = []
    failed = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            failed += client.get("/healthz").status_code != 200
            durations.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
    return {"probes": len(durations), "failed": failed, **percentiles(durations)}


def run_load(role: str, url: str, seconds: float) -> int:
    """The ``--load`` entry point: one JSON line on stdout."""
    if role == "readers":
        print(json.dumps(asyncio.run(_readers(url, seconds))))
    else:
        print(json.dumps(_health(url, seconds)))
    return 0


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` now, KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _chunks(total_bytes: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """``total_bytes`` of a JSON-looking body, one reused ``chunk_bytes`` buffer at a time
    (so this side holds 1 MiB, not 1 GiB)."""
    chunk = b'{"matchers": [' + b" " * (chunk_bytes - 14)
    sent = 0
    while sent < total_bytes:
        part = chunk[: min(chunk_bytes, total_bytes - sent)]
        sent += len(part)
        yield part


def bench_big_body(url: str, pid: int, total_bytes: int = BIG_BODY_BYTES) -> dict[str, Any]:
    """One unauthenticated ``POST /api/v1/silences`` declaring and streaming ``total_bytes``;
    the API process's RSS sampled every 5 ms meanwhile, and the time to its answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    before = rss_kib(pid)
    peak = before
    sampling = True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, rss_kib(pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sent = 0
    head = (
        f"POST /api/v1/silences HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {total_bytes}\r\n\r\n"
    )
    answer = b""
    started = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head.encode())
        try:
            for part in _chunks(total_bytes):
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered before the body was sent
                sock.sendall(part)
                sent += len(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed: the answer is in the receive buffer
        try:
            answer = sock.recv(65_536)
        except ConnectionResetError:
            answer = b""
    answered_s = time.perf_counter() - started
    time.sleep(0.2)  # a late allocation would still show
    sampling = False
    sampler.join()
    status = re.match(rb"HTTP/1\.1 (\d{3})", answer)
    return {
        "body_mib": total_bytes >> 20,
        "status": int(status[1]) if status else None,
        "answered_ms": round(answered_s * 1000, 2),
        "sent_mib": round(sent / (1 << 20), 1),
        "rss_before_mib": round(before / 1024),
        "rss_peak_delta_mib": round((peak - before) / 1024, 1),
    }


def bench_served(db: Path, args: argparse.Namespace, repeat: int) -> dict[str, object]:
    """A read-only ``llmslo api`` process and a read-only connection here, on the same file:
    verdict direct vs API alone and under ``READERS`` readers, then the 1 GiB body."""
    process, url = start_api(db, "--read-only")
    pair = VerdictPair(db, url, args.window)
    try:
        direct, api = pair.direct()["summary"], pair.api()["summary"]
        assert direct == api, (direct, api)  # the same verdict both ways
        pair.run(count=3)  # warm-up
        alone = median_of([pair.run(count=repeat) for _ in range(3)])
        load_s = 3.0 if args.quick else 20.0
        loads = [bench_under_load(pair, url, load_s) for _ in range(1 if args.quick else 3)]
        loaded = median_of(loads)
        body = median_of([bench_big_body(url, process.pid) for _ in range(3)])
        rss_after = round(rss_kib(process.pid) / 1024)
    finally:
        pair.close()
        stop(process)
    return {
        "verdict_alone": alone,
        "under_load": {"seconds": load_s, "repeats": len(loads), **loaded},
        "unauthenticated_1gib_silence": {**body, "rss_after_mib": rss_after},
        "target_overhead_p50_ms": 5,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and runs (< 60 s)")
    parser.add_argument("--per-hour", type=int, help="requests per instance and hour")
    parser.add_argument(
        "--window", help="verdict look-back (default 1h; 3h with --quick, for as many requests)"
    )
    parser.add_argument("--repeat", type=int, help="timed runs per variant")
    # This script is also its own load generator (a process of its own, see spawn_load).
    parser.add_argument("--load", choices=["readers", "health"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        return run_load(args.load, args.url, args.seconds)
    per_hour = args.per_hour or (20 if args.quick else 600)
    repeat = args.repeat or (20 if args.quick else 200)
    args.window = args.window or ("3h" if args.quick else "1h")
    window_ms = parse_duration_ms(args.window)
    time_range = TimeRange(start_ms=END_MS - window_ms, end_ms=END_MS)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        with Store(db) as store:
            started = time.perf_counter()
            rows = fill(store, per_hour)
            fill_s = time.perf_counter() - started
            add_flags(store)
            verdict, api, local, raw, reads = bench_verdicts(store, args, time_range, repeat)
        flags = bench_flags(db, 3.0 if args.quick else 20.0)
        served = bench_served(db, args, max(10, repeat // 2))
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
        "reads": reads,
        "flags": flags,
        "served": served,
    }
    print(json.dumps(result))
    return 0


def bench_verdicts(
    store: Store, args: argparse.Namespace, time_range: TimeRange, repeat: int
) -> tuple[dict, dict, dict, dict, dict]:
    """Verdict via the API, in process and as raw SQL; then the read routes."""
    options = SampleOptions()
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
        reads = bench_reads(store, client, max(10, repeat // 3))

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
    return verdict, api, local, raw, reads


if __name__ == "__main__":
    sys.exit(main())
