"""``llmslo dashboard``: serve the Streamlit dashboards on loopback and print their URL."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from dashboards import APP_SCRIPT, SOURCE_ENV, DuckDBSource
from dashboards.sources import GPU_PODS_ENV
from llmslo.options import (
    add_common_options,
    add_listen_options,
    add_subcommand,
    install_stop_handlers,
    resolve_config,
)
from pipeline.errors import ConfigError, LlmsloError
from slo.jobs import JobsConfig

__all__ = ["dashboard_command", "dashboard_env", "register", "run_dashboard"]

_HEALTH_TIMEOUT_S = 60.0


def register(subparsers: Any) -> None:
    """Add ``dashboard``."""
    parser = add_subcommand(
        subparsers,
        "dashboard",
        "Serve the SRE dashboards (Streamlit) on 127.0.0.1 and print their URL.",
        "llmslo dashboard --db var/demo.duckdb            # a file nobody writes\n"
        "llmslo dashboard --api http://127.0.0.1:8190     # a running `llmslo run`\n"
        "llmslo dashboard --db var/history.duckdb --port 0  # any free port",
    )
    add_common_options(parser, bus=False, db=True)
    parser.add_argument(
        "--api", metavar="URL", help="read API of a running `llmslo run` (instead of --db)"
    )
    add_listen_options(parser, "the dashboard", port_default="8501")
    parser.set_defaults(handler=run_dashboard)


def dashboard_env(args: argparse.Namespace) -> dict[str, str]:
    """The pages' source, ``api:URL`` or ``db:PATH`` (a DuckDB file is opened read-only once
    to fail early); for a file also the SLO config's ``detectors.gpu_pods``, so GPUs join
    engines as the API's server does for an ``api:`` source."""
    if args.api and args.db:
        raise ConfigError("give --api or --db, not both")
    if args.api:
        if not str(args.api).startswith(("http://", "https://")):
            raise ConfigError(f"--api {args.api!r}: expected an http:// or https:// URL")
        return {SOURCE_ENV: f"api:{str(args.api).rstrip('/')}"}
    config = resolve_config(args)
    path = Path(config.store.path)
    DuckDBSource(path).close()  # SourceError now, rather than on every page
    gpu_pods = config.section("slo", JobsConfig).detectors.gpu_pods
    return {SOURCE_ENV: f"db:{path.resolve()}", GPU_PODS_ENV: json.dumps(gpu_pods)}


def _port(requested: int | None, host: str) -> int:
    if requested is None:
        return 8501
    if requested == 0:
        with socket.socket() as probe:
            probe.bind((host, 0))
            return int(probe.getsockname()[1])
    if not 1 <= requested <= 65535:
        raise ConfigError(f"--port {requested}: must be in 1..65535 (or 0 for any free port)")
    return requested


def dashboard_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """The ``streamlit run`` command line serving :data:`APP_SCRIPT` on ``host:port``."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT),
        "--server.address", host, "--server.port", str(port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false", "--server.fileWatcherType", "none",
        "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def _wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LlmsloError(f"streamlit exited with status {process.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{url}_stcore/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise LlmsloError(f"{url} did not answer within {_HEALTH_TIMEOUT_S:.0f} s")


def run_dashboard(args: argparse.Namespace) -> int:
    """Start Streamlit, wait until it serves, print the URL, run until SIGTERM/SIGINT."""
    source_env = dashboard_env(args)
    spec = source_env[SOURCE_ENV]
    host = args.host or "127.0.0.1"
    port = _port(args.port, host)
    url = f"http://{host}:{port}/"
    root = str(APP_SCRIPT.parent.parent)  # so the script imports this very package
    env = {**os.environ, **source_env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(dashboard_command(port, host), env=env, stdout=subprocess.DEVNULL)
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        process.terminate()

    install_stop_handlers(stop)
    try:
        _wait_healthy(url, process)
        print(f"dashboard: {url}  (source {spec})", flush=True)
        status = process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
    return 0 if stopping else status
