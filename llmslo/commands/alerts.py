"""``llmslo alerts``: the alerts the pipeline pushes (path B) that are active now.

From the ``alerts`` table of a DuckDB file nobody writes (``--db``; while ``llmslo run``
holds the file, ask its Alertmanager or API instead), or from an Alertmanager's
``/api/v2/alerts`` (``--alertmanager URL``, every active alert it holds, from Prometheus
rules too).

A firing alert in the table is active only while the SLO jobs still confirm it: every jobs
cycle (its heartbeat in ``jobs_heartbeats``) re-evaluates every alert, and the pushed alert's
``endsAt`` lies :func:`~alerts.push.alert_ttl_s` (4 × ``alertmanager.resend_s``) after the
last send. An alert whose start and newest heartbeat are both older than that is listed as
``expired``, apart from the active ones: the pipeline stopped, and Alertmanager has let it go.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from alerts.config import AlertmanagerConfig
from alerts.push import alert_ttl_s
from llmslo.options import add_subcommand, print_json, resolve_config
from pipeline.errors import LlmsloError
from pipeline.store import Store
from slo.queries import alerts as recorded_alerts
from slo.queries import last_heartbeat

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
    parser.add_argument("-c", "--config", type=Path, help="llmslo YAML config (for store.path)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--db", type=Path, help="DuckDB file (default: store.path), read-only")
    source.add_argument("--alertmanager", metavar="URL", help="ask this Alertmanager instead")
    parser.add_argument("--severity", help="only this severity (page, ticket, info)")
    parser.add_argument("--json", action="store_true", help="one JSON object for machines")
    parser.set_defaults(handler=run_alerts)


def _from_db(args: argparse.Namespace, now_ms: int) -> list[dict[str, Any]]:
    config = resolve_config(args)
    ttl_ms = int(alert_ttl_s(config.section("alertmanager", AlertmanagerConfig).resend_s) * 1000)
    with Store(config.store.path, read_only=True) as store:
        firing = recorded_alerts(store.con, severity=args.severity)
        active = recorded_alerts(store.con, severity=args.severity, at_ms=now_ms, ttl_ms=ttl_ms)
        beat = last_heartbeat(store.con)
    confirmed = set(active.column("fingerprint").to_pylist())
    rows = []
    for row in firing.to_pylist():
        confirmed_ms = max(row["ts_ms"], beat[0] if beat else row["ts_ms"])
        rows.append(
            {
                "labels": json.loads(row["labels_json"] or "{}"),
                "annotations": json.loads(row["annotations_json"] or "{}"),
                "starts_ms": row["starts_ts_ms"],
                "state": "active" if row["fingerprint"] in confirmed else "expired",
                "confirmed_ms": confirmed_ms,
                "expires_ms": confirmed_ms + ttl_ms,
                "generator_url": row["generator_url"] or "",
            }
        )
    return rows


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


def _expired_note(expired: list[dict[str, Any]], now_ms: int) -> str:
    last = max(row["confirmed_ms"] for row in expired)
    ttl_s = (expired[0]["expires_ms"] - expired[0]["confirmed_ms"]) / 1000
    return (
        f"{len(expired)} expired (past state, not alerts to act on): no SLO jobs cycle has "
        f"confirmed them since {datetime.fromtimestamp(last / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC, "
        f"{(now_ms - last) / 60_000:.0f} min ago; an alert expires {ttl_s:g} s "
        "(4 x alertmanager.resend_s) after the last cycle that saw it firing\n"
    )


def run_alerts(args: argparse.Namespace) -> int:
    """Print the active alerts (a table, or ``{"alerts": [...]}`` with ``--json``); alerts of
    the table that no jobs cycle confirmed within their expiry are apart, as ``expired``."""
    now_ms = int(time.time() * 1000)
    if args.alertmanager:
        rows = _from_alertmanager(args.alertmanager, args.severity)
    else:
        rows = _from_db(args, now_ms)
    rows.sort(key=lambda r: (r["labels"].get("severity", ""), r["labels"].get("alertname", "")))
    active = [row for row in rows if row["state"] != "expired"]
    expired = [row for row in rows if row["state"] == "expired"]
    if args.json:
        print_json({"alerts": active, "count": len(active), "expired": expired})
        return 0
    if active:
        sys.stdout.write(_table(active))
    else:
        sys.stdout.write("no active alerts\n")
    if expired:
        sys.stdout.write("\n" + _expired_note(expired, now_ms) + _table(expired))
    return 0
