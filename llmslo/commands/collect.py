"""The collectors' subcommands: ``collect`` (the scrape loop) and ``scrape`` (one-shot look)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, get_args

from collectors.collector import Collector, TargetHealth
from collectors.config import CollectConfig, DialectChoice, TargetConfig
from collectors.inspect import inspect_url, render_report
from collectors.metrics import CollectorMetrics
from llmslo.options import (
    add_common_options,
    add_subcommand,
    pipeline_bus,
    print_json,
    resolve_config,
    serve_metrics,
)
from llmslo.progress import add_quiet_option, status_lines
from pipeline.bus import Bus, BusProducer
from pipeline.errors import BusError
from pipeline.publisher import KafkaPublisher, PublishBuffer, PublishMetrics

__all__ = ["outage_producer", "register"]

log = logging.getLogger(__name__)


#: ``--dialect`` takes what a target's ``dialect`` takes.
DIALECT_CHOICES = get_args(DialectChoice)


def register(subparsers: Any) -> None:
    """Add ``collect`` and ``scrape``."""
    collect = add_subcommand(
        subparsers,
        "collect",
        "Scrape engine and dcgm-exporter targets and publish them to Kafka.",
        "llmslo collect -c config/collectors.example.yaml\n"
        "llmslo collect --target 127.0.0.1:8000 --target 127.0.0.1:9400 \\\n"
        "    --bootstrap-servers 127.0.0.1:9092\n"
        "llmslo collect -c config/collectors.example.yaml --rounds 1    # one round, then a summary",
    )
    add_common_options(collect)
    collect.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="extra target (http://host:port/metrics or host:port); repeatable",
    )
    collect.add_argument("--pool", help="pool of the --target engines")
    collect.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="K=V",
        help="label of the --target targets (instance=, pod=, node=, …); repeatable",
    )
    collect.add_argument(
        "--interval", type=float, help="seconds between rounds (overrides collect.interval_s)"
    )
    collect.add_argument(
        "--rounds", type=int, help="stop after this many rounds (default: until SIGTERM)"
    )
    collect.add_argument(
        "--metrics-port", type=int, help="serve the collector's /metrics on this loopback port"
    )
    add_quiet_option(collect)
    collect.set_defaults(handler=run_collect)

    scrape = add_subcommand(
        subparsers,
        "scrape",
        "Scrape one endpoint once and show what llmslo sees: dialect, signals, unknown metrics.",
        "llmslo scrape http://127.0.0.1:8000/metrics\n"
        "llmslo scrape 10.0.0.9:9400 --dialect dcgm --json",
    )
    scrape.add_argument("url", help="http(s) URL of /metrics, or host:port")
    scrape.add_argument(
        "--dialect", choices=DIALECT_CHOICES, default="auto", help="force a dialect (default auto)"
    )
    scrape.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    scrape.add_argument("--json", action="store_true", help="print one JSON object")
    scrape.set_defaults(handler=run_scrape)


def run_scrape(args: argparse.Namespace) -> int:
    report = inspect_url(args.url, dialect=args.dialect, timeout_s=args.timeout)
    if args.json:
        print_json(report)
    else:
        print(render_report(report), end="")
    return 0


def collect_config(args: argparse.Namespace) -> CollectConfig:
    """The ``collect`` section with command-line overrides applied."""
    config = resolve_config(args).section("collect", CollectConfig)
    updates: dict[str, Any] = {}
    if args.target:
        labels = dict(pair.partition("=")[::2] for pair in args.label)
        added = [TargetConfig(url=url, pool=args.pool, labels=labels) for url in args.target]
        updates["targets"] = [*config.targets, *added]
    if args.interval is not None:
        updates["interval_s"] = args.interval
    if args.metrics_port is not None:
        updates["metrics_port"] = args.metrics_port
    return CollectConfig.model_validate(config.model_dump() | updates) if updates else config


def run_collect(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    collect = collect_config(args)
    metrics = CollectorMetrics()
    if collect.metrics_port is not None:
        port = serve_metrics(collect.metrics_port, collect.metrics_host, metrics.registry)
        log.info("serving /metrics on %s:%d", collect.metrics_host, port)
    timeout_ms = int(collect.publish_timeout_s * 1000)
    with pipeline_bus(config, args) as bus:
        # Kafka may be down at start: ride it out like any outage (the buffer holds the rounds),
        # but give a healthy cluster a moment so topics get our partition count first.
        topics = threading.Thread(
            target=_ensure_topics, args=(bus,), name="llmslo-collect-topics", daemon=True
        )
        topics.start()
        topics.join(5.0)

        def make_producer() -> BusProducer:
            return outage_producer(bus, timeout_ms)

        buffer = PublishBuffer(
            collect.buffer_max_rows,
            PublishMetrics("collect", metrics.registry),
            on_drop=metrics.count_drop,
        )
        publisher = KafkaPublisher(
            make_producer, buffer, publish_timeout_s=collect.publish_timeout_s
        ).start()
        collector = Collector(collect, buffer.put, metrics=metrics)
        describe = _status(collector, buffer, publisher)
        try:
            with status_lines(describe, quiet=args.quiet):
                asyncio.run(_run_until_signal(collector, args.rounds))
        finally:
            publisher.stop(drain_timeout_s=collect.publish_timeout_s)
            publisher.close()
    print_json(
        {
            "collect": "stopped",
            "published_rows": publisher.published_rows,
            "dropped_rows": buffer.dropped_rows,
            "unpublished_rows": buffer.rows + publisher.in_flight_rows,
            "targets": {url: h.as_dict() for url, h in collector.health.items()},
        }
    )
    lost = buffer.dropped_rows + buffer.rows + publisher.in_flight_rows
    return _nothing_scraped(collector.health) or _nothing_published(
        bus, publisher.published_rows, lost
    )


def _status(
    collector: Collector, buffer: PublishBuffer, publisher: KafkaPublisher
) -> Callable[[], str]:
    """The collector's status line: targets up, scrapes, rows published, buffered, dropped."""

    def describe() -> str:
        health = list(collector.health.values())
        up = sum(h.up for h in health)
        line = (
            f"llmslo collect: {up} of {len(health)} targets up, "
            f"{sum(h.scrapes_ok for h in health):,} scrapes ok, "
            f"{sum(h.scrapes_failed for h in health):,} failed; "
            f"{publisher.published_rows:,} rows published, {buffer.rows:,} buffered, "
            f"{buffer.dropped_rows:,} dropped"
        )
        down = sorted((h.url, h.last_error) for h in health if not h.up)
        if down:
            line += f"; {down[0][0]}: {down[0][1] or 'not scraped yet'}"
        return line

    return describe


def _nothing_scraped(health: dict[str, TargetHealth]) -> int:
    """1 with a sentence on stderr when no scrape of any target succeeded, else 0."""
    if not health:
        sys.stderr.write(
            "llmslo collect: no targets to scrape: give --target URL or collect.targets "
            "(or collect.file_sd) in the config\n"
        )
        return 1
    if any(h.scrapes_ok for h in health.values()):
        return 0
    failed = sum(h.scrapes_failed for h in health.values())
    lines = [
        f"llmslo collect: all {failed} scrapes of {len(health)} targets failed, nothing collected:"
    ]
    lines += [f"  {url}: {h.last_error or 'not scraped'}" for url, h in sorted(health.items())]
    sys.stderr.write("\n".join(lines) + "\n")
    return 1


def _nothing_published(bus: Bus, published_rows: int, lost_rows: int) -> int:
    """1 with a sentence on stderr when rows were collected and none reached Kafka (the
    broker named was never reachable), else 0: a collector is no success without its bus."""
    if published_rows or not lost_rows:
        return 0
    sys.stderr.write(
        f"llmslo collect: nothing reached Kafka at {bus.where}: {lost_rows} rows collected, "
        "none published; is the broker running at that address?\n"
    )
    return 1


def outage_producer(bus: Bus, timeout_ms: int) -> BusProducer:
    """A producer for a component that rides out Kafka outages behind its publish buffer:
    each call blocks at most ``min(timeout_ms, 5 s)`` and reconnects within a second."""
    return bus.producer(
        max_block_ms=min(timeout_ms, 5000),
        request_timeout_ms=min(timeout_ms, 5000),
        delivery_timeout_ms=timeout_ms + 5000,
        reconnect_backoff_max_ms=1000,
        bootstrap_timeout_ms=min(timeout_ms, 5000),
    )


def _ensure_topics(bus: Bus) -> None:
    try:
        bus.ensure_topics()
    except BusError as exc:
        log.error("cannot create topics yet (%s); publishing will retry", exc)


async def _run_until_signal(collector: Collector, rounds: int | None) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, collector.stop)
    await collector.run(rounds=rounds)
