"""``llmslo probe``: synthetic streaming requests through the real entry point, as records."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from collectors.probe import ProbeConfig, Prober
from llmslo.options import (
    add_common_options,
    add_subcommand,
    pipeline_bus,
    print_json,
    resolve_config,
)
from llmslo.progress import add_quiet_option, status_lines
from pipeline.bus import Bus
from pipeline.errors import ConfigError
from pipeline.publisher import KafkaPublisher, PublishBuffer, PublishMetrics

__all__ = ["probe_until", "register"]

EXAMPLES = """\
llmslo probe --url http://127.0.0.1:8080 --interval 10 --bootstrap-servers 127.0.0.1:9092
llmslo probe --url http://gateway.internal:8080 --model llama-3-8b --max-tokens 8 --rounds 3
"""


def register(subparsers: Any) -> None:
    """Add ``probe``."""
    parser = add_subcommand(
        subparsers,
        "probe",
        "Probe a streaming LLM entry point (gateway URL) at an interval; publish request "
        "records with source=probe (TTFT, TPOT, outcome, error kind).",
        EXAMPLES,
    )
    add_common_options(parser)
    parser.add_argument("--url", required=True, help="entry point base URL (gateway, not a pod)")
    parser.add_argument("--model", default="llama-3-8b", help="model to ask (default llama-3-8b)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between probes")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-probe deadline, seconds")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per probe (default 8)")
    parser.add_argument("--pool", help="pool label of the records (default: the model)")
    parser.add_argument(
        "--instance", help="entry point name in the records (default: the URL's host:port)"
    )
    parser.add_argument("--rounds", type=int, help="stop after this many probes")
    add_quiet_option(parser)
    parser.set_defaults(handler=run_probe)


def run_probe(args: argparse.Namespace) -> int:
    try:
        probe = ProbeConfig(
            url=args.url,
            model=args.model,
            interval_s=args.interval,
            timeout_s=args.timeout,
            max_tokens=args.max_tokens,
            pool=args.pool,
            instance=args.instance,
        )
    except ValueError as exc:
        raise ConfigError(f"probe: {exc}") from exc
    config = resolve_config(args)
    with pipeline_bus(config, args) as bus:
        bus.ensure_topics()
        buffer = PublishBuffer(10_000, PublishMetrics("probe"))
        publisher = KafkaPublisher(bus.producer, buffer).start()
        prober = Prober(probe, buffer.put)
        try:
            with status_lines(_status(prober, publisher), quiet=args.quiet):
                asyncio.run(_run_until_signal(prober, args.rounds))
        finally:
            publisher.stop(drain_timeout_s=10)
            publisher.close()
    print_json(
        {
            "probe": "stopped",
            "probes": prober.probes,
            "ok": prober.ok,
            "failed": prober.failed,
            "last_error": prober.last_error,
            "published_rows": publisher.published_rows,
            "dropped_rows": buffer.dropped_rows,
        }
    )
    if prober.probes and not prober.ok:
        failures = ", ".join(f"{n} {kind}" for kind, n in sorted(prober.failed.items()))
        sys.stderr.write(
            f"llmslo probe: every probe of {probe.url} failed ({failures}): {prober.last_error}\n"
        )
        return 1
    return 0


def _status(prober: Prober, publisher: KafkaPublisher) -> Callable[[], str]:
    """The prober's status line: probes sent, how they ended, rows published."""

    def describe() -> str:
        failed = ", ".join(f"{n} {kind}" for kind, n in sorted(prober.failed.items()))
        line = (
            f"llmslo probe {prober.config.url}: {prober.probes:,} probes, {prober.ok:,} ok, "
            f"{sum(prober.failed.values()):,} failed{f' ({failed})' if failed else ''}; "
            f"{publisher.published_rows:,} rows published"
        )
        if prober.failed:
            line += f"; last error: {prober.last_error}"
        return line

    return describe


async def _run_until_signal(prober: Prober, rounds: int | None) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, prober.stop)
    await prober.run(rounds=rounds)


def probe_until(bus: Bus, configs: Sequence[ProbeConfig], stop: threading.Event) -> int:
    """Probe every entry point of ``configs`` (one prober each), publishing their records on
    ``bus``, until ``stop`` is set; returns the probes sent. What ``llmslo run`` runs for a
    ``probe:`` section, and the demo against its gateway."""
    buffer = PublishBuffer(10_000, PublishMetrics("probe"))
    publisher = KafkaPublisher(bus.producer, buffer).start()
    probers = [Prober(config, buffer.put) for config in configs]

    async def run_all() -> None:
        tasks = [asyncio.create_task(p.run()) for p in probers]
        await asyncio.to_thread(stop.wait)
        for prober in probers:
            prober.stop()
        await asyncio.gather(*tasks)

    try:
        asyncio.run(run_all())
    finally:
        publisher.stop(drain_timeout_s=10)
        publisher.close()
    return sum(p.probes for p in probers)
