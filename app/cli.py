"""The ``llmslo`` command line: thin subcommands that parse, call the packages and print.

Each package that owns subcommands exposes ``register(subparsers)`` in its ``cli`` module
and is listed in :data:`COMMAND_MODULES`; this runner is the only place that wires the
packages together. ``main(argv) -> int`` so tests call it directly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from pipeline.config import LlmsloConfig, load_config
from pipeline.errors import LlmsloError

__all__ = [
    "COMMAND_MODULES",
    "add_common_options",
    "add_subcommand",
    "build_parser",
    "console_main",
    "main",
    "print_json",
    "resolve_config",
]

log = logging.getLogger("llmslo")

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
COMMAND_MODULES: list[str] = [
    "pipeline.demo",
    "pipeline.runner",
    "pipeline.commands",
    "collectors.tap.cli",
    "collectors.cli",
    "simulator.cli",
    "slo.cli",
]

EPILOG = textwrap.dedent(
    """\
    examples:
      llmslo demo                                  # whole pipeline on embedded defaults
      llmslo broker                                # embedded Kafka-protocol broker, prints its address
      llmslo ingest --bootstrap-servers 127.0.0.1:9092 --db var/llmslo.duckdb
      llmslo config validate config/llmslo.example.yaml
      llmslo tables                                # the documented DuckDB tables

    every command has --help with its own examples.
    """
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="llmslo",
        description="SLO and observability pipeline for LLM inference fleets.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.Formatter.converter = time.gmtime
    try:
        return int(args.handler(args) or 0)
    except LlmsloError as exc:
        sys.stderr.write(f"llmslo {args.command}: {exc}\n")
        return 2


def console_main() -> None:
    """Entry point of the ``llmslo`` console script."""
    sys.exit(main())
