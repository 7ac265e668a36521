"""Benchmark: samples/s through the receiver (remote-write and OTLP) into Kafka, vs the collector.

A fleet of vLLM targets (8 engine cores each: gauges, counters and three 20-bucket
histograms, vLLM's names) is written as Prometheus would: one sample per series per scrape,
``max_samples_per_send`` (2,000 and 10,000) samples per snappy ``WriteRequest``, posted over
loopback by a child process to a real receiver (:class:`collectors.receive.service.ReceiveService`)
publishing to the embedded broker. The same volume is then pushed as OTLP/HTTP protobuf
(``ExportMetricsServiceRequest``, OTel's dotted names, one resource per target, whole
targets per request up to the same batch sizes; a histogram point counts as its 22 classic
series, as in remote-write). The clock runs from the first post to the last sample
acknowledged by Kafka. In the same run the real :class:`collectors.collector.Collector`
scrapes the same volume, as exposition text from a child aiohttp server, into the same
broker. Peak RSS is this process's (receiver or collector, each measured in a fresh child);
``…_samples_per_cpu_s`` divides the samples by the receiving process's CPU seconds over the
same clock (serving thread, publisher, kafka-python's I/O thread); for remote-write,
``…_known_samples_per_cpu_s`` the same over the bodies after those holding the first scrape
(every series known: the steady state of a remote-write), from the moment each sender's
first-scrape bodies were answered.

The issue's target is samples per second *on one core*: remote-write is also run with the
receiving process confined to one CPU (``sched_setaffinity``: its serving thread, publisher
and Kafka I/O thread share it) and the senders and broker to the others, as a receiver runs
on a pinned CPU (Kubernetes' static CPU manager, ``taskset``); ``…_one_core_samples_per_s``
is then samples per second of wall clock on that core (``--no-one-core`` leaves it out).
Unconfined, the threads run on both CPUs, and each core's cache holds less of the other's
work: more CPU seconds for the same samples.

One sender keeps one request in flight. Prometheus sends a remote-write through several
shards at once (``queue_config.max_shards``), each series always through the same shard, so
remote-write is also run with ``--senders`` children, each posting the requests of one shard
of the series (``…_4_senders_…``).

Beside each, the same bodies are decoded and canonicalised in process (no HTTP, no Kafka:
records handed to a list), the receiver's own share of the end-to-end time; for remote-write
also split into the bodies holding the first scrape (every series new:
``…_first_scrape_us_per_sample``) and the others (known series:
``…_known_samples_per_cpu_s``).

    python bench/receive.py                   # full (1 M samples per door and batch size)
    python bench/receive.py --quick           # < 60 s (20 k samples: one scrape, all cold)
    python bench/receive.py --samples 200000  # 7 scrapes of 50 targets: one sample in 7 new
    python bench/receive.py --doors receive --no-collect  # remote-write alone

The last line is JSON: {"bench": "receive", "receive_2000_samples_per_s": …,
"receive_2000_samples_per_cpu_s": …, "receive_2000_known_samples_per_cpu_s": …,
"receive_2000_4_senders_samples_per_s": …, "receive_2000_one_core_known_samples_per_s": …,
"receive_10000_samples_per_s": …, "otlp_2000_samples_per_s": …, "otlp_10000_samples_per_s": …,
"…_in_process_samples_per_s": …, "…_in_process_known_samples_per_cpu_s": …,
"collect_samples_per_s": …, "…_peak_rss_mib": …}
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import snappy
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2

from collectors.collector import Collector
from collectors.config import CollectConfig, TargetConfig
from collectors.receive._prompb import WriteRequest
from collectors.receive.config import ReceiveConfig, ReceiveLimits
from collectors.receive.otlp import PROTOBUF, decode_otlp
from collectors.receive.receiver import Receiver
from collectors.receive.remote_write import RemoteWriteDecoder
from collectors.receive.service import ReceiveService, raise_young_gc_threshold
from pipeline.broker import EmbeddedBroker, free_port
from pipeline.bus import Bus
from pipeline.config import BusConfig
from pipeline.publisher import KafkaPublisher, PublishBuffer

ENGINES = 8
BUCKETS = [0.001 * 2**i for i in range(19)]
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total"]
HISTOGRAMS = [
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
]


def target_series() -> list[tuple[str, dict[str, str], str]]:
    """(name, labels, le or '') of one target's series."""
    out = []
    for engine in range(ENGINES):
        labels = {"engine": str(engine), "model_name": "llama-3-8b"}
        out += [(n, labels, "") for n in GAUGES + COUNTERS]
        for h in HISTOGRAMS:
            out += [(f"{h}_bucket", labels, repr(le)) for le in BUCKETS] + [
                (f"{h}_bucket", labels, "+Inf"),
                (f"{h}_sum", labels, ""),
                (f"{h}_count", labels, ""),
            ]
    return out


def exposition(round_: int) -> str:
    lines = []
    for name, labels, le in target_series():
        text = ",".join(f'{k}="{v}"' for k, v in labels.items()) + (f',le="{le}"' if le else "")
        lines.append(f"{name}{{{text}}} {round_ + 1}")
    return "\n".join(lines) + "\n"


def write_bodies(
    targets: int, rounds: int, per_request: int, shard: int = 0, shards: int = 1
) -> list[bytes]:
    """Snappy WriteRequests of ``per_request`` samples covering ``rounds`` scrapes: of every
    series when ``shards`` is 1, else of shard ``shard``'s (as Prometheus' queue manager
    shards a remote-write: each series always in the same shard, so in order)."""
    series = target_series()
    bodies, request, count = [], WriteRequest(), 0
    for r in range(rounds):
        for t in range(targets):
            for i, (name, labels, le) in enumerate(series):
                if (t * len(series) + i) % shards != shard:
                    continue
                ts = request.timeseries.add()
                pairs = {
                    "__name__": name,
                    "job": "vllm",
                    "instance": f"10.0.{t // 250}.{t % 250}:8000",
                }
                pairs |= labels | ({"le": le} if le else {})
                for k in sorted(pairs):
                    ts.labels.add(name=k, value=pairs[k])
                ts.samples.add(value=float(r + 1), timestamp=1_764_000_000_000 + r * 5000)
                count += 1
                if count == per_request:
                    bodies.append(snappy.compress(request.SerializeToString()))
                    request, count = WriteRequest(), 0
    if count:
        bodies.append(snappy.compress(request.SerializeToString()))
    return bodies


def otlp_bodies(targets: int, rounds: int, per_request: int) -> list[bytes]:
    """OTLP protobuf requests of whole targets, at most ``per_request`` samples each
    (at least one target), covering ``rounds`` scrapes."""
    per_target = len(target_series())
    per_body = max(1, per_request // per_target)
    cumulative = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    bodies, request = [], ExportMetricsServiceRequest()
    for r in range(rounds):
        ts_ns = (1_764_000_000_000 + r * 5000) * 1_000_000
        value = float(r + 1)
        for t in range(targets):
            resource = request.resource_metrics.add()
            attribute = resource.resource.attributes.add(key="k8s.pod.name")
            attribute.value.string_value = f"vllm-{t}"
            scope = resource.scope_metrics.add()
            for engine in range(ENGINES):
                attrs = {"engine": str(engine), "model_name": "llama-3-8b"}
                for name in GAUGES:
                    metric = scope.metrics.add(name=name.replace(":", "."))
                    _point(metric.gauge.data_points.add(), attrs, ts_ns).as_double = value
                for name in COUNTERS:
                    metric = scope.metrics.add(name=name.replace(":", ".")[: -len("_total")])
                    metric.sum.is_monotonic = True
                    metric.sum.aggregation_temporality = cumulative
                    _point(metric.sum.data_points.add(), attrs, ts_ns).as_double = value
                for name in HISTOGRAMS:
                    metric = scope.metrics.add(
                        name=name.replace(":", ".")[: -len("_seconds")], unit="s"
                    )
                    metric.histogram.aggregation_temporality = cumulative
                    point = _point(metric.histogram.data_points.add(), attrs, ts_ns)
                    point.explicit_bounds.extend(BUCKETS)
                    point.bucket_counts.extend([0] * len(BUCKETS) + [r + 1])
                    point.count, point.sum = r + 1, value
            if len(request.resource_metrics) == per_body:
                bodies.append(request.SerializeToString())
                request = ExportMetricsServiceRequest()
    if len(request.resource_metrics):
        bodies.append(request.SerializeToString())
    return bodies


def _point(point: Any, attrs: dict[str, str], ts_ns: int) -> Any:
    point.time_unix_nano = ts_ns
    for key, value in attrs.items():
        point.attributes.add(key=key).value.string_value = value
    return point


DOORS = {
    "receive": ("/api/v1/write", {"Content-Encoding": "snappy"}, 204),
    "otlp": ("/v1/metrics", {}, 200),
}


def _post_all(
    port: int, door: str, bodies: list[bytes], cold: int, started: Any, warm: Any, done: Any
) -> None:
    """Post ``bodies`` one at a time; ``warm`` is set once the first ``cold`` are answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    path, extra, ok = DOORS[door]
    headers = {"Content-Type": "application/x-protobuf"} | extra
    started.set()
    try:
        for sent, body in enumerate(bodies):
            if sent == cold:
                warm.set()
            while True:
                conn.request("POST", path, body=body, headers=headers)
                response = conn.getresponse()
                text = response.read()
                if response.status != 503:
                    if response.status != ok:
                        print(f"write refused: {response.status} {text[:200]!r}", file=sys.stderr)
                    break
                time.sleep(0.05)
    finally:
        warm.set()
        done.set()


def _pin(pid: int, cpus: set[int]) -> None:
    """Confine every thread of process ``pid`` to ``cpus`` (its later threads inherit it)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that has just ended
            os.sched_setaffinity(int(task), cpus)


def bench_receive(
    bootstrap: str,
    door: str,
    per_request: int,
    samples: int,
    senders: int,
    core: int | None,
    out: Any,
) -> None:
    """``core``: confine this process (the receiver: serving thread, publisher, Kafka I/O) to
    that CPU, and the senders to the others."""
    others = os.sched_getaffinity(0) - {core}
    if core is not None:
        _pin(os.getpid(), {core})
    targets = max(1, min(50, samples // len(target_series())))
    rounds = max(1, samples // (targets * len(target_series())))
    bus = Bus(BusConfig(bootstrap_servers=bootstrap, topic_prefix=f"b{door}{per_request}."))
    bus.ensure_topics()
    service = ReceiveService(ReceiveConfig(port=0, buffer_max_rows=2_000_000), bus.producer)
    raise_young_gc_threshold()  # as `llmslo receive` does
    stop = threading.Event()
    worker = threading.Thread(target=service.run, args=(stop,))
    worker.start()
    service.ready.wait(30)
    if door == "receive":
        shards = [write_bodies(targets, rounds, per_request, k, senders) for k in range(senders)]
    else:  # OTLP: one sender (whole targets per request)
        shards = [otlp_bodies(targets, rounds, per_request)]
    total = targets * rounds * len(target_series())
    # per sender, the bodies holding a sample of the first scrape (every series new)
    first_scrape = targets * len(target_series())
    colds = [
        -(-len(range(k, first_scrape, len(shards))) // per_request) if door == "receive" else 0
        for k in range(len(shards))
    ]
    posters = []
    for bodies, cold in zip(shards, colds, strict=True):
        started, warm, done = (multiprocessing.Event() for _ in range(3))
        sender = multiprocessing.Process(
            target=_post_all, args=(service.port, door, bodies, cold, started, warm, done)
        )
        sender.start()
        if core is not None and sender.pid is not None:
            _pin(sender.pid, others)
        posters.append((sender, started, warm, done))
    for _, started, _, _ in posters:
        started.wait(60)
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    for _, _, warm, _ in posters:
        warm.wait(600)
    cpu_warm, t_warm = _cpu_s(), time.perf_counter()
    for _, _, _, done in posters:
        done.wait(600)
    stop.set()
    worker.join(600)  # drains the buffer to Kafka
    t_end = time.perf_counter()
    elapsed = t_end - t0
    cpu = _cpu_s() - cpu0
    for sender, _, _, _ in posters:
        sender.join(30)
    bus.stop()
    got = {
        "samples": total,
        "samples_per_request": round(total / sum(len(b) for b in shards)),
        "rows_published": service.published_rows,
        "samples_per_s": total / elapsed,
        "samples_per_cpu_s": total / cpu,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if door == "receive" and all(0 < c < len(b) for c, b in zip(colds, shards, strict=True)):
        # the bodies after the first scrape's (known series), every one but each shard's last
        # holding per_request samples; the cold rows still being published count here
        known = total - sum(colds) * per_request
        got["known_samples_per_cpu_s"] = known / (cpu0 + cpu - cpu_warm)
        got["known_samples_per_s"] = known / (t_end - t_warm)
    out.put(got)


def _cpu_s() -> float:
    """CPU seconds of this process so far (every thread: serving, publisher, Kafka I/O)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_in_process(door: str, per_request: int, samples: int, out: Any) -> None:
    """The same bodies decoded and canonicalised in this process, records kept in a list."""
    targets = max(1, min(50, samples // len(target_series())))
    rounds = max(1, samples // (targets * len(target_series())))
    build = write_bodies if door == "receive" else otlp_bodies
    bodies = build(targets, rounds, per_request)
    raise_young_gc_threshold()
    limits = ReceiveLimits()
    remote_write = RemoteWriteDecoder(limits)
    tables: list[Any] = []
    receiver = Receiver(lambda schema, table: tables.append(table))
    total = targets * rounds * len(target_series())
    # the bodies holding a sample of the first scrape (every series new), then the others
    cold = -(-targets * len(target_series()) // per_request) if door == "receive" else 0
    cpu_at: list[float] = []
    t0, cpu0 = time.perf_counter(), time.process_time()
    for i, body in enumerate(bodies):
        if i == cold:
            cpu_at.append(time.process_time())
        if door == "receive":
            receiver.ingest(remote_write.decode(body, receiver.known_series()))
        else:
            receiver.ingest(decode_otlp(body, PROTOBUF, False, limits))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    got = {
        "samples_per_s": total / elapsed,
        "samples_per_cpu_s": total / cpu,
        "rows": sum(t.num_rows for t in tables),
    }
    if cpu_at and 0 < cold < len(bodies):  # remote-write over several scrapes
        known = total - cold * per_request  # every body but the last holds per_request
        got["known_samples_per_cpu_s"] = known / (time.process_time() - cpu_at[0])
        got["first_scrape_us_per_sample"] = (cpu_at[0] - cpu0) / (cold * per_request) * 1e6
    out.put(got)


def _serve(port: int, targets: int, ready: Any) -> None:
    from aiohttp import web

    text = exposition(0)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{name}", handler)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def bench_collect(bootstrap: str, samples: int, out: Any) -> None:
    targets = max(1, min(50, samples // len(target_series())))
    rounds = max(1, samples // (targets * len(target_series())))
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(port, targets, ready), daemon=True)
    server.start()
    ready.wait(30)
    time.sleep(1.0)
    bus = Bus(BusConfig(bootstrap_servers=bootstrap, topic_prefix="bc."))
    bus.ensure_topics()
    buffer = PublishBuffer(2_000_000)
    publisher = KafkaPublisher(bus.producer, buffer).start()
    config = CollectConfig(
        targets=[TargetConfig(url=f"127.0.0.1:{port}/t{i}") for i in range(targets)],
        interval_s=0.001,
        jitter_s=0.0,
        timeout_s=30,
        readiness_interval_s=0,
    )
    collector = Collector(config, buffer.put)
    t0 = time.perf_counter()
    asyncio.run(collector.run(rounds=rounds))
    publisher.stop(drain_timeout_s=600)
    elapsed = time.perf_counter() - t0
    publisher.close()
    server.terminate()
    bus.stop()
    total = targets * rounds * len(target_series())
    out.put(
        {
            "samples": total,
            "rows_published": publisher.published_rows,
            "samples_per_s": total / elapsed,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def _in_child(target: Any, *args: Any) -> dict[str, Any]:
    out: Any = multiprocessing.Queue()
    child = multiprocessing.Process(target=target, args=(*args, out))
    child.start()
    while child.is_alive() and out.empty():
        time.sleep(0.2)
    if out.empty():
        raise SystemExit(f"{target.__name__} failed (exit code {child.exitcode})")
    result = out.get()
    child.join(60)
    return dict(result)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s)")
    parser.add_argument(
        "--samples", type=int, default=1_000_000, help="per door and batch size (default 1 M)"
    )
    parser.add_argument(
        "--senders",
        type=int,
        default=4,
        help="remote-write also with this many concurrent senders, each a shard of the series "
        "(Prometheus' queue_config.max_shards); 1: only the one-in-flight run (default 4)",
    )
    parser.add_argument(
        "--doors",
        nargs="+",
        choices=sorted(DOORS),
        default=sorted(DOORS),
        help="the doors to run (default both)",
    )
    parser.add_argument(
        "--no-collect", action="store_true", help="leave out the collector scraping the same volume"
    )
    parser.add_argument(
        "--one-core",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="remote-write also with the receiver confined to one CPU, its senders and the "
        "broker to the others (default on, where there are two CPUs or more)",
    )
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.one_core and len(cpus) < 2:
        print("--one-core left out: it needs two CPUs (one for the receiver, one for the rest)")
        args.one_core = False
    # --quick: the receiver runs at ~10 k samples/s on a loaded 2-core machine; 20 k samples
    # per door and batch size keep the whole run (5 children, one broker) under a minute
    samples = 20_000 if args.quick else args.samples
    result: dict[str, Any] = {"bench": "receive", "samples": samples}
    with EmbeddedBroker() as broker:
        for door in [d for d in DOORS if d in args.doors]:
            for per_request in (2000, 10_000):
                got = _in_child(
                    bench_receive, broker.bootstrap_servers, door, per_request, samples, 1, None
                )
                print(f"{door}, {per_request} samples/request: {got}")
                result[f"{door}_{per_request}_samples_per_s"] = round(got["samples_per_s"])
                result[f"{door}_{per_request}_samples_per_cpu_s"] = round(got["samples_per_cpu_s"])
                result[f"{door}_{per_request}_peak_rss_mib"] = round(got["peak_rss_mib"], 1)
                result[f"{door}_{per_request}_rows_published"] = got["rows_published"]
                if "known_samples_per_cpu_s" in got:
                    result[f"{door}_{per_request}_known_samples_per_cpu_s"] = round(
                        got["known_samples_per_cpu_s"]
                    )
                if door == "receive" and args.senders > 1:
                    got = _in_child(
                        bench_receive,
                        broker.bootstrap_servers,
                        door,
                        per_request,
                        samples,
                        args.senders,
                        None,
                    )
                    print(f"{door}, {per_request} samples/request, {args.senders} senders: {got}")
                    key = f"{door}_{per_request}_{args.senders}_senders"
                    result[f"{key}_samples_per_s"] = round(got["samples_per_s"])
                    result[f"{key}_samples_per_cpu_s"] = round(got["samples_per_cpu_s"])
                    result[f"{key}_rows_published"] = got["rows_published"]
                    if "known_samples_per_cpu_s" in got:
                        result[f"{key}_known_samples_per_cpu_s"] = round(
                            got["known_samples_per_cpu_s"]
                        )
                if door == "receive" and args.one_core:
                    core, rest = cpus[0], set(cpus[1:])
                    for pid in broker.pids:  # the broker on the senders' side
                        _pin(pid, rest)
                    got = _in_child(
                        bench_receive, broker.bootstrap_servers, door, per_request, samples, 1, core
                    )
                    for pid in broker.pids:
                        _pin(pid, set(cpus))
                    print(f"{door}, {per_request} samples/request, on one CPU: {got}")
                    key = f"{door}_{per_request}_one_core"
                    for name in ("samples_per_s", "samples_per_cpu_s", "rows_published"):
                        result[f"{key}_{name}"] = round(got[name])
                    for name in ("known_samples_per_s", "known_samples_per_cpu_s"):
                        if name in got:
                            result[f"{key}_{name}"] = round(got[name])
                got = _in_child(bench_in_process, door, per_request, samples)
                print(f"{door}, {per_request} samples/request, in process: {got}")
                result[f"{door}_{per_request}_in_process_samples_per_s"] = round(
                    got["samples_per_s"]
                )
                result[f"{door}_{per_request}_in_process_samples_per_cpu_s"] = round(
                    got["samples_per_cpu_s"]
                )
                for name in ("known_samples_per_cpu_s", "first_scrape_us_per_sample"):
                    if name in got:
                        result[f"{door}_{per_request}_in_process_{name}"] = round(got[name], 1)
        if not args.no_collect:
            got = _in_child(bench_collect, broker.bootstrap_servers, samples)
            print(f"collect, same volume: {got}")
            result["collect_samples_per_s"] = round(got["samples_per_s"])
            result["collect_peak_rss_mib"] = round(got["peak_rss_mib"], 1)
            result["collect_rows_published"] = got["rows_published"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
