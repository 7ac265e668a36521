"""What every subcommand shares: help with examples, common options, config, output, signals.

The shared flags have one spelling in every command, declared here: ``-c/--config`` (the
llmslo config), ``--db`` (the DuckDB file), ``--spec`` (the SLO spec; default ``slo.spec``
from the config, else :data:`EXAMPLE_SPEC`), ``--host``/``--port`` (where a command serves)
and ``--bootstrap-servers``. Older spellings (``--api-port``, ``--listen``, a positional
spec) still parse, hidden from ``--help``, and warn once on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import textwrap
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

from llmslo.sections import load_config
from pipeline.config import LlmsloConfig
from pipeline.errors import ConfigError
from slo.jobs import JobsConfig
from slo.spec.loader import load_spec
from slo.spec.model import SloModel, build_model

__all__ = [
    "EXAMPLE_SPEC",
    "SPEC_HELP",
    "add_common_options",
    "add_config_option",
    "add_deprecated_alias",
    "add_listen_options",
    "add_spec_option",
    "add_subcommand",
    "install_stop_handlers",
    "load_model",
    "print_json",
    "resolve_config",
    "resolve_spec",
]

log = logging.getLogger("llmslo")

#: The SLO spec used when none is given or configured (the seeds' targets), shipped inside
#: ``slo`` (``config/slo.example.yaml`` in a checkout links to it).
EXAMPLE_SPEC = Path(str(resources.files("slo").joinpath("slo.example.yaml")))
#: What every ``--spec`` says in ``--help``.
SPEC_HELP = "SLO spec (default: slo.spec from --config, else the example config/slo.example.yaml)"


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
    add_config_option(parser)
    if bus:
        parser.add_argument(
            "--bootstrap-servers",
            metavar="HOST:PORT|embedded",
            help="Kafka bootstrap servers, or 'embedded' to start the bundled broker (overrides the config)",
        )
    if db:
        parser.add_argument("--db", type=Path, help="DuckDB file (overrides store.path)")


def add_config_option(
    parser: argparse.ArgumentParser, help_: str = "llmslo YAML config (default: built-in defaults)"
) -> None:
    """``-c/--config FILE``."""
    parser.add_argument("-c", "--config", type=Path, help=help_)


class _Deprecated(argparse.Action):
    """An old spelling of a flag: stores like the new one and says once which to use."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.use = kwargs.pop("use")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        sys.stderr.write(f"{parser.prog}: {option_string} is deprecated; use {self.use}\n")
        setattr(namespace, self.dest, values)


def add_deprecated_alias(
    parser: argparse.ArgumentParser, old: str, *, dest: str, use: str, **kwargs: Any
) -> None:
    """Accept ``old`` as a hidden spelling of the flag stored in ``dest`` (named ``use``)."""
    parser.add_argument(
        old, dest=dest, action=_Deprecated, use=use, help=argparse.SUPPRESS, default=None, **kwargs
    )


def add_spec_option(parser: argparse.ArgumentParser, *, positional: bool = False) -> None:
    """``--spec FILE`` (default :func:`resolve_spec`); ``positional`` also accepts the old
    positional spelling, hidden."""
    parser.add_argument("--spec", type=Path, help=SPEC_HELP)
    if positional:
        parser.add_argument(
            "spec_positional", nargs="?", type=Path, metavar="SPEC", help=argparse.SUPPRESS
        )


def add_listen_options(parser: argparse.ArgumentParser, what: str, *, port_default: str) -> None:
    """``--host`` and ``--port`` for a command that serves ``what``."""
    parser.add_argument("--host", help=f"address {what} listens on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, help=f"port {what} listens on (default {port_default}; 0: any free)"
    )


def resolve_spec(args: argparse.Namespace, config: LlmsloConfig | None = None) -> Path:
    """The SLO spec a command uses: ``--spec``, else ``slo.spec`` of the config, else the
    example spec."""
    given = getattr(args, "spec", None) or getattr(args, "spec_positional", None)
    if given is not None:
        return Path(given)
    configured = (config or resolve_config(args)).section("slo", JobsConfig).spec
    return Path(configured) if configured is not None else EXAMPLE_SPEC


def load_model(spec: Path | None) -> SloModel:
    """The validated SLO model of ``spec`` (default: the example spec); logs its warnings."""
    path = spec or EXAMPLE_SPEC
    if not path.exists():
        raise ConfigError(f"SLO spec {path} not found: pass --spec FILE or set slo.spec")
    model = build_model(load_spec(path))
    for warning in model.warnings:
        log.warning("%s", warning)
    return model


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
