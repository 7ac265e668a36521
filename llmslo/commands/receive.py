"""``llmslo receive``: Prometheus remote-write and OTLP/HTTP metrics in, Kafka out."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from collectors.receive.config import ReceiveConfig
from collectors.receive.service import ReceiveService, raise_young_gc_threshold
from llmslo.commands.collect import outage_producer
from llmslo.options import (
    add_common_options,
    add_subcommand,
    install_stop_handlers,
    pipeline_bus,
    print_json,
    resolve_config,
)
from pipeline.bus import BusProducer

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``receive``."""
    receive = add_subcommand(
        subparsers,
        "receive",
        "Accept Prometheus remote-write (/api/v1/write) and OTLP/HTTP metrics (/v1/metrics)"
        " and publish the mapped samples to Kafka.",
        "llmslo receive -c config/llmslo.example.yaml\n"
        "llmslo receive --port 9201 --bearer-token-file /etc/llmslo/token \\\n"
        "    --bootstrap-servers 127.0.0.1:9092",
    )
    add_common_options(receive)
    receive.add_argument("--host", help="listen address (overrides receive.host)")
    receive.add_argument("--port", type=int, help="listen port (overrides receive.port)")
    receive.add_argument("--bearer-token-file", help="file holding the token writers must send")
    receive.set_defaults(handler=run_receive)


def receive_config(args: argparse.Namespace) -> ReceiveConfig:
    """The ``receive`` section with command-line overrides applied."""
    config = resolve_config(args).section("receive", ReceiveConfig)
    updates = {
        key: value
        for key, value in (
            ("host", args.host),
            ("port", args.port),
            ("bearer_token_file", args.bearer_token_file),
        )
        if value is not None
    }
    return ReceiveConfig.model_validate(config.model_dump() | updates) if updates else config


def run_receive(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    receive = receive_config(args)
    timeout_ms = int(receive.publish_timeout_s * 1000)
    stop = threading.Event()
    install_stop_handlers(stop.set)
    with pipeline_bus(config, args) as bus:
        bus.ensure_topics()

        def make_producer() -> BusProducer:
            return outage_producer(bus, timeout_ms)

        service = ReceiveService(receive, make_producer)
        raise_young_gc_threshold()
        service.run(stop)
    print_json(
        {
            "receive": "stopped",
            "published_rows": service.published_rows,
            "unpublished_rows": service.buffer.rows,
            "targets": sorted(service.receiver.targets.values()),
        }
    )
    return 0
