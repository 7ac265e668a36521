"""A drill report as Markdown, and as rows of the ``drills`` table (``slo.tables.DRILLS``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

import duckdb
import pyarrow as pa

from llmslo.drill.matrix import DrillReport
from llmslo.drill.modes import FAST_HOLD_S, MODES
from llmslo.drill.score import FalsePositive
from pipeline.store import insert_arrow
from slo.queries import DRILLS_SCHEMA
from slo.tables import DRILLS

__all__ = ["drills_table", "render_markdown", "write_drills"]


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _alert_cell(report: DrillReport, value: float | None) -> str:
    return "not run" if report.alertmanager is None else _s(value)


def _lag(lag: dict[str, dict[str, float]]) -> str:
    """p99 / max wake-up lateness of the pods' and the taps' event loops (ms)."""
    parts = [f"{name} p99 {v['p99_ms']:g} / max {v['max_ms']:g} ms" for name, v in lag.items() if v]
    return ", ".join(parts) or "not measured"


def _tally(fps: list[FalsePositive]) -> str:
    counts = Counter(f"{p.kind} {p.name}" for p in fps)
    return f" ({', '.join(f'{k} ×{n}' for k, n in sorted(counts.items()))})" if counts else ""


def _load_line(report: DrillReport) -> str:
    p = report.profile
    healthy = (
        f"the healthy control at {p.healthy_load:g} of the rate a pod serves without degrading"
        if p.healthy_load is not None
        else "the healthy control the same"
    )
    return (
        f"Load: Poisson, {p.rate_per_pod:g} req/s per pod in the mode fleets, {healthy} "
        f"(per fleet below). Pods run a {p.prefill_chunk_tokens}-token prefill chunk (engine "
        "default 512: the step budget an operator sets for the 30 ms ITL-jitter target). "
        f"Saturated capacity: {report.capacity_method or 'not measured'}."
        + (f" Without degrading: {report.sustainable_method}." if report.sustainable_method else "")
    )


def _hogs(report: DrillReport) -> str:
    p = report.profile
    if not p.hogs:
        return "none"
    weight = (
        "SCHED_IDLE: a BestEffort neighbour"
        if p.hog_class == "besteffort"
        else "the fleets' own CPU weight"
    )
    return f"{p.hogs}, {p.hog_class} ({weight})"


def _timing_line(report: DrillReport) -> str:
    """How the fleets were run: jobs (and pods) at a time, the drill's and the mode fleets'
    wall time, and the sum of the fleets' (their estimate alone divided by jobs)."""
    walls = [f.wall_s for f in report.fleets if f.wall_s is not None]
    pods = "" if report.max_pods is None else f" within {report.max_pods} pods"
    return (
        f"Run: {len(report.fleets) + len(report.failed)} fleets, {report.jobs} at a time{pods} "
        f"(a worker process each, longest first that fits); drill wall time "
        f"{_s(report.wall_s)} s, the mode fleets done at {_s(report.modes_wall_s)} s; "
        f"fleet wall times sum to {sum(walls):.0f} s "
        f"({', '.join(f'{f.name} {_s(f.wall_s)} (setup {_s(f.setup_s)})' for f in report.fleets) or 'none'}). "
        f"CPU hogs beside the fleets: {_hogs(report)} (busy processes for the whole drill, "
        "`llmslo/drill/hogs.py`)."
    )


def render_markdown(report: DrillReport) -> str:
    """The report: profile, load, alerting, one row per mode, false positives per fleet."""
    p = report.profile
    alerting = (
        f"Alerts: a real Alertmanager per fleet ({report.alertmanager}) on loopback, fed by "
        "the pipeline's alert pusher; first alert s = Alertmanager's updatedAt (its receipt, "
        "read from /api/v2/alerts) of the first alert of a detecting signal on the instance "
        "(the degradation alert where a flag detects); in brackets every alert received "
        "about it. False positives include alerts on healthy instances and, in the control "
        "fleet, on the pool."
        if report.alertmanager is not None
        else "Alerts: not run (prometheus-alertmanager is not installed)."
    )
    lines = [
        "# llmslo drill",
        "",
        *(
            [
                "**Interrupted (Ctrl-C)**: partial report of the fleets that finished; the "
                "others are listed under failed fleets.",
                "",
            ]
            if report.interrupted
            else []
        ),
        f"Profile (time compression, stated): scrape every {p.scrape_s:g} s, jobs every "
        f"{p.interval_s:g} s, stall_for_s {p.stall_for_s:g}, flag dwell {p.dwell_s:g} s, "
        f"fragmentation/queue windows {p.detector_window_s:g} s (300/120), ghost window "
        f"{p.detector_window_s / 2:g} s (60), entry/gateway windows "
        f"{p.edge_window_s:g} s with a probe every {p.probe_interval_s:g} s, detector lookback "
        f"{p.lookback_s:g} s, crash reported for {p.restart_hold_s:g} s; warm-up "
        f"{p.warmup_s:g} s + random 0–{p.jitter_s:g} s (seed {p.seed}), fault held "
        f"{p.hold_s:g} s ({FAST_HOLD_S:g} s for the modes detected within seconds: "
        f"{', '.join(n for n, m in MODES.items() if m.hold_s is not None)}), then "
        f"{p.clear_s:g} s to clear; {p.healthy_pods} healthy pods per "
        "shared fleet. Flag levels: seconds from injection to the flag / to the first "
        "scraped KV usage past that level's line.",
        "",
        _load_line(report),
        "",
        alerting,
        "",
        f"Front-end windows: P/D transfer failures {p.detector_window_s / 2:g} s, KV-index hit "
        f"ratio {p.detector_window_s:g} s, autoscaler behind ≥ {p.detector_window_s / 2:g} s "
        "(defaults 120, 120, 180 s); front-end modes run in fleets of their own "
        "(`llmslo/drill/fronts.py`).",
        "",
        _timing_line(report),
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
            f"{_s(r.first_flag_s)}{' (' + levels + ')' if levels else ''} | "
            f"{_alert_cell(report, r.first_alert_s)}"
            f"{' (' + ', '.join(r.alerted_by) + ')' if r.alerted_by else ''} | "
            f"{_s(r.clear_s) if r.detected else '—'} | {', '.join(r.other_signals) or '—'} |"
        )
    detected = sum(r.detected for r in report.results)
    lines += ["", f"Detected {detected} of {len(report.results)} modes.", ""]
    if report.failed:
        lines += ["## Failed fleets (their modes were not drilled)", ""]
        lines += [
            f"- {f.name} ({', '.join(f.modes) or 'control'}): {f.error}" for f in report.failed
        ]
        lines.append("")
    lines += ["## False positives", ""]
    for fleet in report.fleets:
        share = "" if fleet.load_share is None else f" = {fleet.load_share:.2f} of saturated"
        if fleet.sustainable_share is not None:
            share += f", {fleet.sustainable_share:.2f} of sustainable"
        lines.append(
            f"- {fleet.name} ({fleet.minutes:g} min at {fleet.rate_per_pod:g} req/s per pod"
            f"{share}; healthy instances: {', '.join(fleet.healthy_instances) or 'none'}; "
            f"{_s(fleet.wall_s)} s wall; "
            f"alerts received: {', '.join(fleet.alerts) or 'none'}; harness loop lateness "
            f"{_lag(fleet.harness_lag_ms)}): {len(fleet.false_positives)}"
            + _tally(fleet.false_positives)
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
    insert_arrow(con, DRILLS.name, table)
    return table.num_rows
