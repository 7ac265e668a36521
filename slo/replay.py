"""Replay: the SLO jobs' cycles over stored history, step by step in event time.

A live ``llmslo jobs`` only ever judges the newest instant, so a generated history, a store
restored from a backup or a spec written today has no findings, flags or SLO statuses for
the past. :func:`replay` runs the same cycle (:meth:`slo.jobs.SloJobs.judge`: evaluate,
detect, step flags, write) at every step of ``[start, end]``, with the step's time as the
only "now", so the tables end up as live cycles at those instants would have left them.

What differs from a live cycle, and why:

* The rollups are rebuilt once for the whole range first (``slo_minute``/``slo_hour`` and the
  request rollups), instead of a little each cycle: the history is complete, and the
  minutes do not depend on when they are counted. A step's SLO windows therefore hold the
  whole minute of the step, where a live cycle in the middle of that minute saw part of it.
* No heartbeat (``jobs_heartbeats`` says a jobs *process* is alive, with wall-clock time),
  no Kafka publishing (the taps must not act on the past), no alert push to Alertmanager,
  no pruning.
* Idempotent: the jobs' rows of ``slo_findings`` and ``flag_transitions`` inside the range
  are deleted first (an operator's overrides stay), and the first step resumes from the
  levels and open findings stored before the range, as a restarted jobs process would.

:func:`copy_store` makes the scratch file of "what would this spec have done"
(``llmslo jobs --replay --into FILE``): the source is attached read-only and copied, the
replay then writes only the copy.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import duckdb

from pipeline.errors import ConfigError
from pipeline.schema import FLAG_TRANSITIONS
from pipeline.units import HOUR_MS, MINUTE_MS
from slo.jobs import CycleResult, JobsConfig, SloJobs
from slo.queries.reads import open_findings
from slo.signals.detectors import Finding
from slo.sinks import OVERRIDE_REASONS, StoreTransitionSink, load_flag_states
from slo.spec.model import SloModel
from slo.windows import parse_duration_ms

__all__ = ["ReplaySummary", "copy_store", "data_extent", "parse_instant", "replay", "replay_steps"]

_RELATIVE = re.compile(r"^-\s*(\d+[smhdw])$")


def data_extent(con: duckdb.DuckDBPyConnection) -> tuple[int, int] | None:
    """(oldest, newest) event time of the raw rows (engine samples and request records)."""
    row = con.execute(
        "SELECT least((SELECT min(ts_ms) FROM engine_samples), "
        "(SELECT min(received_ts_ms) FROM requests)), "
        "greatest((SELECT max(ts_ms) FROM engine_samples), "
        "(SELECT max(received_ts_ms) FROM requests))"
    ).fetchone()
    if row is None or row[0] is None or row[1] is None:
        return None
    return int(row[0]), int(row[1])


def parse_instant(text: str, newest_ms: int) -> int:
    """An instant of the history: ISO-8601 with a zone (``2026-12-01T06:00Z``), Unix epoch
    milliseconds, or relative to the newest data (``-24h``, ``-90m``: event time, so a
    finished history replays the same whatever the wall clock says)."""
    text = text.strip()
    relative = _RELATIVE.match(text)
    if relative:
        return newest_ms - parse_duration_ms(relative[1])
    if text.isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{text!r} is not a time: give ISO-8601 UTC (2026-12-01T06:00:00Z), "
            "epoch ms, or a time before the newest data (-24h)"
        ) from None
    if parsed.tzinfo is None:
        raise ConfigError(f"{text!r} has no time zone: add Z for UTC")
    return int(parsed.timestamp() * 1000)


@dataclass
class ReplaySummary:
    """What one replay did (the last line ``llmslo jobs --replay`` prints)."""

    start_ms: int
    end_ms: int
    step_ms: int
    steps: int = 0
    findings_firing: int = 0
    transitions: int = 0
    alerting_steps: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "replay": {"from_ts_ms": self.start_ms, "to_ts_ms": self.end_ms},
            "step_ms": self.step_ms,
            "steps": self.steps,
            "findings_started": self.findings_firing,
            "flag_transitions": self.transitions,
            "steps_with_alerting_slo": self.alerting_steps,
            "errors": self.errors[:20],
            "seconds": round(self.seconds, 3),
        }


def replay_steps(
    con: duckdb.DuckDBPyConnection,
    *,
    start_ms: int | None = None,
    end_ms: int | None = None,
    step_ms: int = MINUTE_MS,
) -> range:
    """The instants (epoch ms) :func:`replay` would evaluate with the same arguments (for a
    progress bar's total). Raises :class:`ConfigError` as :func:`replay` does."""
    return _plan(con, start_ms, end_ms, step_ms)[1]


def _plan(
    con: duckdb.DuckDBPyConnection, start_ms: int | None, end_ms: int | None, step_ms: int
) -> tuple[tuple[int, int], range]:
    """The data's extent and the replay's steps in ``[start, end]`` (defaults: the extent),
    on the step's grid (10:01:00, not 10:00:37)."""
    extent = data_extent(con)
    if extent is None:
        raise ConfigError("the store holds no engine samples or request records to replay")
    start = extent[0] if start_ms is None else start_ms
    end = extent[1] if end_ms is None else end_ms
    if step_ms <= 0:
        raise ConfigError("--step must be positive")
    if end < start:
        raise ConfigError(f"nothing to replay: the range ends ({end}) before it starts ({start})")
    first = -(-start // step_ms) * step_ms
    return extent, range(first, end + 1, step_ms)


def _clear(con: duckdb.DuckDBPyConnection, start_ms: int, end_ms: int) -> None:
    """Delete the jobs' findings and transitions of ``[start, end]`` (overrides stay)."""
    con.execute("DELETE FROM slo_findings WHERE ts_ms >= ? AND ts_ms <= ?", [start_ms, end_ms])
    con.execute(
        f"DELETE FROM {FLAG_TRANSITIONS.table} WHERE ts_ms >= ? AND ts_ms <= ? "
        "AND (reason IS NULL OR reason NOT IN (?, ?))",
        [start_ms, end_ms, *OVERRIDE_REASONS],
    )


def _open_before(
    con: duckdb.DuckDBPyConnection, start_ms: int
) -> dict[tuple[str, str, str], Finding]:
    """The findings stored as firing just before the range (a replay resumes them)."""
    active: dict[tuple[str, str, str], Finding] = {}
    for row in open_findings(con, at_ms=max(0, start_ms - 1)).to_pylist():
        finding = Finding(
            int(row["ts_ms"]),
            row["signal"],
            row["scope"],
            row["scope_id"],
            row["pool"] or "",
            row["severity"] or "",
            row["basis"] or "",
            json.loads(row["evidence_json"] or "{}"),
        )
        active[finding.key] = finding
    return active


def _rollups(jobs: SloJobs, start_ms: int, end_ms: int, oldest_ms: int) -> None:
    """Rebuild the rollups a replay reads: every SLO's minutes from its longest window before
    ``start`` (not before the oldest raw row, so rollups of pruned raw data stay) to ``end``."""
    stop = end_ms // MINUTE_MS * MINUTE_MS + MINUTE_MS
    for slo in jobs.model.slos:
        reach = start_ms - max(slo.catalog.windows_ms)
        first = max(reach, oldest_ms) // HOUR_MS * HOUR_MS
        first = max(first, oldest_ms // MINUTE_MS * MINUTE_MS)
        jobs.rollup.recompute(slo, first, stop)
    jobs.request_rollup.update(end_ms)


def replay(
    con: duckdb.DuckDBPyConnection,
    model: SloModel,
    config: JobsConfig | None = None,
    *,
    start_ms: int | None = None,
    end_ms: int | None = None,
    step_ms: int = MINUTE_MS,
    on_step: Callable[[CycleResult], object] | None = None,
) -> ReplaySummary:
    """Run the jobs' cycle at every multiple of ``step`` in ``[start, end]`` over ``con``
    (read-write): steps fall on the step's grid (whole minutes for ``1m``).

    ``start``/``end`` default to the data's extent. ``on_step(result)`` sees every step
    (progress, tests). Raises :class:`ConfigError` on an empty store or an empty range.
    """
    extent, steps = _plan(con, start_ms, end_ms, step_ms)
    start = extent[0] if start_ms is None else start_ms
    end = extent[1] if end_ms is None else end_ms
    began = time.perf_counter()
    jobs = SloJobs(con, model, config, sink=StoreTransitionSink(con))
    summary = ReplaySummary(start, end, step_ms)
    _rollups(jobs, start, end, extent[0])
    _clear(con, start, end)
    jobs.board.states = load_flag_states(con, before_ms=start)
    jobs.active = _open_before(con, start)
    for now in steps:
        result = CycleResult(now)
        jobs.judge(result, status=now + step_ms > end)
        summary.steps += 1
        summary.transitions += len(result.transitions)
        summary.alerting_steps += any(p.alerting for s in result.statuses for p in s.pairs())
        summary.errors.extend(f"{now}: {e}" for e in result.errors)
        if on_step is not None:
            on_step(result)
    row = con.execute(
        "SELECT count(*) FROM slo_findings WHERE state = 'firing' AND ts_ms BETWEEN ? AND ?",
        [start, end],
    ).fetchone()
    summary.findings_firing = int(row[0]) if row else 0
    summary.seconds = time.perf_counter() - began
    return summary


def copy_store(source: Path, scratch: Path) -> None:
    """Copy ``source`` (attached read-only: never written, not even its WAL) into a new
    ``scratch`` file, replacing an older scratch file."""
    if not source.exists():
        raise ConfigError(f"{source}: no such DuckDB file to replay")
    if scratch.resolve() == source.resolve():
        raise ConfigError("--into must name another file than --db (the source is read-only)")
    for stale in (scratch, scratch.with_suffix(scratch.suffix + ".wal")):
        stale.unlink(missing_ok=True)
    con = duckdb.connect(str(scratch))
    try:
        con.execute("ATTACH ? AS replay_source (READ_ONLY)", [str(source)])
        catalog = con.execute("SELECT current_database()").fetchone()
        con.execute(f'COPY FROM DATABASE replay_source TO "{catalog[0] if catalog else "memory"}"')
        con.execute("DETACH replay_source")
    finally:
        con.close()
