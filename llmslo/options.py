"""What every subcommand shares: help with examples, common options, config, output, signals.

The shared flags have one spelling in every command, declared here: ``-c/--config`` (the
llmslo config), ``--db`` (the DuckDB file), ``--spec`` (the SLO spec; default ``slo.spec``
from the config, else :data:`EXAMPLE_SPEC`), ``--host``/``--port`` (where a command serves)
and ``--bootstrap-servers``. Older spellings (``--api-port``, ``--listen``, a positional
spec) still parse, hidden from ``--help``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from llmslo.sections import load_config
from pipeline.address import address_file, read_address, remove_address, unreachable, write_address
from pipeline.config import BusConfig, LlmsloConfig
from pipeline.errors import BusError, ConfigError
from slo.jobs import JobsConfig
from slo.spec.loader import load_spec
from slo.spec.model import SloModel, build_model

__all__ = [
    "EXAMPLE_SPEC",
    "SPEC_HELP",
    "BusRole",
    "add_common_options",
    "add_config_option",
    "add_deprecated_alias",
    "add_listen_options",
    "add_spec_option",
    "add_subcommand",
    "announce_broker",
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
#: How a command meets the bus when ``--bootstrap-servers`` and ``bus.bootstrap_servers``
#: name none: ``join`` the running broker of the address file (else start a private one, and
#: say so), and refuse an address nobody answers at; ``ride`` the same, but a dead address is
#: an outage to buffer through (collect, tap), said once; ``serve`` (``run``) joins the
#: running broker or starts one and publishes it; ``explicit`` uses the bus only when an
#: address is given (``sim history``).
BusRole = Literal["join", "ride", "serve", "explicit"]
_said: set[str] = set()

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
    parser: argparse.ArgumentParser, *, bus: bool | BusRole = True, db: bool = False
) -> None:
    """``--config``, and where relevant ``--bootstrap-servers`` and ``--db``, for a subcommand
    (``bus=True`` is the ``join`` role of :data:`BusRole`)."""
    add_config_option(parser)
    if bus:
        parser.set_defaults(bus_role="join" if bus is True else bus)
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


def add_deprecated_alias(
    parser: argparse.ArgumentParser, old: str, *, dest: str, **kwargs: Any
) -> None:
    """Accept ``old`` as a hidden spelling of the flag stored in ``dest`` (``--help`` shows the
    new one only). Silent: scripts and manifests that parse a command's stderr keep working."""
    parser.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=None, **kwargs)


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
    bus = _bus_config(args, config.bus)
    if bus is not config.bus:
        updates["bus"] = bus
    if getattr(args, "db", None):
        updates["store"] = config.store.model_copy(update={"path": args.db})
    return config.model_copy(update=updates) if updates else config


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _bus_config(args: argparse.Namespace, bus: BusConfig) -> BusConfig:
    """``bus`` with ``--bootstrap-servers``, else the address file, applied; raises
    :class:`BusError` for an address nobody answers at (see :data:`BusRole`)."""
    given = getattr(args, "bootstrap_servers", None)
    role = getattr(args, "bus_role", None)
    explicit = bool(given) or "bootstrap_servers" in bus.model_fields_set
    if given:
        bus = bus.model_copy(update={"bootstrap_servers": given})
    uses_bus = getattr(args, "publish", True) and not getattr(args, "no_kafka", False)
    if role is None or not uses_bus or (role == "explicit" and not explicit):
        return bus
    path = address_file()
    if not explicit:
        address = read_address(path)
        if address is None:
            if role != "serve":
                _say_once(
                    f"llmslo: no --bootstrap-servers and no {path}: using a private embedded "
                    "broker that no other process reads. Start `llmslo run` or `llmslo broker` "
                    f"first (they write {path}), or pass --bootstrap-servers HOST:PORT."
                )
            return bus
        if not unreachable(address):
            _say_once(f"llmslo: joining the broker at {address} (from {path})")
            return bus.model_copy(update={"bootstrap_servers": address})
        if role == "serve":
            _say_once(f"llmslo: {path} names {address}, where nothing answers: starting a broker")
            return bus
        raise BusError(
            f"{path} names the broker {address}, but nothing answers there (the `llmslo run` "
            "or `llmslo broker` that wrote it is gone): start one again, delete the file, "
            "or pass --bootstrap-servers HOST:PORT (or embedded)"
        )
    if bus.bootstrap_servers == "embedded":
        return bus
    dead = unreachable(bus.bootstrap_servers)
    if dead:
        running = read_address(path)
        hint = (
            f"the broker of `llmslo run`/`llmslo broker` is at {running} (in {path})"
            if running and running != bus.bootstrap_servers and not unreachable(running)
            else f"`llmslo broker` and `llmslo run` print the address to use (and write it to "
            f"{path}, read when no --bootstrap-servers is given)"
        )
        message = (
            f"nothing answers at {', '.join(dead)} (the bootstrap servers given): {hint}; "
            "--bootstrap-servers embedded starts a private broker"
        )
        if role != "ride":
            raise BusError(message)
        _say_once(f"llmslo: {message}. Buffering until it answers.")
    return bus


@contextmanager
def announce_broker(address: str) -> Iterator[None]:
    """Print the broker's address once and keep it in the address file while it runs."""
    path = write_address(address)
    print(
        f"bootstrap servers: {address}  (in {path}: commands given no --bootstrap-servers "
        "join this broker)",
        flush=True,
    )
    try:
        yield
    finally:
        remove_address(address, path)


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
