"""One-shot look at an endpoint: what llmslo sees there (``llmslo scrape URL``)."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from typing import Any

import aiohttp

from collectors.canonical import TargetCanonicalizer
from collectors.collector import fetch_exposition
from collectors.config import normalise_url
from collectors.exposition import Exposition, ExpositionParser
from collectors.semantics import REASONS

__all__ = ["inspect_exposition", "inspect_url", "render_report"]


def _number(value: float) -> float | str:
    """JSON-safe number: NaN and ±Inf as the strings Prometheus prints."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def _family_of(row: dict[str, Any]) -> str:
    """A histogram's base name for its bucket/sum/count rows, else the metric."""
    metric: str = row["metric"]
    suffix = {"bucket": "_bucket", "sum": "_sum", "count": "_count"}.get(row.get("kind") or "")
    return metric.removesuffix(suffix) if suffix else metric


def inspect_exposition(
    text: str, *, instance: str = "-", dialect: str = "auto", ts_ms: int = 0
) -> dict[str, Any]:
    """Summarise one exposition: dialect, signals with values and bounds, unknown metrics."""
    exposition: Exposition = ExpositionParser().parse(text)
    canonicalizer = TargetCanonicalizer(instance, dialect=dialect)
    batch = canonicalizer.canonicalize(exposition, ts_ms)
    rows = batch.table.to_pylist()
    detection = canonicalizer.detection
    signals: dict[str, dict[str, Any]] = {}
    unknown: set[str] = set()
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["signal"] is None:
            if row.get("kind") != "created":
                unknown.add(row["metric"])
            continue
        grouped[row["signal"]].append(row)
    unknown -= {r["metric"] for members in grouped.values() for r in members}  # partly mapped
    for signal, members in sorted(grouped.items()):
        entry: dict[str, Any] = {"metrics": sorted({_family_of(r) for r in members})}
        kinds = {r.get("kind", "gauge") for r in members}
        if "bucket" in kinds:
            bounds = sorted({r["le"] for r in members if r.get("le") is not None})
            entry["bounds"] = [_number(b) for b in bounds]
            counts = [r["value"] for r in members if r.get("kind") == "count"]
            entry["count"] = sum(counts)
        else:
            entry["values"] = [_number(r["value"]) for r in members[:16]]
            entry["series"] = len(members)
        signals[signal] = entry
    return {
        "instance": instance,
        "dialect": detection.dialect if detection else None,
        "version_family": detection.version_family if detection else None,
        "topic": batch.schema.topic,
        "samples": len(exposition),
        # lines that did not parse, and series rejected for impossible values
        "bad_lines": exposition.bad_lines + sum(batch.dropped.get(r, 0) for r in REASONS),
        "errors": (exposition.errors + batch.errors)[:5],
        "signals": signals,
        "unknown_metrics": sorted(unknown),
        "dropped": batch.dropped,
    }


async def _fetch(url: str, timeout_s: float) -> str:
    async with aiohttp.ClientSession() as session:
        fetched = await fetch_exposition(
            session, url, timeout_s=timeout_s, max_body_bytes=256 * 1024 * 1024
        )
        return fetched.text


def inspect_url(
    url: str, *, dialect: str = "auto", timeout_s: float = 5.0, ts_ms: int = 0
) -> dict[str, Any]:
    """Fetch ``url`` (``host:port`` allowed) and :func:`inspect_exposition` it.

    Raises :class:`pipeline.errors.DecodeError` when the endpoint cannot be read.
    """
    full = normalise_url(url)
    text = asyncio.run(_fetch(full, timeout_s))
    report = inspect_exposition(text, instance=full.split("/")[2], dialect=dialect, ts_ms=ts_ms)
    report["url"] = full
    return report


def render_report(report: dict[str, Any]) -> str:
    """Human-readable form of an :func:`inspect_exposition` report."""
    lines = [
        f"{report.get('url', report['instance'])}",
        f"  dialect: {report['dialect'] or 'unknown'}"
        f"  ({report['version_family'] or 'no map matched'})",
        f"  samples: {report['samples']}  bad lines: {report['bad_lines']}"
        f"  topic: {report['topic']}",
        "  signals:",
    ]
    for signal, entry in report["signals"].items():
        metrics = ", ".join(entry["metrics"])
        if "bounds" in entry:
            bounds = ", ".join(str(b) for b in entry["bounds"])
            lines.append(f"    {signal:<20} {metrics}  count={entry['count']:g}  le=[{bounds}]")
        else:
            shown = ", ".join(
                f"{v:g}" if isinstance(v, float) else str(v) for v in entry["values"][:8]
            )
            more = " …" if entry["series"] > 8 else ""
            lines.append(f"    {signal:<20} {metrics}  [{shown}{more}]")
    if report["unknown_metrics"]:
        lines.append(f"  unknown metrics (kept raw): {len(report['unknown_metrics'])}")
        lines += [f"    {name}" for name in report["unknown_metrics"]]
    for error in report["errors"]:
        lines.append(f"  bad line: {error}")
    return "\n".join(lines) + "\n"
