"""The ``llmslo`` command line: thin subcommands that parse, call the packages and print.

How a command group joins: a module under ``llmslo/commands/`` (or ``llmslo/run.py``,
``llmslo/demo.py``) defines ``register(subparsers) -> None``, which adds its subcommands with
:func:`llmslo.options.add_subcommand` and sets ``handler=`` (``handler(args) -> int``) on each,
and is listed in :data:`COMMAND_MODULES`. Nothing registers itself on import; config
sections are the explicit table of :mod:`llmslo.sections`. ``main(argv) -> int`` so tests
call it directly; the console script ``llmslo`` and ``python -m llmslo`` call
:func:`console_main`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from llmslo import demo, run
from llmslo.commands import (
    alerts,
    api,
    check,
    collect,
    dashboard,
    dashboards,
    drill,
    probe,
    receive,
    rules,
    sim,
    slo,
    spine,
    tap,
)
from pipeline.errors import LlmsloError

__all__ = ["COMMAND_MODULES", "build_parser", "console_main", "main"]

#: Modules whose ``register(subparsers)`` adds subcommands, in help order.
COMMAND_MODULES: tuple[ModuleType, ...] = (
    demo,
    run,
    spine,
    tap,
    collect,
    receive,
    probe,
    sim,
    slo,
    rules,
    alerts,
    api,
    dashboard,
    dashboards,
    drill,
    check,
)

Register = Callable[[Any], None]

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
    for module in COMMAND_MODULES:
        register: Register = module.register
        register(subparsers)
    return parser


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
