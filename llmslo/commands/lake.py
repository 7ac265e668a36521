"""``llmslo lake export`` (the Parquet lake) and ``llmslo lake maintain`` (the Iceberg lake)."""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path
from typing import Any

from llmslo.options import add_common_options, add_subcommand, print_json, resolve_config
from llmslo.progress import add_quiet_option, progress
from pipeline.errors import ConfigError
from pipeline.lake import export_hours, is_s3, lake_object_store, pending_hours
from pipeline.store import Store

__all__ = ["register", "run_lake_export", "run_lake_maintain"]


def register(subparsers: Any) -> None:
    """Add ``lake export`` and ``lake maintain``."""
    lake = add_subcommand(
        subparsers,
        "lake",
        "Export hours to the Parquet lake; maintain the Iceberg lake.",
        "llmslo lake export --db var/llmslo.duckdb --lake /srv/llmslo-lake --ingester ingest-0\n"
        "AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… llmslo lake export --lake s3://bucket/lake\n"
        "llmslo lake maintain -c config/lake.example.yaml   # a one-host Iceberg lake under var/",
    )
    lake_sub = lake.add_subparsers(dest="lake_command", required=True)
    export = lake_sub.add_parser(
        "export", help="write hours not exported yet as Hive-partitioned Parquet"
    )
    add_common_options(export, bus=False, db=True)
    export.add_argument(
        "--lake",
        type=_lake_location,
        help="lake directory or s3://BUCKET/PREFIX (overrides store.lake_dir; an s3:// "
        "lake's endpoint and credentials: store.s3, else the AWS_* environment)",
    )
    export.add_argument(
        "--ingester", default=socket.gethostname(), help="file name of this ingester's parts"
    )
    add_quiet_option(export)
    export.set_defaults(handler=run_lake_export)

    maintain = lake_sub.add_parser(
        "maintain",
        help="one maintenance pass over the Iceberg lake (store.lake: iceberg): drop hours "
        "past store.raw_retention_days, compact closed hours into one file each, expire "
        "snapshots older than store.iceberg.snapshot_keep_s, delete the files only they "
        "referenced, and orphan files older than store.iceberg.orphan_grace_s; safe while "
        "ingesters commit",
    )
    add_common_options(maintain, bus=False)
    maintain.add_argument(
        "--table", action="append", help="only this table (repeatable; default: every one)"
    )
    maintain.set_defaults(handler=run_lake_maintain)


def _lake_location(value: str) -> Path | str:
    """``--lake``: an ``s3://`` URI as given, anything else a local path."""
    return value if is_s3(value) else Path(value)


def run_lake_export(args: argparse.Namespace) -> int:
    config = resolve_config(args)
    lake_dir = args.lake or config.store.lake_dir
    if lake_dir is None:
        raise ConfigError("no lake directory: pass --lake or set store.lake_dir")
    objects = lake_object_store(lake_dir, config.store.s3)
    now_ms = int(time.time() * 1000)
    with Store(config.store.path, must_exist=True) as store:
        total = len(pending_hours(store, now_ts_ms=now_ms))
        with progress("lake export", total, "files", quiet=args.quiet) as advance:
            written = export_hours(
                store, lake_dir, args.ingester, now_ts_ms=now_ms, objects=objects, advance=advance
            )
    print_json(
        {
            "exported": [
                {
                    "table": w.table,
                    "hour_start_ms": w.hour_start_ms,
                    "rows": w.rows,
                    "path": str(w.path),
                }
                for w in written
            ]
        }
    )
    return 0


def run_lake_maintain(args: argparse.Namespace) -> int:
    from pipeline.iceberg.lake import open_iceberg_lake
    from pipeline.iceberg.maintenance import LakeMaintainer, maintenance_policy

    config = resolve_config(args)
    policy = maintenance_policy(config.store)  # raises unless store.lake is iceberg
    lake = open_iceberg_lake(config.store, config.ingest.group_id, config.bus.topic_prefix)
    assert lake is not None  # maintenance_policy checked store.iceberg
    tables = sorted(set(lake.topics.values()))
    unknown = sorted(set(args.table or ()) - set(tables))
    if unknown:
        raise ConfigError(f"no lake table {', '.join(unknown)} (the lake's: {', '.join(tables)})")
    maintainer = LakeMaintainer(lake, policy)
    started = time.perf_counter()
    now_ms = int(time.time() * 1000)
    reports = [maintainer.maintain(name, now_ms) for name in (args.table or tables)]
    print_json(
        {
            "maintained": [report.as_dict() for report in reports],
            "seconds": round(time.perf_counter() - started, 3),
        }
    )
    return 0 if not any(report.skipped for report in reports) else 1
