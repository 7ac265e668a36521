"""Writers of the jobs' outputs: flag transitions and heartbeats (Kafka or DuckDB), findings,
current status.

:class:`BusTransitionSink` publishes FLAG_TRANSITIONS rows and each cycle's
:class:`JobsHeartbeat` (JOBS_HEARTBEATS rows) to the Kafka ``flags`` topic (through the one
bounded publisher of ``pipeline.publisher``; the ingester stores them) in the wire format's
JSON form: every tap that follows the flags reads them, and a tap must not load pyarrow for
a heartbeat (``collectors/tap/flagsource.py``);
:class:`StoreTransitionSink` writes them straight into ``flag_transitions`` and
``jobs_heartbeats`` when no bus is used; :class:`ListTransitionSink` keeps them in memory
(tests); :class:`TeeTransitionSink` writes to several. The jobs' own tables
``slo_findings`` and ``slo_status_current`` are written here too (declared in
:mod:`slo.tables`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from pipeline.publisher import JsonRows, Publisher
from pipeline.schema import FLAG_TRANSITIONS, JOBS_HEARTBEATS
from pipeline.store import insert_arrow
from slo._status_rows import status_table
from slo.evaluate import SloStatus
from slo.flags import FlagState, FlagTransition, transition_rows, transitions_table
from slo.signals.detectors import Finding
from slo.tables import OUTPUT_TABLES

__all__ = [
    "OUTPUT_TABLES",
    "OVERRIDE_REASONS",
    "BusTransitionSink",
    "JobsHeartbeat",
    "ListTransitionSink",
    "StoreTransitionSink",
    "TeeTransitionSink",
    "TransitionSink",
    "create_output_tables",
    "load_flag_states",
    "write_findings",
    "write_status",
]

log = logging.getLogger(__name__)


def create_output_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create ``slo_findings`` and ``slo_status_current`` if missing (idempotent)."""
    for table in OUTPUT_TABLES.values():
        table.create(con)


@dataclass(frozen=True)
class JobsHeartbeat:
    """One jobs cycle that computed the flags: ``ts_ms`` is wall-clock time (staleness is
    measured from it), ``event_ts_ms`` the data time the cycle judged."""

    ts_ms: int
    event_ts_ms: int
    jobs_id: str
    interval_s: float
    errors: int = 0

    def row(self) -> dict[str, Any]:
        """The heartbeat as one JOBS_HEARTBEATS row (a plain dict, what is published)."""
        return {
            "ts_ms": int(self.ts_ms),
            "event_ts_ms": int(self.event_ts_ms),
            "jobs_id": self.jobs_id,
            "interval_s": float(self.interval_s),
            "errors": int(self.errors),
        }

    def table(self) -> pa.Table:
        """The heartbeat as one JOBS_HEARTBEATS row (storage schema)."""
        return pa.Table.from_pylist([self.row()], schema=JOBS_HEARTBEATS.storage_arrow)


class TransitionSink(Protocol):
    """Where flag transitions and the jobs' heartbeats go."""

    def write(self, transitions: list[FlagTransition]) -> None: ...

    def beat(self, heartbeat: JobsHeartbeat) -> None:
        """Record one cycle's heartbeat; never blocks the cycle on a slow destination."""
        ...


class ListTransitionSink:
    """Keeps transitions and heartbeats in memory."""

    def __init__(self) -> None:
        self.transitions: list[FlagTransition] = []
        self.heartbeats: list[JobsHeartbeat] = []

    def write(self, transitions: list[FlagTransition]) -> None:
        self.transitions.extend(transitions)

    def beat(self, heartbeat: JobsHeartbeat) -> None:
        self.heartbeats.append(heartbeat)


class StoreTransitionSink:
    """Inserts FLAG_TRANSITIONS and JOBS_HEARTBEATS rows into the store's tables."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def write(self, transitions: list[FlagTransition]) -> None:
        if transitions:
            insert_arrow(self.con, FLAG_TRANSITIONS.table, transitions_table(transitions))

    def beat(self, heartbeat: JobsHeartbeat) -> None:
        insert_arrow(self.con, JOBS_HEARTBEATS.table, heartbeat.table())


class BusTransitionSink:
    """Publishes transitions to the Kafka ``flags`` topic (keyed by scope id) through the
    bounded, retrying :class:`~pipeline.publisher.Publisher`, and waits up to
    ``flush_timeout_s`` for the acks. Transitions not acknowledged by then stay buffered and
    are re-sent (logged, never raised into the jobs' cycle)."""

    def __init__(self, publisher: Publisher, flush_timeout_s: float = 30.0) -> None:
        self.publisher = publisher
        self.flush_timeout_s = flush_timeout_s

    def write(self, transitions: list[FlagTransition]) -> None:
        if transitions:
            self.publisher.put(FLAG_TRANSITIONS, JsonRows(transition_rows(transitions)))
            if not self.publisher.flush(self.flush_timeout_s):
                log.warning(
                    "%d flag transitions not acknowledged by Kafka within %.0f s; still retrying",
                    len(transitions),
                    self.flush_timeout_s,
                )

    def beat(self, heartbeat: JobsHeartbeat) -> None:
        """Queue the heartbeat (keyed by ``jobs_id``); the publisher sends it in the
        background, so a broker outage does not hold the cycle (the beat then arrives late or
        is dropped when the buffer is full, and readers see the flags age, as they should)."""
        self.publisher.put(JOBS_HEARTBEATS, JsonRows([heartbeat.row()]))

    def close(self) -> None:
        """Publish what is still buffered (bounded wait), then stop the publisher."""
        self.publisher.close()


class TeeTransitionSink:
    """Writes transitions and heartbeats to every one of ``sinks``, in order: the jobs over
    the Iceberg lake publish them and keep them in their own file to resume from."""

    def __init__(self, *sinks: TransitionSink) -> None:
        self.sinks = sinks

    def write(self, transitions: list[FlagTransition]) -> None:
        for sink in self.sinks:
            sink.write(transitions)

    def beat(self, heartbeat: JobsHeartbeat) -> None:
        for sink in self.sinks:
            sink.beat(heartbeat)


#: Reasons of the transitions a manual override publishes (``api``) when set and when it ends.
OVERRIDE_REASONS = ("manual_override", "manual_override_ended")


def load_flag_states(
    con: duckdb.DuckDBPyConnection, before_ms: int | None = None
) -> dict[tuple[str, str], FlagState]:
    """The last level the jobs stored for every scope, so a restart resumes instead of
    re-announcing (an operator's override is not the jobs' state: it is skipped).
    ``before_ms``: as of then (a replay starting there), from transitions before it."""
    bound = "" if before_ms is None else f" AND ts_ms < {int(before_ms)}"
    rows = con.execute(
        "SELECT scope, scope_id, arg_max(to_level, ts_ms), max(ts_ms) "
        f"FROM {FLAG_TRANSITIONS.table} WHERE (reason IS NULL OR reason NOT IN (?, ?)){bound} "
        "GROUP BY ALL",
        list(OVERRIDE_REASONS),
    ).fetchall()
    return {
        (scope, scope_id): FlagState(int(level), int(ts)) for scope, scope_id, level, ts in rows
    }


def write_findings(
    con: duckdb.DuckDBPyConnection, ts_ms: int, state: str, findings: Iterable[Finding]
) -> None:
    """Append findings that started (``firing``) or ended (``resolved``) at ``ts_ms``."""
    rows = [
        [
            ts_ms,
            state,
            f.signal,
            f.scope,
            f.scope_id,
            f.pool,
            f.severity,
            f.basis,
            json.dumps(f.evidence, sort_keys=True, default=str),
        ]
        for f in findings
    ]
    if rows:
        con.executemany("INSERT INTO slo_findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def write_status(con: duckdb.DuckDBPyConnection, statuses: Iterable[SloStatus]) -> None:
    """Replace ``slo_status_current`` with this cycle's statuses (one Arrow insert of rows
    rendered per SLO, :mod:`slo._status_rows`: row-wise JSON and executemany cost ~0.1 ms a
    row, 0.5 s at 4,096 instances)."""
    table = status_table(list(statuses))
    con.execute("BEGIN")
    try:
        con.execute("DELETE FROM slo_status_current")
        if table.num_rows:
            insert_arrow(con, "slo_status_current", table)
        con.execute("COMMIT")
    except duckdb.Error:
        con.execute("ROLLBACK")
        raise
