"""The spine's subcommands: ``broker``, ``ingest``, ``config validate``, ``tables``."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.tables import API_TABLES
from llmslo.options import (
    add_common_options,
    add_subcommand,
    install_stop_handlers,
    pipeline_bus,
    print_json,
    resolve_config,
    serve_metrics,
)
from llmslo.progress import add_quiet_option, status_lines
from llmslo.sections import load_config
from pipeline.broker import EmbeddedBroker
from pipeline.broker_address import address_file, published_address
from pipeline.errors import LlmsloError
from pipeline.iceberg.lake import open_iceberg_lake
from pipeline.ingest import Ingester, IngestMetrics
from pipeline.lake import export_hours, lake_object_store
from pipeline.s3 import ObjectStore
from pipeline.store import Store
from pipeline.tables import render_tables_doc
from slo.tables import DOCUMENTED_TABLES

__all__ = ["ingest_status", "register"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add the spine's subcommands."""
    broker = add_subcommand(
        subparsers,
        "broker",
        "Start the embedded Kafka-protocol broker and print its address; the pipeline's "
        "other commands (same store.path) join it without flags.",
        "llmslo broker\nllmslo broker --port 19092\nllmslo broker --db var/other.duckdb",
    )
    add_common_options(broker, bus=False, db=True)
    broker.add_argument("--port", type=int, help="loopback port (default: a free one)")
    broker.set_defaults(handler=run_broker)

    ingest = add_subcommand(
        subparsers,
        "ingest",
        "Consume llmslo's Kafka topics into DuckDB, exactly once.",
        "llmslo ingest --bootstrap-servers 127.0.0.1:9092 --db var/llmslo.duckdb\n"
        "llmslo ingest -c config/llmslo.example.yaml --metrics-port 9465",
    )
    add_common_options(ingest, db=True)
    ingest.add_argument("--group", help="consumer group (overrides ingest.group_id)")
    ingest.add_argument(
        "--instance-id", help="static group member id (restarts rejoin without a rebalance)"
    )
    ingest.add_argument("--metrics-port", type=int, help="serve /metrics on this loopback port")
    ingest.add_argument(
        "--exit-when-idle",
        type=float,
        metavar="SECONDS",
        help="stop after this long without a message while owning partitions (batch jobs, "
        "tests); a rebalance in progress is not idleness",
    )
    add_quiet_option(ingest)
    ingest.set_defaults(handler=run_ingest)

    config = add_subcommand(
        subparsers,
        "config",
        "Check a config file.",
        "llmslo config validate config/llmslo.example.yaml",
    )
    config_sub = config.add_subparsers(dest="config_command", required=True)
    validate = config_sub.add_parser(
        "validate", help="validate FILE and report every error by field path"
    )
    validate.add_argument("file", type=Path)
    validate.set_defaults(handler=run_config_validate)

    tables = add_subcommand(
        subparsers,
        "tables",
        "Print the documented DuckDB tables (Markdown).",
        "llmslo tables > docs/tables.md",
    )
    tables.set_defaults(
        handler=lambda args: (
            sys.stdout.write(render_tables_doc((*DOCUMENTED_TABLES, *API_TABLES))) and 0
        )
    )


def run_broker(args: argparse.Namespace) -> int:
    stopped = threading.Event()
    install_stop_handlers(stopped.set)
    where = address_file(resolve_config(args).store.path)
    with (
        EmbeddedBroker(port=args.port) as broker,
        published_address(where, broker.bootstrap_servers, "llmslo broker") as written,
    ):
        print(f"bootstrap servers: {broker.bootstrap_servers}", flush=True)
        if written:
            print(f"address written to {where}: commands on that store join it", flush=True)
        while not stopped.wait(0.5):
            pass
    return 0


def run_ingest(
    args: argparse.Namespace, *, after_commit: Callable[[int], None] | None = None
) -> int:
    """``llmslo ingest``; ``after_commit`` goes to the :class:`Ingester` (called with the
    count of DuckDB commits after each)."""
    config = resolve_config(args)
    ingest_config = config.ingest
    overrides: dict[str, Any] = {}
    if args.group:
        overrides["group_id"] = args.group
    if args.metrics_port is not None:
        overrides["metrics_port"] = args.metrics_port
    ingest_config = ingest_config.model_copy(update=overrides)
    metrics = IngestMetrics()
    if ingest_config.metrics_port is not None:
        port = serve_metrics(
            ingest_config.metrics_port, ingest_config.metrics_host, metrics.registry
        )
        log.info("serving /metrics on %s:%d", ingest_config.metrics_host, port)
    with (
        pipeline_bus(config, args, owner=True) as bus,
        Store(config.store.path, memory_limit=ingest_config.duckdb_memory_limit) as store,
    ):
        bus.ensure_topics()
        ingester = Ingester(
            bus,
            store,
            ingest_config,
            metrics=metrics,
            instance_id=args.instance_id,
            after_commit=after_commit,
            lake=open_iceberg_lake(config.store, ingest_config.group_id, bus.prefix),
        )
        install_stop_handlers(ingester.stop)
        exporting = threading.Event()
        if config.store.lake_dir is not None:
            ingester_id = args.instance_id or f"{socket.gethostname()}-{os.getpid()}"
            threading.Thread(
                target=_export_lake_periodically,
                name="lake-export",
                daemon=True,
                args=(
                    store,
                    config.store.lake_dir,
                    ingester_id,
                    exporting,
                    lake_object_store(config.store.lake_dir, config.store.s3),
                ),
            ).start()
        with status_lines(ingest_status(ingester), quiet=args.quiet):
            stats = ingester.run(max_idle_s=args.exit_when_idle)
        exporting.set()
    print_json(
        {
            "ingest": "stopped",
            "messages": stats.messages,
            "rows": stats.rows,
            "deadletters": stats.deadletters,
            "commits": stats.commits,
        }
    )
    return 0


def ingest_status(ingester: Ingester, command: str = "llmslo ingest") -> Callable[[], str]:
    """The status line of an ingesting process: what came in, what was stored, commits."""
    last = [0]

    def describe() -> str:
        stats = ingester.stats
        new_commits, last[0] = stats.commits - last[0], stats.commits
        return (
            f"{command}: {stats.messages:,} messages in, {stats.rows:,} rows stored, "
            f"{stats.deadletters:,} dead letters, {stats.commits:,} commits "
            f"({new_commits:,} since the last line)"
        )

    return describe


def _export_lake_periodically(
    store: Store,
    lake_dir: Path | str,
    ingester_id: str,
    stop: threading.Event,
    objects: ObjectStore | None,
) -> None:
    while not stop.wait(60.0):
        try:
            export_hours(
                store, lake_dir, ingester_id, now_ts_ms=int(time.time() * 1000), objects=objects
            )
        except LlmsloError as exc:  # keep ingesting; the next round retries the hour
            log.error("lake export failed: %s", exc)


def run_config_validate(args: argparse.Namespace) -> int:
    load_config(args.file)  # raises ConfigError listing every problem by field path
    print(f"{args.file}: valid")
    return 0
