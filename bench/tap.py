"""Benchmark of the stream tap: added TTFT vs a direct connection, chunks/s, memory per stream.

Processes (so no two share a GIL): a fast OpenAI-style upstream, the tap, nginx as a plain
reverse proxy (Debian package ``nginx``; skipped with nulls when absent), and the load
generator. Phases, each with 256 concurrent streams in a closed loop:

1. TTFT: streams of 20 tokens at 100 ms per token (a busy engine), direct, via the tap and
   via nginx, in interleaved rounds; added TTFT = median over rounds of percentile(via) −
   percentile(direct) of client-side TTFT (first token-bearing chunk);
   ``kib_per_stream`` = (tap RSS with 256 streams open − idle RSS) / 256.
2. Throughput: streams of 256 tokens written back to back; chunks/s = token chunks the
   clients received through the tap per second; ``tap_cpu_us_per_chunk`` = CPU time the tap
   process used per chunk (independent of how busy the machine is; 1e6 / it = chunks/s one
   free core could carry).

3. Footprint: ``llmslo tap`` itself, as a sidecar runs it (its own process, publishing to
   Kafka and following the flags topic, on which the SLO jobs' sink has published a
   heartbeat and an L1 transition, as in the demo: the embedded broker, whose own RSS is not
   counted), warmed and then at the streams of phase 1: its peak RSS
   ``tap_command_rss_mib`` (idle, once it has read the flags:
   ``tap_command_idle_rss_mib``; ``tap_command_published_rows`` proves Kafka was on) beside
   nginx's peak RSS (master + worker) in phase 1's nginx rounds (the same load), and
   ``tap_to_nginx_rss``. (``tap_rss_mib``
   is the in-process tap of phase 1, without Kafka.)

4. Jitter error: ``JITTER_STREAMS`` streams of ``JITTER_TOKENS`` tokens at
   ``JITTER_GAP_MS`` through a second tap (records kept) in front of a paced engine that
   notes the monotonic time just before each token chunk's write (the engine-side gap
   schedule; ``CLOCK_MONOTONIC`` is one clock for every process on the host). Per gap,
   |tap-recorded gap − engine gap| over the gaps the tap vouched for (those its records' ITL
   statistics hold): ``jitter_error_p50_ms`` / ``jitter_error_p99_ms``, with
   ``jitter_error_max_bound_ms`` (the largest bound it stated for one of them),
   ``jitter_error_vouched_share`` (of all gaps) and ``jitter_error_uncertain_requests``;
   ``jitter_error_all_p50_ms`` / ``…_all_p99_ms`` over every gap as timed; the same with one CPU hog per core
   (``llmslo.drill.hogs.cpu_hogs``) as ``hog_jitter_*``, and both again through a tap
   without kernel receive stamps (``loop_jitter_*``, ``hog_loop_jitter_*``), in the same run. The engine stand-in
   is ``serve_paced`` (aiohttp), not the simulator: its emission times are its writes.

``tap_cpu_us_per_chunk_ttft`` is the same for the tap's TTFT phases: one event per read and
per write, request overheads included (20 token chunks per request) — the case that sets
the tap's added latency on a shared core; ``nginx_cpu_us_per_chunk_ttft`` is nginx's (master
and worker) in its TTFT phases. On a host whose cores are all busy, a process gets about its
fair share of a core whatever it needs, so the CPU a proxy spends per chunk, not its code
path, sets how far behind it falls (and its added TTFT).

Every path is first warmed at full concurrency (steady state, not cold start), and both
proxies keep idle upstream connections for ``NGINX_KEEPALIVE_S`` (the tap's default, 4 s,
would let its pool expire during the other modes' phases: every tap phase then began with
a connect per stream, in the measured TTFTs; a ``--baseline`` tree from before 2026-12-05
still does). Quick: 2
rounds of 3 s phases (< 60 s in all); full: 5 rounds of 12 s. The tap runs as ``llmslo tap``
does (uvloop when installed); ``LLMSLO_BENCH_PROFILE=FILE`` writes its CPU profile.

The 2-core machine is shared, so figures move with its load (``load_average_1m`` is in the
output); ``tap_cpu_us_per_chunk`` is the steadiest figure.

``--baseline DIR`` adds a second tap run from another source tree (e.g. ``git archive REV
collectors pipeline bench | tar -x -C DIR``) as mode ``baseline`` in the same interleaved
rounds: before/after comparisons on the same machine at the same load
(``baseline_added_ttft_*``, ``baseline_cpu_us_per_chunk_ttft``).

Usage: ``python bench/tap.py [--quick] [--streams 256] [--rounds N] [--baseline DIR]``. The
last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: TTFT phases: 256 streams of 20 tokens at 100 ms per token (a busy engine), 2,560 chunks/s.
TTFT_TOKENS, TTFT_GAP_MS = 20, 100
#: Jitter phase: streams of tokens at a decode pace, through a tap that keeps its records.
JITTER_STREAMS, JITTER_TOKENS, JITTER_GAP_MS = 64, 40, 20
#: the tap's default ``gap_error_max_s``: the gaps its ITL statistics hold
GAP_ERROR_MAX_S = 0.005
#: how long both proxies keep idle upstream connections (nginx's ``keepalive_timeout`` default)
NGINX_KEEPALIVE_S = 60.0
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- upstream process
def _events(tokens: int) -> tuple[bytes, list[bytes], bytes]:
    head = '{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m","choices":['
    role_choice = '{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}'
    role = f"data: {head}{role_choice}]}}\n\n"
    toks = [
        f'data: {head}{{"index":0,"delta":{{"content":"tok{i} "}},"finish_reason":'
        f"{'null' if i < tokens - 1 else chr(34) + 'length' + chr(34)}}}]}}\n\n".encode()
        for i in range(tokens)
    ]
    usage = (
        f'data: {{"id":"chatcmpl-b","object":"chat.completion.chunk","created":1,"model":"m",'
        f'"choices":[],"usage":{{"prompt_tokens":5,"completion_tokens":{tokens},'
        f'"total_tokens":{tokens + 5}}}}}\n\n'
    ).encode()
    return role.encode(), toks, usage


def serve_upstream(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens, gap_s = int(body.get("max_tokens", 16)), float(body.get("bench_gap_ms", 0)) / 1000
        role, toks, usage = _events(tokens)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(role)
        for event in toks:
            if gap_s:
                await asyncio.sleep(gap_s)
            await resp.write(event)
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=2048)


def serve_paced(port: int, sends: Any) -> None:
    """The engine of the jitter phase: token chunks every ``bench_gap_ms``, each write's
    monotonic time (taken just before it) put on ``sends`` as (request id, times)."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens, gap_s = int(body.get("max_tokens", 16)), float(body.get("bench_gap_ms", 0)) / 1000
        role, toks, usage = _events(tokens)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(role)
        times: list[float] = []
        due = time.monotonic()
        for event in toks:
            due += gap_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            times.append(time.monotonic())
            await resp.write(event)
        await resp.write(usage + b"data: [DONE]\n\n")
        await resp.write_eof()
        sends.put((request.headers.get("x-request-id", ""), times))
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=2048)


# ---------------------------------------------------------------- tap process
class CountingSink:
    def __init__(self) -> None:
        self.requests = 0

    def add_request(self, row: dict[str, Any]) -> None:
        self.requests += 1

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


class RecordsSink(CountingSink):
    """Puts each record's (request id, recorded gaps, each gap's bound, uncertain) on a queue
    (the bounds are not a record column: ``serve_tap`` adds them for the bench)."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out

    def add_request(self, row: dict[str, Any]) -> None:
        self.out.put(
            (row["request_id"], row["itl_gaps_s"], row["_gap_errors_s"], row["itl_uncertain"])
        )


def serve_tap(port: int, upstream: str, records: Any = None, kernel: bool = True) -> None:
    from collectors.tap import TapConfig, TapProxy
    from collectors.tap.proxy import run_event_loop
    from pipeline.processes import freeze_startup_heap

    if records is not None:  # each gap's own bound beside the record, for the jitter phase
        import collectors.tap.proxy as proxy_module

        plain_row = proxy_module.record_row

        def record_row(ctx: Any, ex: Any, **kw: Any) -> dict[str, Any]:
            row = plain_row(ctx, ex, **kw)
            row["_gap_errors_s"] = ex.finish().itl_gap_errors_s.tolist()
            return row

        proxy_module.record_row = record_row

    async def main() -> None:
        config = TapConfig(
            listen=f"127.0.0.1:{port}",
            upstreams=[upstream],
            kafka=False,
            max_connections=4096,
            gauge_interval_s=60,
            kernel_timestamps=kernel,
            # nginx's upstream keep-alive (its keepalive_timeout default), under this
            # upstream's 75 s: the default 4 s (under uvicorn's 5 s) would let the pool
            # expire between the tap's phases, and each phase would start with a connect
            upstream_keepalive_s=NGINX_KEEPALIVE_S,
        )
        proxy = TapProxy(config, RecordsSink(records) if records is not None else CountingSink())
        await proxy.start()
        freeze_startup_heap()  # as `llmslo tap` does
        await asyncio.Event().wait()

    profile_to = os.environ.get("LLMSLO_BENCH_PROFILE")  # write cProfile stats of the tap here
    if profile_to:
        import cProfile

        profiler = cProfile.Profile(time.process_time)  # CPU time, not wall time

        def dump(*_: object) -> None:
            profiler.disable()
            profiler.dump_stats(profile_to)
            os._exit(0)

        signal.signal(signal.SIGTERM, dump)
        profiler.enable()
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    run_event_loop(main())  # as `llmslo tap` runs it: uvloop when installed


def start_baseline_tap(tree: Path, port: int, upstream: str) -> subprocess.Popen[bytes]:
    """The tap of another source tree (its own ``bench/tap.py``), in its own process."""
    code = (
        f"import sys; sys.path[:0] = [{str(tree / 'bench')!r}, {str(tree)!r}]; "
        f"import tap; tap.serve_tap({port}, {upstream!r})"
    )
    return subprocess.Popen([sys.executable, "-c", code])


# ---------------------------------------------------------------- nginx
def start_nginx(upstream_port: int, port: int, workdir: Path) -> subprocess.Popen[bytes] | None:
    binary = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if binary is None:
        return None
    workdir.chmod(0o755)
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fastcgi;
  uwsgi_temp_path {workdir}/uwsgi;
  scgi_temp_path {workdir}/scgi;
  upstream engine {{
    server 127.0.0.1:{upstream_port};
    keepalive 1024;
    keepalive_timeout {NGINX_KEEPALIVE_S:g}s;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=2048;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
    }}
  }}
}}
""")
    return subprocess.Popen(
        [binary, "-p", str(workdir), "-e", str(workdir / "error.log"), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# ---------------------------------------------------------------- footprint
def publish_flags(bootstrap: str) -> None:
    """What the SLO jobs put on the flags topic: a heartbeat, and an L1 transition of the
    pool the bench's requests name (L1 only forwards a header: every request still passes)."""
    from pipeline.bus import Bus
    from pipeline.config import BusConfig
    from pipeline.publisher import Publisher
    from slo.flags import FlagBoard, FlagPolicy
    from slo.sinks import BusTransitionSink, JobsHeartbeat

    with Bus(BusConfig(bootstrap_servers=bootstrap)) as bus:
        bus.ensure_topics()
        sink = BusTransitionSink(Publisher(bus.producer, component="bench-flags"), 10.0)
        now_ms = int(time.time() * 1000)
        change = FlagBoard(FlagPolicy()).observe(now_ms, "pool", "m", "m", 0.08)
        sink.write([change] if change is not None else [])
        sink.beat(JobsHeartbeat(now_ms, now_ms, "bench-jobs", 30.0))
        sink.close()


def start_tap_command(port: int, upstream: str, bootstrap: str) -> subprocess.Popen[str]:
    """``llmslo tap`` as a sidecar runs it: its own process, publishing to Kafka and
    following the flags."""
    command = [sys.executable, "-m", "llmslo", "tap", "--port", str(port)]
    command += ["--upstream", upstream, "--bootstrap-servers", bootstrap, "--follow-flags"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    tap = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert tap.stdout is not None
    banner = json.loads(tap.stdout.readline() or "{}")
    if banner.get("tap") != "listening":
        raise SystemExit(f"llmslo tap did not start: {banner}")
    return tap


def rss_bytes(pid: int) -> int:
    """RSS of a process and its children (nginx: master and worker)."""
    import psutil

    proc = psutil.Process(pid)
    return sum(int(p.memory_info().rss) for p in (proc, *proc.children(recursive=True)))


def cpu_s_of(proc: Any) -> float:
    """User + system CPU seconds of a ``psutil.Process`` and its children (nginx: master and
    worker)."""
    return sum(sum(p.cpu_times()[:2]) for p in (proc, *proc.children(recursive=True)))


def peak_rss(pids: list[int], duration_s: float) -> Any:
    """A ``during`` for :func:`load`: the highest RSS sampled from a quarter of the phase on."""

    def sample() -> int:
        time.sleep(duration_s / 4)
        peak, stop_at = 0, time.monotonic() + duration_s * 0.6
        while time.monotonic() < stop_at:
            peak = max(peak, sum(rss_bytes(pid) for pid in pids))
            time.sleep(0.2)
        return peak

    return sample


def published_rows(bootstrap: str) -> int:
    """Request records on the broker's ``requests`` topic (decoded, so they are whole)."""
    from kafka import KafkaConsumer, TopicPartition

    from pipeline.codec import decode_message
    from pipeline.schema import REQUEST_RECORDS

    topic = "llmslo." + REQUEST_RECORDS.topic
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        rows, quiet_until = 0, time.monotonic() + 3.0
        while time.monotonic() < quiet_until:
            for messages in consumer.poll(timeout_ms=500).values():
                quiet_until = time.monotonic() + 1.0
                for message in messages:
                    rows += decode_message(message.value, message.headers).table.num_rows
        return rows
    finally:
        consumer.close()


def footprint(ctx: Any, upstream: str, nginx_rss: int | None, args: Any) -> dict[str, Any]:
    """RSS of ``llmslo tap`` (Kafka on) at ``args.streams`` open streams, under the TTFT
    phases' load (20 tokens at 100 ms), beside nginx's peak RSS in those phases."""
    from pipeline.broker import EmbeddedBroker

    duration_s = 3.0 if args.quick else 12.0
    port = free_port()
    broker = EmbeddedBroker().start()  # its own process: its RSS is not the tap's
    publish_flags(broker.bootstrap_servers)
    tap = start_tap_command(port, upstream, broker.bootstrap_servers)
    try:
        time.sleep(3.0)  # the follower has read the flags topic (it polls every 0.5 s)
        idle = rss_bytes(tap.pid)
        url = f"http://127.0.0.1:{port}"
        load(ctx, url, args.streams, 0.5 if args.quick else 2.0, 8, 20)  # warm: pools, first use
        res = load(
            ctx,
            url,
            args.streams,
            duration_s,
            TTFT_TOKENS,
            TTFT_GAP_MS,
            during=peak_rss([tap.pid], duration_s),
        )
        figures: dict[str, Any] = {
            "tap_command_idle_rss_mib": round(idle / 2**20, 1),
            "tap_command_rss_mib": round(res["sampled"] / 2**20, 1),
            "tap_command_errors": res["errors"],
        }
    finally:
        tap.terminate()  # publishes what is pending before it exits
        tap.wait(timeout=30)
    try:
        figures["tap_command_published_rows"] = published_rows(broker.bootstrap_servers)
    finally:
        broker.stop()
    figures["nginx_rss_mib"] = None if nginx_rss is None else round(nginx_rss / 2**20, 1)
    figures["tap_to_nginx_rss"] = (
        None if not nginx_rss else round(figures["tap_command_rss_mib"] * 2**20 / nginx_rss, 1)
    )
    print(
        f"footprint at {args.streams} streams: llmslo tap {figures['tap_command_rss_mib']} MiB "
        f"(idle {figures['tap_command_idle_rss_mib']} MiB, "
        f"{figures['tap_command_published_rows']} request records to Kafka), "
        f"nginx {figures['nginx_rss_mib']} MiB, ratio {figures['tap_to_nginx_rss']}",
        flush=True,
    )
    return figures


# ---------------------------------------------------------------- load generator process
def run_load(
    url: str, streams: int, duration_s: float, tokens: int, gap_ms: float, out: Any
) -> None:
    import aiohttp

    async def main() -> dict[str, Any]:
        body = json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "max_tokens": tokens,
                "bench_gap_ms": gap_ms,
            }
        ).encode()
        ttfts: list[float] = []
        chunks = 0
        chunks_total = 0
        errors = 0
        connector = aiohttp.TCPConnector(limit=0)
        start = time.perf_counter()
        measure_from = start + min(1.0, duration_s / 4)
        stop_at = start + duration_s

        async def worker(session: aiohttp.ClientSession) -> None:
            nonlocal chunks, chunks_total, errors
            await asyncio.sleep(random.random() * (tokens * gap_ms / 1000 or 0.05))
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                first = None
                try:
                    async with session.post(
                        url + "/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        async for line in resp.content:
                            if line.startswith(b"data: ") and b'"content":"tok' in line:
                                chunks_total += 1
                                if first is None:
                                    first = time.perf_counter() - t0
                                if t0 >= measure_from:
                                    chunks += 1
                except aiohttp.ClientError:
                    errors += 1
                    continue
                if first is not None and t0 >= measure_from:
                    ttfts.append(first)

        cpu_start_s = time.process_time()
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(worker(session) for _ in range(streams)))
        elapsed = time.perf_counter() - measure_from
        return {
            "cpu_share": (time.process_time() - cpu_start_s) / (time.perf_counter() - start),
            "ttfts": ttfts,
            "chunks": chunks,
            "chunks_total": chunks_total,
            "elapsed_s": elapsed,
            "errors": errors,
        }

    out.put(asyncio.run(main()))


def load(
    ctx: Any,
    url: str,
    streams: int,
    duration_s: float,
    tokens: int,
    gap_ms: float,
    during: Any = None,
) -> dict[str, Any]:
    queue = ctx.Queue()
    proc = ctx.Process(target=run_load, args=(url, streams, duration_s, tokens, gap_ms, queue))
    proc.start()
    sampled = during() if during else None
    result = queue.get(timeout=duration_s + 120)
    proc.join(timeout=30)
    result["sampled"] = sampled
    return result


def run_tagged_load(url: str, streams: int, duration_s: float, tag: str, out: Any) -> None:
    """Closed-loop streams with an ``x-request-id`` each (``tag``-worker-n); puts the ids."""
    import aiohttp

    async def main() -> list[str]:
        body = json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "max_tokens": JITTER_TOKENS,
                "bench_gap_ms": JITTER_GAP_MS,
            }
        ).encode()
        ids: list[str] = []
        stop_at = time.perf_counter() + duration_s

        async def worker(session: aiohttp.ClientSession, w: int) -> None:
            await asyncio.sleep(random.random() * JITTER_TOKENS * JITTER_GAP_MS / 1000)
            n = 0
            while time.perf_counter() < stop_at:
                rid = f"{tag}-{w}-{n}"
                n += 1
                try:
                    async with session.post(
                        url + "/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json", "x-request-id": rid},
                    ) as resp:
                        async for _line in resp.content:
                            pass
                    ids.append(rid)
                except aiohttp.ClientError:
                    continue

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(worker(session, w) for w in range(streams)))
        return ids

    out.put(asyncio.run(main()))


def _drain(source: Any) -> list[Any]:
    """Everything on ``source`` until it has been quiet for half a second."""
    items = []
    while True:
        try:
            items.append(source.get(timeout=0.5))
        except queue.Empty:
            return items


def jitter_error(
    ctx: Any, url: str, sends: Any, records: Any, duration_s: float, tag: str
) -> dict[str, Any]:
    """One jitter phase: |recorded gap − engine gap| (ms) over the gaps the tap vouched for
    (those its ITL statistics hold: own bound within ``gap_error_max_s``, request not
    uncertain), p50/p99, and over every gap as timed (``all_*``); the vouched share; the
    uncertain requests; the largest bound of a vouched gap."""
    done = ctx.Queue()
    proc = ctx.Process(target=run_tagged_load, args=(url, JITTER_STREAMS, duration_s, tag, done))
    proc.start()
    ids = set(done.get(timeout=duration_s + 120))
    proc.join(timeout=30)
    engine: dict[str, list[float]] = {}
    for rid, times in _drain(sends):
        engine[rid] = times
    recorded: dict[str, tuple[list[float], list[float], bool]] = {}
    for rid, gaps, bounds, uncertain in _drain(records):
        recorded[rid] = (gaps, bounds, uncertain)
    errors: list[float] = []
    every: list[float] = []
    max_bound = 0.0
    total = uncertain_requests = requests = 0
    for rid in ids & engine.keys() & recorded.keys():
        if not rid.startswith(tag):
            continue
        times = engine[rid]
        gaps, bounds, uncertain = recorded[rid]
        engine_gaps = [b - a for a, b in itertools.pairwise(times)]
        if not len(gaps) == len(bounds) == len(engine_gaps):
            continue
        requests += 1
        uncertain_requests += bool(uncertain)
        total += len(gaps)
        for gap, bound, sent in zip(gaps, bounds, engine_gaps, strict=True):
            every.append(abs(gap - sent))
            if not uncertain and bound <= GAP_ERROR_MAX_S:
                errors.append(abs(gap - sent))
                max_bound = max(max_bound, bound)

    def ms(values: list[float], q: float) -> float | None:
        return round(pct(values, q) * 1e3, 3) if values else None

    return {
        "requests": requests,
        "p50_ms": ms(errors, 0.5),
        "p99_ms": ms(errors, 0.99),
        "max_bound_ms": round(max_bound * 1e3, 3),
        "vouched_share": round(len(errors) / total, 3) if total else None,
        "uncertain_requests": uncertain_requests,
        "all_p50_ms": ms(every, 0.5),
        "all_p99_ms": ms(every, 0.99),
    }


def report(name: str, res: dict[str, Any]) -> None:
    p50, p99 = pct(res["ttfts"], 0.5) * 1e3, pct(res["ttfts"], 0.99) * 1e3
    rate = res["chunks"] / res["elapsed_s"]
    print(
        f"{name:>7}: {len(res['ttfts'])} streams, TTFT p50 {p50:.2f} ms p99 {p99:.2f} ms, "
        f"{rate:.0f} chunks/s, errors {res['errors']}, load generator CPU {res['cpu_share']:.0%}",
        flush=True,
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def main() -> None:
    import psutil

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short phases (< 60 s in all)")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2 quick, 5 full)")
    parser.add_argument("--baseline", type=Path, help="source tree of a tap to compare against")
    args = parser.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 5)
    phase_s = 3.0 if args.quick else 12.0
    ctx = mp.get_context("spawn")
    up_port, tap_port, nginx_port = free_port(), free_port(), free_port()
    upstream = ctx.Process(target=serve_upstream, args=(up_port,), daemon=True)
    upstream.start()
    tap = ctx.Process(target=serve_tap, args=(tap_port, f"http://127.0.0.1:{up_port}"), daemon=True)
    tap.start()
    base_port = free_port()
    baseline = (
        start_baseline_tap(args.baseline, base_port, f"http://127.0.0.1:{up_port}")
        if args.baseline
        else None
    )
    workdir = Path(tempfile.mkdtemp(prefix="llmslo-bench-nginx-"))
    nginx = start_nginx(up_port, nginx_port, workdir)
    try:
        wait_port(up_port)
        wait_port(tap_port)
        if baseline is not None:
            wait_port(base_port)
        if nginx is not None:
            wait_port(nginx_port)
        direct, via_tap, via_nginx = (
            f"http://127.0.0.1:{p}" for p in (up_port, tap_port, nginx_port)
        )
        tap_proc = psutil.Process(tap.pid)
        # Before any stream: kib_per_stream then also carries one-time costs (connection pool,
        # first-use allocations), so it errs high.
        idle_rss = tap_proc.memory_info().rss
        for url in (direct, via_tap, *([via_nginx] if nginx else [])):
            # Steady state, not cold start: open the proxies' upstream connection pools to
            # the full concurrency and run every code path once before measuring.
            load(ctx, url, args.streams, 1.0 if args.quick else 2.0, 8, 20)

        def rss_mid_phase() -> int:
            time.sleep(phase_s / 2)
            return int(tap_proc.memory_info().rss)

        # Rounds interleave direct / tap / nginx (order rotated) so a busy machine hurts each
        # mode alike; figures are medians over rounds of the per-round percentile differences.
        modes = {"direct": direct, "tap": via_tap} | ({"nginx": via_nginx} if nginx else {})
        if baseline is not None:
            modes["baseline"] = f"http://127.0.0.1:{base_port}"
            load(ctx, modes["baseline"], args.streams, 1.0 if args.quick else 2.0, 8, 20)
        tap_procs = (
            {"tap": tap_proc}
            | ({"baseline": psutil.Process(baseline.pid)} if baseline is not None else {})
            | ({"nginx": psutil.Process(nginx.pid)} if nginx is not None else {})
        )
        nginx_peak = peak_rss([nginx.pid], phase_s) if nginx else None  # for the footprint
        rounds: list[dict[str, dict[str, Any]]] = []
        open_rss = idle_rss
        ttft_cpu_s = dict.fromkeys(tap_procs, 0.0)
        ttft_chunks = dict.fromkeys(tap_procs, 0)
        for index in range(args.rounds):
            this: dict[str, dict[str, Any]] = {}
            proxies = [name for name in modes if name != "direct"]
            shift = index % len(proxies)  # no proxy always runs right after the direct phase
            for name in ["direct", *proxies[shift:], *proxies[:shift]]:
                url = modes[name]
                during = {"tap": rss_mid_phase, "nginx": nginx_peak}.get(name)
                proc = tap_procs.get(name)
                cpu_before = cpu_s_of(proc) if proc else 0.0
                this[name] = load(
                    ctx, url, args.streams, phase_s, TTFT_TOKENS, TTFT_GAP_MS, during=during
                )
                if name == "tap":
                    open_rss = max(open_rss, this[name]["sampled"])
                if proc:
                    ttft_cpu_s[name] += cpu_s_of(proc) - cpu_before
                    ttft_chunks[name] += this[name]["chunks_total"]
                report(name, this[name])
            rounds.append(this)
        cpu_before = sum(tap_proc.cpu_times()[:2])
        throughput = load(ctx, via_tap, args.streams, phase_s, 256, 0)
        cpu_s = sum(tap_proc.cpu_times()[:2]) - cpu_before
        chunks_per_s = throughput["chunks"] / throughput["elapsed_s"]
        print(
            f"throughput via tap: {chunks_per_s:.0f} chunks/s ({throughput['errors']} errors)",
            flush=True,
        )

        def added(mode: str, q: float) -> float | None:
            if mode not in modes:
                return None
            diffs = [pct(r[mode]["ttfts"], q) - pct(r["direct"]["ttfts"], q) for r in rounds]
            return round(statistics.median(diffs) * 1e3, 3)

        def cpu_per_chunk(mode: str) -> float | None:
            if mode not in tap_procs:
                return None
            return round(ttft_cpu_s[mode] / max(ttft_chunks[mode], 1) * 1e6, 1)

        direct_p50 = statistics.median(pct(r["direct"]["ttfts"], 0.5) for r in rounds)
        summary: dict[str, Any] = {
            "bench": "tap",
            "streams": args.streams,
            "rounds": args.rounds,
            "phase_s": phase_s,
            "direct_ttft_p50_ms": round(direct_p50 * 1e3, 3),
            "nginx_added_ttft_p99_ms": added("nginx", 0.99),
            "tap_rss_mib": round(open_rss / 2**20, 1),
            "tap_cpu_us_per_chunk": round(cpu_s / max(throughput["chunks_total"], 1) * 1e6, 1),
            "tap_cpu_us_per_chunk_ttft": cpu_per_chunk("tap"),
            "nginx_cpu_us_per_chunk_ttft": cpu_per_chunk("nginx"),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "added_ttft_p50_ms": added("tap", 0.5),
            "added_ttft_p99_ms": added("tap", 0.99),
            "chunks_per_s": round(chunks_per_s),
            "nginx_added_ttft_p50_ms": added("nginx", 0.5),
            "kib_per_stream": round(max(open_rss - idle_rss, 0) / args.streams / 1024, 1),
        }
        nginx_rss = max(r["nginx"]["sampled"] for r in rounds) if nginx else None
        summary |= footprint(ctx, direct, nginx_rss, args)
        summary |= jitter_phases(ctx, phase_s)
        if baseline is not None:
            summary["baseline_added_ttft_p50_ms"] = added("baseline", 0.5)
            summary["baseline_added_ttft_p99_ms"] = added("baseline", 0.99)
            summary["baseline_cpu_us_per_chunk_ttft"] = cpu_per_chunk("baseline")
        print(json.dumps(summary), flush=True)
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(timeout=10)
        if baseline is not None:
            baseline.terminate()
            baseline.wait(timeout=10)
        for child in (tap, upstream):
            child.terminate()
            child.join(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def jitter_phases(ctx: Any, phase_s: float) -> dict[str, Any]:
    """Phase 4, without and with one CPU hog per core, in this run; each through a tap
    with kernel receive stamps and one without (``loop_*``: the loop-lag fallback)."""
    from llmslo.drill.hogs import cpu_hogs

    sends, records = ctx.Queue(), ctx.Queue()
    engine_port = free_port()
    engine = ctx.Process(target=serve_paced, args=(engine_port, sends), daemon=True)
    engine.start()
    taps = {}
    for name, kernel in (("", True), ("loop_", False)):
        port = free_port()
        taps[name] = (
            port,
            ctx.Process(
                target=serve_tap,
                args=(port, f"http://127.0.0.1:{engine_port}", records, kernel),
                daemon=True,
            ),
        )
        taps[name][1].start()
    out: dict[str, Any] = {}
    try:
        wait_port(engine_port)
        for name, (port, _) in taps.items():
            wait_port(port)
            jitter_error(ctx, f"http://127.0.0.1:{port}", sends, records, 2.0, f"warm{name}")
        hogs = os.cpu_count() or 1
        for prefix, count in (("", 0), ("hog_", hogs)):
            with cpu_hogs(count, 2 * phase_s + 60):
                for name, (port, _) in taps.items():
                    url = f"http://127.0.0.1:{port}"
                    tag = f"{prefix}{name}run"
                    res = jitter_error(ctx, url, sends, records, phase_s, tag)
                    print(f"jitter error, {name or 'kernel_'}stamps, {count} hogs: {res}")
                    out |= {f"{prefix}{name}jitter_error_{k}": v for k, v in res.items()}
        out["hogs"] = hogs
    finally:
        for _, child in taps.values():
            child.terminate()
            child.join(timeout=10)
        engine.terminate()
        engine.join(timeout=10)
    return out


if __name__ == "__main__":
    main()
