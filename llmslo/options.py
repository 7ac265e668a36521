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
from pipeline.broker_address import address_file, read_address
from pipeline.bus import Bus
from pipeline.config import BusConfig, LlmsloConfig
from pipeline.errors import ConfigError

__all__ = [
    "add_common_options",
    "add_subcommand",
    "install_stop_handlers",
    "pipeline_bus",
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


def pipeline_bus(
    config: LlmsloConfig,
    args: argparse.Namespace,
    *,
    owner: bool = False,
    embedded_data_dir: Path | None = None,
    registry: CollectorRegistry | None = None,
) -> Bus:
    """The :class:`Bus` of a command, joined to its pipeline's broker when not told one.

    With ``--bootstrap-servers`` or ``bus.bootstrap_servers`` in the config, that address
    (an unreachable one fails, naming where it came from; never a private broker instead).
    Otherwise the broker named in the address file beside ``store.path``
    (:mod:`pipeline.broker_address`), said in one line on stderr; a file whose owner is
    gone is ignored, said too. With neither, an embedded broker of this process's own: an
    ``owner`` (``run``, ``ingest``) writes its address there for the others to join; any
    other command warns that nothing else reads what it publishes.
    """
    command = f"llmslo {getattr(args, 'command', '') or ''}".strip()
    where = address_file(config.store.path)

    def make(bus: BusConfig, **extra: Any) -> Bus:
        return Bus(bus, embedded_data_dir=embedded_data_dir, registry=registry, **extra)

    if getattr(args, "bootstrap_servers", None):
        source = "--bootstrap-servers"
    elif "bootstrap_servers" in config.bus.model_fields_set:
        source = f"bus.bootstrap_servers of {getattr(args, 'config', None) or 'the config'}"
    else:
        source = None
        found = read_address(where)
        if found is not None and found.alive:
            _say(
                f"{command}: Kafka: joining the broker of `{found.command}` (pid {found.pid}) at "
                f"{found.bootstrap_servers}, named in {where} (--bootstrap-servers to choose "
                "another)"
            )
            bus = config.bus.model_copy(update={"bootstrap_servers": found.bootstrap_servers})
            source = f"named in {where} by `{found.command}`, pid {found.pid}"
            return make(bus, source=source)
        if found is not None:
            _say(
                f"{command}: ignoring {where}: its broker's process (`{found.command}`, "
                f"pid {found.pid}) is gone"
            )
    if config.bus.bootstrap_servers != "embedded":
        return make(config.bus, source=source)
    if owner:
        return make(config.bus, address_file=where, command=command)
    if source is None:
        _say(
            f"{command}: Kafka: no broker to join (no live one named in {where}: start `llmslo run` or "
            "`llmslo broker` first, or give --bootstrap-servers); publishing to an embedded "
            "broker of this process's own, which nothing else reads"
        )
    return make(config.bus)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


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
