"""``llmslo alerts``: the alerts the pipeline pushes (path B) that are active now.

From the ``alerts`` table of a DuckDB file nobody writes (``--db``; while ``llmslo run``
holds the file, ask its Alertmanager or API instead), or from an Alertmanager's
``/api/v2/alerts`` (``--alertmanager URL``, every active alert it holds, from Prometheus
rules too).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from llmslo.options import add_config_option, add_subcommand, print_json, resolve_config
from pipeline.errors import LlmsloError
from pipeline.store import Store
from slo.queries import alerts as recorded_alerts

__all__ = ["register", "run_alerts"]

#: Labels shown in the table besides the alert name and severity (in this order).
_SHOWN = ("slo_id", "window", "level", "pool", "instance")


def register(subparsers: Any) -> None:
    """Add ``alerts``."""
    parser = add_subcommand(
        subparsers,
        "alerts",
        "List active alerts: the pipeline's own (alerts table) or an Alertmanager's.",
        "llmslo alerts --db var/llmslo.duckdb\n"
        "llmslo alerts --db var/llmslo.duckdb --severity page --json\n"
        "llmslo alerts --alertmanager http://127.0.0.1:9093",
    )
    add_config_option(parser, "llmslo YAML config (for store.path)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--db", type=Path, help="DuckDB file (default: store.path), read-only")
    source.add_argument("--alertmanager", metavar="URL", help="ask this Alertmanager instead")
    parser.add_argument("--severity", help="only this severity (page, ticket, info)")
    parser.add_argument("--json", action="store_true", help="one JSON object for machines")
    parser.set_defaults(handler=run_alerts)


def _from_db(args: argparse.Namespace) -> list[dict[str, Any]]:
    config = resolve_config(args)
    with Store(config.store.path, read_only=True) as store:
        table = recorded_alerts(store.con, severity=args.severity)
    return [
        {
            "labels": json.loads(row["labels_json"] or "{}"),
            "annotations": json.loads(row["annotations_json"] or "{}"),
            "starts_ms": row["starts_ts_ms"],
            "state": "active",
            "generator_url": row["generator_url"] or "",
        }
        for row in table.to_pylist()
    ]


def _from_alertmanager(url: str, severity: str | None) -> list[dict[str, Any]]:
    params = {"filter": f'severity="{severity}"'} if severity else None
    try:
        response = httpx.get(url.rstrip("/") + "/api/v2/alerts", params=params, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise LlmsloError(f"cannot list alerts from {url}: {exc}") from exc
    return [
        {
            "labels": alert["labels"],
            "annotations": alert.get("annotations", {}),
            "starts_ms": int(
                datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")).timestamp() * 1000
            ),
            "state": alert.get("status", {}).get("state", ""),
            "generator_url": alert.get("generatorURL", ""),
        }
        for alert in response.json()
    ]


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'severity':<8} {'since (UTC)':<19} {'state':<10} alert"]
    for row in rows:
        labels = row["labels"]
        since = datetime.fromtimestamp(row["starts_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        shown = " ".join(f"{k}={labels[k]}" for k in _SHOWN if labels.get(k))
        lines.append(
            f"{labels.get('severity', ''):<8} {since:<19} {row['state']:<10} "
            f"{labels.get('alertname', '')} {shown}".rstrip()
        )
        if row["annotations"].get("summary"):
            lines.append(f"{'':<40}{row['annotations']['summary']}")
    return "\n".join(lines) + "\n"


def run_alerts(args: argparse.Namespace) -> int:
    """Print the active alerts (a table, or ``{"alerts": [...]}`` with ``--json``)."""
    if args.alertmanager:
        rows = _from_alertmanager(args.alertmanager, args.severity)
    else:
        rows = _from_db(args)
    rows.sort(key=lambda r: (r["labels"].get("severity", ""), r["labels"].get("alertname", "")))
    if args.json:
        print_json({"alerts": rows, "count": len(rows)})
    elif rows:
        sys.stdout.write(_table(rows))
    else:
        sys.stdout.write("no active alerts\n")
    return 0
