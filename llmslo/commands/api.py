"""``llmslo api``: the HTTP API on a DuckDB file that no other process writes, and
:class:`ApiServer`, the uvicorn server on a thread that ``llmslo run`` uses too.

DuckDB lets one process open a file that is being written, so ``llmslo api --db FILE``
is for a file nobody writes (a copy, an exported store, an ingester that is stopped);
while ``llmslo run`` writes, it serves the same API itself. ``llmslo api`` opens the file
read-write (it is the only process, so verdicts and overrides are stored); with
``--read-only`` verdicts are computed but not stored (the answer says ``"stored": false``)
and overrides are refused.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import duckdb

from alerts.config import AlertmanagerConfig
from alerts.push import alert_ttl_s
from api import create_app
from llmslo.api_server import ApiServer, api_config
from llmslo.options import add_common_options, add_subcommand, install_stop_handlers, resolve_config
from llmslo.run import add_spec_option, load_model
from pipeline.errors import ConfigError, StoreError
from pipeline.store import Store
from slo.jobs import JobsConfig

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``api``."""
    parser = add_subcommand(
        subparsers,
        "api",
        "Serve the HTTP API (reads, flags, verdicts) on a DuckDB file nobody else writes.",
        "llmslo api --db var/llmslo.duckdb                  # read-write: verdicts are stored\n"
        "llmslo api --db var/demo.duckdb --read-only --port 8191\n"
        "LLMSLO_API_TOKEN=... llmslo api -c config/llmslo.example.yaml\n"
        "while `llmslo run` writes a file, it serves this API itself (section api:)",
    )
    add_common_options(parser, bus=False, db=True)
    add_spec_option(parser)
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="open the file read-only: verdicts computed, not stored; overrides refused",
    )
    parser.add_argument("--host", help="listen address (default: api.host, 127.0.0.1)")
    parser.add_argument(
        "--port",
        "--api-port",
        dest="api_port",
        type=int,
        help="listen port (default: api.port, 8190; 0: any)",
    )
    parser.set_defaults(handler=run_api)


def run_api(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    settings = api_config(args, config)
    jobs = config.section("slo", JobsConfig)
    model = load_model(args.spec or jobs.spec)
    path = config.store.path
    if args.read_only:
        if not Path(path).exists():
            raise ConfigError(f"--read-only: DuckDB file {path} does not exist")
        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {path} read-only (is it being written?): {exc}") from exc
    else:
        con = Store(path).con
    try:
        app = create_app(
            con.cursor,
            settings,
            model=model,
            read_only=args.read_only,
            gpu_pods=jobs.detectors.gpu_pods,  # GPUs joined to engines as the detectors do
            alert_ttl_s=alert_ttl_s(config.section("alertmanager", AlertmanagerConfig).resend_s),
        )
        server = ApiServer(app, settings).start()
        mode = "read-only" if args.read_only else "read-write"
        print(
            f"serving the API ({mode}) on {server.url} (OpenAPI at {server.url}/docs)", flush=True
        )
        install_stop_handlers(server.stop)
        server.wait()
    finally:
        con.close()
    return 0
