"""What every subcommand shares: help with examples, common options, config, output, signals."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import textwrap
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from llmslo.sections import load_config
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError

__all__ = [
    "add_common_options",
    "add_subcommand",
    "install_stop_handlers",
    "print_json",
    "resolve_config",
    "serve_metrics",
]

log = logging.getLogger("llmslo")


def add_subcommand(
    subparsers: Any, name: str, help_: str, examples: str
) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` shows ``help_`` and, after the options, ``examples``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help_,
        description=help_,
        epilog="examples:\n" + textwrap.indent(examples, "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def add_common_options(
    parser: argparse.ArgumentParser, *, bus: bool = True, db: bool = False
) -> None:
    """``--config``, and where relevant ``--bootstrap-servers`` and ``--db``, for a subcommand."""
    parser.add_argument(
        "-c", "--config", type=Path, help="llmslo YAML config (default: embedded defaults)"
    )
    if bus:
        parser.add_argument(
            "--bootstrap-servers",
            metavar="HOST:PORT|embedded",
            help="Kafka bootstrap servers, or 'embedded' to start the bundled broker (overrides the config)",
        )
    if db:
        parser.add_argument("--db", type=Path, help="DuckDB file (overrides store.path)")


def resolve_config(args: argparse.Namespace) -> LlmsloConfig:
    """The config file named by ``--config`` with command-line overrides applied."""
    config = load_config(getattr(args, "config", None))
    updates: dict[str, object] = {}
    if getattr(args, "bootstrap_servers", None):
        updates["bus"] = config.bus.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
    if getattr(args, "db", None):
        updates["store"] = config.store.model_copy(update={"path": args.db})
    return config.model_copy(update=updates) if updates else config


def install_stop_handlers(stop: object) -> None:
    """Call ``stop()`` on SIGTERM and SIGINT (finish the work in hand, then exit 0)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d, stopping after the current batch", signum)
        stop()  # type: ignore[operator]

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def print_json(payload: object) -> None:
    """Machine output: one JSON object on one line."""
    sys.stdout.write(json.dumps(payload, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def serve_metrics(port: int, host: str, registry: CollectorRegistry) -> int:
    """Serve ``registry`` as Prometheus ``/metrics`` on ``host:port`` (a daemon thread) and
    return the port bound (``0`` picks a free one). :class:`ConfigError` naming the port when
    it cannot be bound (in use, or not ours to take), what every ``--metrics-port`` says."""
    try:
        server, _ = start_http_server(port, host, registry=registry)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"--metrics-port {port}: cannot serve /metrics on {host}:{port} ({reason}); "
            "another process (another llmslo command?) may hold it: give a free port, "
            "or 0 for any"
        ) from exc
    return int(server.server_port)
