"""What a drill reads back after a fleet's run: stored findings and flag transitions, the
scraped KV crossings of the flag lines, and the alerts Alertmanager received, as the rows
:mod:`llmslo.drill.score` scores."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from llmslo.drill.alerts import ReceivedAlert
from llmslo.drill.score import AlertRow, FindingRow, FlagRow, ModeResult
from slo.flags import FlagPolicy

__all__ = ["alert_rows", "kv_crossings", "read_rows"]


def read_rows(con: duckdb.DuckDBPyConnection) -> tuple[list[FindingRow], list[FlagRow]]:
    """Every ``slo_findings`` and ``flag_transitions`` row, oldest first, each with the
    wall time of the cycle that wrote it: the first heartbeat of its event time (a cycle
    beats after its writes; ``None`` where no heartbeat was stored)."""
    cursor = con.cursor()
    raised = (
        "LEFT JOIN (SELECT event_ts_ms, min(ts_ms) AS raised_ts_ms FROM jobs_heartbeats "
        "GROUP BY event_ts_ms) AS beat ON beat.event_ts_ms = row.ts_ms"
    )
    findings = [
        FindingRow(*row)
        for row in cursor.execute(
            "SELECT row.ts_ms, state, signal, scope, scope_id, raised_ts_ms "
            f"FROM slo_findings AS row {raised} ORDER BY row.ts_ms, signal, scope_id"
        ).fetchall()
    ]
    flags = [
        FlagRow(*row)
        for row in cursor.execute(
            "SELECT row.ts_ms, scope, scope_id, from_level, to_level, raised_ts_ms "
            f"FROM flag_transitions AS row {raised} ORDER BY row.ts_ms, scope_id"
        ).fetchall()
    ]
    return findings, flags


def kv_crossings(
    con: duckdb.DuckDBPyConnection, policy: FlagPolicy, result: ModeResult
) -> dict[int, float]:
    """Seconds from injection to the first scraped KV usage past each flag line (L1–L3), so
    the flag's own lag (flag time − crossing) can be judged against the scrape interval."""
    lines = {1: policy.l1_free, 2: policy.l2_free, 3: policy.l3_free}
    out = {}
    cursor = con.cursor()
    for level, free in lines.items():
        (first,) = cursor.execute(
            "SELECT min(ts_ms) FROM engine_samples WHERE instance = ? AND signal = 'kv_usage' "
            "AND value > ? AND ts_ms >= ?",
            [result.instance, 1 - free, result.injected_ts_ms],
        ).fetchone() or (None,)
        if first is not None:
            out[level] = round((int(first) - result.injected_ts_ms) / 1000, 1)
    return out


def alert_rows(received: Sequence[ReceivedAlert]) -> list[AlertRow]:
    """Alertmanager's alerts as scoring rows (instance and pool from their labels)."""
    return [
        AlertRow(
            a.received_ts_ms,
            a.name,
            a.labels.get("instance"),
            a.labels.get("pool"),
            "slo_id" in a.labels,
            a.labels.get("signal"),
        )
        for a in received
    ]
