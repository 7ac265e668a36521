"""The ``llmslo`` command line: thin subcommands that parse, call the packages and print.

How a command group joins: a module under ``llmslo/commands/`` (or ``llmslo/run.py``,
``llmslo/demo.py``) defines ``register(subparsers) -> None``, which adds its subcommands with
:func:`llmslo.options.add_subcommand` and sets ``handler=`` (``handler(args) -> int``) on each,
and each of its commands is listed in :data:`COMMAND_MODULES` (imported only when that
command runs, so a sidecar's process holds only what it uses). Nothing registers itself on
import; config
sections are the explicit table of :mod:`llmslo.sections`. ``main(argv) -> int`` so tests
call it directly; the console script ``llmslo`` and ``python -m llmslo`` call
:func:`console_main`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType, ModuleType
from typing import Any

from pipeline.errors import LlmsloError

__all__ = ["COMMAND_MODULES", "SIDECAR_COMMANDS", "build_parser", "console_main", "main"]

#: Each command → the module whose ``register(subparsers)`` adds it, in help order. The
#: module is imported only when its command runs (or for ``--help`` of the whole CLI): a tap
#: sidecar must not pay for the store, the API and the SLO maths it never uses.
COMMAND_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "demo": "llmslo.demo",
        "run": "llmslo.run",
        "broker": "llmslo.commands.spine",
        "ingest": "llmslo.commands.spine",
        "lake": "llmslo.commands.lake",
        "config": "llmslo.commands.spine",
        "tables": "llmslo.commands.spine",
        "tap": "llmslo.commands.tap",
        "collect": "llmslo.commands.collect",
        "scrape": "llmslo.commands.collect",
        "receive": "llmslo.commands.receive",
        "probe": "llmslo.commands.probe",
        "sim": "llmslo.commands.sim",
        "load": "llmslo.commands.sim",
        "slo": "llmslo.commands.slo",
        "jobs": "llmslo.commands.slo",
        "rules": "llmslo.commands.rules",
        "alerts": "llmslo.commands.alerts",
        "api": "llmslo.commands.api",
        "dashboard": "llmslo.commands.dashboard",
        "dashboards": "llmslo.commands.dashboards",
        "drill": "llmslo.commands.drill",
        "check": "llmslo.commands.check",
    }
)

#: Commands that run as one process beside every engine pod or node. Their code never uses
#: pandas, but pyarrow's pandas shim imports it, when it is installed, on the first Arrow
#: array built from Python values (~45 MiB of RSS in the collector); run as a process
#: (:func:`console_main`), these commands refuse it, so pyarrow sees no pandas.
SIDECAR_COMMANDS = frozenset({"tap", "collect"})
#: What a sidecar's process refuses to import (see :data:`SIDECAR_COMMANDS`).
SIDECAR_REFUSES = frozenset({"pandas"})

Register = Callable[[Any], None]


class _Refuse(importlib.abc.MetaPathFinder):
    """Makes ``import NAME`` (and its submodules) raise ``ModuleNotFoundError``."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(
                f"{fullname} is not used by an llmslo sidecar (llmslo/cli.py)", name=fullname
            )


EPILOG = textwrap.dedent(
    """\
    examples:
      llmslo demo                                  # whole pipeline on embedded defaults
      llmslo broker --port 9092                    # embedded Kafka-protocol broker, prints its address
      llmslo ingest --bootstrap-servers 127.0.0.1:9092 --db var/llmslo.duckdb
      llmslo config validate config/llmslo.example.yaml
      llmslo tables                                # the documented DuckDB tables

    every command has --help with its own examples.
    """
)


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word not an option), if it is a known one."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMAND_MODULES else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv`` naming a command, only that command's module is imported
    (and registered), else every command is (``llmslo --help``, an unknown command)."""
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
    command = None if argv is None else _command_of(argv)
    wanted = [COMMAND_MODULES[command]] if command else COMMAND_MODULES.values()
    for path in dict.fromkeys(wanted):
        register: Register = importlib.import_module(path).register
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
    """Entry point of the ``llmslo`` console script (and ``python -m llmslo``)."""
    if _command_of(sys.argv[1:]) in SIDECAR_COMMANDS:
        # The whole process is the sidecar: nothing else in it may want pandas.
        sys.meta_path.insert(0, _Refuse(SIDECAR_REFUSES - set(sys.modules)))
    sys.exit(main())
