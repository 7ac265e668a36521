"""A drill report as Markdown, and as rows of the ``drills`` table (``slo.tables.DRILLS``)."""

from __future__ import annotations

import json
from dataclasses import asdict

import duckdb
import pyarrow as pa

from app.drill import DrillReport
from slo.queries import DRILLS_SCHEMA
from slo.tables import DRILLS

__all__ = ["drills_table", "render_markdown", "write_drills"]


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def render_markdown(report: DrillReport) -> str:
    """The report: profile, one row per mode, false positives per fleet."""
    p = report.profile
    lines = [
        "# llmslo drill",
        "",
        f"Profile (time compression, stated): scrape every {p.scrape_s:g} s, jobs every "
        f"{p.interval_s:g} s, stall_for_s {p.stall_for_s:g}, flag dwell {p.dwell_s:g} s, "
        f"fragmentation/queue windows {p.detector_window_s:g} s, entry/gateway windows "
        f"{p.edge_window_s:g} s with a probe every {p.probe_interval_s:g} s, detector lookback "
        f"{p.lookback_s:g} s; warm-up {p.warmup_s:g} s + "
        f"random 0–{p.jitter_s:g} s (seed {p.seed}), fault held {p.hold_s:g} s, then "
        f"{p.clear_s:g} s to clear; load {p.rate_per_pod:g} req/s per pod; "
        f"{p.healthy_pods} healthy pods per shared fleet. Alerts: no Alertmanager push in this "
        "drill (column always —). Flag levels: seconds from injection to the flag / to the first scraped KV usage past that level's line.",
        "",
        f"Front-end windows: P/D transfer failures {p.detector_window_s / 2:g} s, KV-index hit "
        f"ratio {p.detector_window_s:g} s, autoscaler behind ≥ {p.detector_window_s / 2:g} s "
        "(defaults 120, 120, 180 s); front-end modes run in fleets of their own "
        "(`app/drill_fronts.py`).",
        "",
        "| mode | fleet | detected | by | detect s | first finding s | first flag s | first alert s | clear s | other signals |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in report.results:
        levels = ", ".join(
            f"L{k} {v:.1f}" + (f" / KV {r.kv_crossing_s[k]:.1f}" if k in r.kv_crossing_s else "")
            for k, v in sorted(r.flag_level_s.items())
        )
        lines.append(
            f"| {r.mode} | {r.fleet} | {'yes' if r.detected else '**missed**'} | "
            f"{', '.join(r.detected_by) or '—'} | {_s(r.detect_s)} | {_s(r.first_finding_s)} | "
            f"{_s(r.first_flag_s)}{' (' + levels + ')' if levels else ''} | {_s(r.first_alert_s)} | "
            f"{_s(r.clear_s) if r.detected else '—'} | {', '.join(r.other_signals) or '—'} |"
        )
    detected = sum(r.detected for r in report.results)
    lines += [
        "",
        f"Detected {detected} of {len(report.results)} modes.",
        "",
        "## False positives",
        "",
    ]
    for fleet in report.fleets:
        lines.append(
            f"- {fleet.name} ({fleet.minutes:g} min, healthy instances: "
            f"{', '.join(fleet.healthy_instances) or 'none'}): {len(fleet.false_positives)}"
        )
        for fp in fleet.false_positives:
            lines.append(f"  - {fp.kind} {fp.name} on {fp.scope_id} at {fp.ts_ms}")
    return "\n".join(lines) + "\n"


def drills_table(report: DrillReport) -> pa.Table:
    """One ``drills`` row per mode, plus one ``healthy`` row per fault-free fleet."""
    profile = json.dumps(asdict(report.profile), sort_keys=True)
    fps = {f.name: len(f.false_positives) for f in report.fleets}
    rows = [
        {
            "run_ts_ms": report.started_ts_ms,
            "mode": r.mode,
            "fleet": r.fleet,
            "instance": r.instance,
            "fault": r.fault,
            "injected_ts_ms": r.injected_ts_ms,
            "removed_ts_ms": r.removed_ts_ms,
            "detected": r.detected,
            "detected_by": ",".join(r.detected_by),
            "detect_s": r.detect_s,
            "first_finding_s": r.first_finding_s,
            "first_flag_s": r.first_flag_s,
            "first_alert_s": r.first_alert_s,
            "clear_s": r.clear_s,
            "other_signals": ",".join(r.other_signals),
            "false_positives": fps.get(r.fleet, 0),
            "profile_json": profile,
        }
        for r in report.results
    ]
    for fleet in report.fleets:
        if not fleet.modes:
            empty = dict.fromkeys(DRILLS_SCHEMA.names)
            rows.append(
                empty
                | {
                    "run_ts_ms": report.started_ts_ms,
                    "mode": "healthy",
                    "fleet": fleet.name,
                    "false_positives": len(fleet.false_positives),
                    "profile_json": profile,
                }
            )
    return pa.Table.from_pylist(rows, schema=DRILLS_SCHEMA)


def write_drills(con: duckdb.DuckDBPyConnection, report: DrillReport) -> int:
    """Append the report to the ``drills`` table (created if missing); returns rows written."""
    DRILLS.create(con)
    table = drills_table(report)
    con.register("drill_rows", table)
    try:
        con.execute(f"INSERT INTO drills SELECT {', '.join(DRILLS_SCHEMA.names)} FROM drill_rows")
    finally:
        con.unregister("drill_rows")
    return table.num_rows
