"""Scoring a drill from what the pipeline stored: detected or not, by what, how fast, cleared.

Pure functions over the rows of ``slo_findings`` and ``flag_transitions`` (no I/O), so the
rules are tested without a fleet. Times are Unix epoch ms in, seconds out. A finding's
``ts_ms`` is the jobs' evaluation (event) time, i.e. the newest scraped sample, so time to
detect includes scrape, publish, ingest and one job cycle.

**Whose doing a finding is** is decided by when it was raised, not by its event time: its
``raised_ts_ms`` is the wall time of the cycle that wrote it (that cycle's heartbeat), and a
cycle that ended before the injection cannot have seen the fault. The event time can
precede the injection while the finding is the fault's: a request is stamped when it was
received, so one already in flight when a NaN burst or a crash hit it is stored with a time
before the injection (a 9-pod fleet raised ``numeric_anomaly`` on its NaN pod at an event
time 0.6 s before the injection, in a cycle that ran 1.5 s after it, and the drill scored it
as a false positive and the mode as missed), and a scrape is stamped when it starts while
the exporter renders its body after. Such a finding detects at 0 s. A row with no heartbeat
to date it (the cycle's heartbeat failed) falls back to its event time, counted from
:data:`SCRAPE_STAMP_GRACE_MS` before the injection.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from llmslo.drill.modes import FLAG, DrillMode, matches

__all__ = [
    "SCRAPE_STAMP_GRACE_MS",
    "AlertRow",
    "FalsePositive",
    "FindingRow",
    "FlagRow",
    "ModeResult",
    "alert_false_positives",
    "false_positives",
    "score_alerts",
    "score_mode",
]


#: How far a scrape's stamp may precede what its body shows: the collector's and the
#: exporter's event-loop lateness (p99 0.1–0.2 s in the drills) plus the HTTP exchange. Only
#: for rows without a raising cycle's wall time.
SCRAPE_STAMP_GRACE_MS = 500


class FindingRow(NamedTuple):
    """One ``slo_findings`` row (the columns the drill reads)."""

    ts_ms: int
    state: str  # firing | resolved
    signal: str
    scope: str  # instance | pool
    scope_id: str
    raised_ts_ms: int | None = None  # wall time of the cycle that wrote it, where known


class FlagRow(NamedTuple):
    """One ``flag_transitions`` row (the columns the drill reads)."""

    ts_ms: int
    scope: str
    scope_id: str
    from_level: int
    to_level: int
    raised_ts_ms: int | None = None  # wall time of the cycle that wrote it, where known


class AlertRow(NamedTuple):
    """One firing alert as Alertmanager received it (``llmslo.drill.alerts.ReceivedAlert``)."""

    received_ts_ms: int
    name: str  # alertname
    instance: str | None  # its instance label (finding, flag and per-instance SLO alerts)
    pool: str | None
    slo: bool  # an SLO burn alert (has slo_id), not a signal or a flag
    signal: str | None = None  # a finding's signal, "degradation" for a flag, None for SLOs


@dataclass(frozen=True)
class FalsePositive:
    """A finding or flag rise where nothing was wrong: on a healthy pod, or before injection."""

    fleet: str
    kind: str  # finding | flag | alert
    name: str  # signal, "L<n>" for a flag, alertname for an alert
    scope_id: str
    ts_ms: int


@dataclass
class ModeResult:
    """What one mode's drill showed (seconds are from injection / removal)."""

    mode: str
    fleet: str
    instance: str
    fault: str | None
    injected_ts_ms: int
    removed_ts_ms: int
    detected: bool = False
    detected_by: list[str] = field(default_factory=list)
    detect_s: float | None = None
    first_finding_s: float | None = None
    first_flag_s: float | None = None
    first_alert_s: float | None = None  # Alertmanager's receipt of the first alert naming it
    alerted_by: list[str] = field(default_factory=list)  # alertnames received
    flag_level_s: dict[int, float] = field(default_factory=dict)
    kv_crossing_s: dict[int, float] = field(default_factory=dict)  # engine KV past L1/L2/L3 line
    clear_s: float | None = None
    other_signals: list[str] = field(default_factory=list)


def _in_scope(mode: DrillMode, instance: str, scope: str, scope_id: str) -> bool:
    return (scope == "instance" and scope_id == instance) or (mode.pool_scoped and scope == "pool")


def _seconds(ts_ms: int, since_ms: int) -> float:
    return round((ts_ms - since_ms) / 1000, 1)


def _since_injection(ts_ms: int, injected_ms: int) -> float:
    """Seconds from injection to a stored (data-clock) time; 0 for a row whose data was
    stamped before the injection (see the module's docstring)."""
    return max(0.0, _seconds(ts_ms, injected_ms))


def score_mode(
    result: ModeResult,
    mode: DrillMode,
    findings: Sequence[FindingRow],
    flags: Sequence[FlagRow],
    end_ms: int,
) -> ModeResult:
    """Fill ``result`` from the stored rows between injection and ``end_ms``."""
    start, removed = result.injected_ts_ms, result.removed_ts_ms
    mine = [
        f
        for f in sorted(findings)
        if _in_scope(mode, result.instance, f.scope, f.scope_id)
        and _after(f, start)
        and f.ts_ms <= end_ms
    ]
    hits = [f for f in mine if f.state == "firing" and matches(mode.expected, f.signal)]
    result.other_signals = sorted(
        {f.signal for f in mine if f.state == "firing" and not matches(mode.expected, f.signal)}
    )
    by = sorted({f.signal for f in hits})
    if hits:
        result.first_finding_s = _since_injection(hits[0].ts_ms, start)
    rises = [
        r
        for r in sorted(flags)
        if r.scope == "instance"
        and r.scope_id == result.instance
        and r.to_level > max(r.from_level, 0)
        and _after(r, start)
        and r.ts_ms <= end_ms
    ]
    for r in rises:  # entering L3 straight from L0 puts L1 and L2 in force at that moment too
        for level in range(max(r.from_level, 0) + 1, r.to_level + 1):
            result.flag_level_s.setdefault(level, _since_injection(r.ts_ms, start))
    if rises and FLAG in mode.expected:
        result.first_flag_s = _since_injection(rises[0].ts_ms, start)
        by += [f"flag L{level}" for level in sorted(result.flag_level_s)]
    elif rises:
        result.other_signals.append("flag")
    times = [t for t in (result.first_finding_s, result.first_flag_s) if t is not None]
    result.detected = bool(times)
    result.detected_by = by
    result.detect_s = min(times) if times else None
    if result.detected:
        result.clear_s = _clear_s(result, mode, mine, flags, removed)
    return result


def _clear_s(
    result: ModeResult,
    mode: DrillMode,
    mine: Sequence[FindingRow],
    flags: Sequence[FlagRow],
    removed_ms: int,
) -> float | None:
    """Seconds from removal until every matched finding resolved and the flag is back at
    L0; ``None`` when something was still raised at the end of the run."""
    last: dict[tuple[str, str], FindingRow] = {}
    for f in mine:
        if matches(mode.expected, f.signal):
            last[(f.signal, f.scope_id)] = f
    if any(f.state == "firing" for f in last.values()):
        return None
    ends = [f.ts_ms for f in last.values()]
    if FLAG in mode.expected:
        own = [r for r in sorted(flags) if r.scope == "instance" and r.scope_id == result.instance]
        if own and own[-1].to_level > 0:
            return None
        ends += [own[-1].ts_ms] if own else []
    return max(0.0, _seconds(max(ends), removed_ms)) if ends else None


def false_positives(
    fleet: str,
    findings: Iterable[FindingRow],
    flags: Iterable[FlagRow],
    faulted: dict[str, tuple[int, DrillMode]],
    *,
    pool_faulted_ms: int | None = None,
) -> list[FalsePositive]:
    """Findings and flag rises nothing in the drill explains.

    ``faulted`` maps a faulted instance to (injection ms, its mode): what it raises after
    injection is the fault's doing (scored by :func:`score_mode`); before, it was healthy.
    A pool finding counts unless a pool-scoped mode was running, or it came at or after
    ``pool_faulted_ms`` (a fleet whose every request goes through the faulted front end).
    """
    pool_faulted = any(mode.pool_scoped for _, mode in faulted.values())
    out = []
    for f in findings:
        if f.state != "firing":
            continue
        if f.scope == "pool":
            explained = pool_faulted or (pool_faulted_ms is not None and _after(f, pool_faulted_ms))
        else:
            explained = f.scope_id in faulted and _after(f, faulted[f.scope_id][0])
        if not explained:
            out.append(FalsePositive(fleet, "finding", f.signal, f.scope_id, f.ts_ms))
    for r in flags:
        if r.scope != "instance" or r.to_level <= max(r.from_level, 0):
            continue
        if not (r.scope_id in faulted and _after(r, faulted[r.scope_id][0])):
            out.append(FalsePositive(fleet, "flag", f"L{r.to_level}", r.scope_id, r.ts_ms))
    return sorted(out, key=lambda p: (p.ts_ms, p.scope_id, p.name))


def _after(row: FindingRow | FlagRow, injected_ms: int) -> bool:
    """Whether a stored finding or flag can show a fault injected at ``injected_ms``: the
    cycle that raised it ended after the injection (its event time may be earlier)."""
    if row.raised_ts_ms is not None:
        return row.raised_ts_ms >= injected_ms
    return row.ts_ms >= injected_ms - SCRAPE_STAMP_GRACE_MS


def score_alerts(
    result: ModeResult, mode: DrillMode, alerts: Sequence[AlertRow], end_ms: int
) -> ModeResult:
    """Fill ``first_alert_s`` and ``alerted_by`` from the alerts Alertmanager received
    between injection and ``end_ms`` that name the mode's instance (any alert on the pool
    too, for a pool-scoped mode). ``first_alert_s`` times the first alert of a signal that
    detects the mode (the degradation alert where a flag does), as ``first_finding_s``
    does for findings; ``alerted_by`` lists every alert received about it."""
    start = result.injected_ts_ms
    mine = [
        a
        for a in sorted(alerts, key=lambda a: (a.received_ts_ms, a.name))
        if start <= a.received_ts_ms <= end_ms
        and (a.instance == result.instance or (mode.pool_scoped and a.instance is None))
    ]
    detecting = [a for a in mine if _detects(mode, a)]
    result.first_alert_s = _seconds(detecting[0].received_ts_ms, start) if detecting else None
    result.alerted_by = sorted({a.name for a in mine})
    return result


def _detects(mode: DrillMode, alert: AlertRow) -> bool:
    if alert.signal == "degradation":
        return FLAG in mode.expected
    return alert.signal is not None and matches(mode.expected, alert.signal)


def alert_false_positives(
    fleet: str, alerts: Iterable[AlertRow], faulted: dict[str, tuple[int, DrillMode]]
) -> list[FalsePositive]:
    """Alerts nothing in the drill explains: on a healthy instance, on a faulted one before
    its injection, and on the pool when no fault ran in the fleet (or, for a signal's pool
    alert, when no pool-scoped mode ran, as for findings). An SLO burn or a degradation
    level of the pool in a fleet with a faulted instance is that fault's doing (the pool's
    level follows its pods'), not a false positive."""
    pool_faulted = any(mode.pool_scoped for _, mode in faulted.values())
    out = []
    for a in alerts:
        if a.instance is not None:
            explained = a.instance in faulted and a.received_ts_ms >= faulted[a.instance][0]
        elif a.slo or a.signal == "degradation":  # the pool's SLO, or its level (from its pods)
            explained = any(a.received_ts_ms >= injected for injected, _ in faulted.values())
        else:
            explained = pool_faulted
        if not explained:
            where = a.instance or a.pool or ""
            out.append(FalsePositive(fleet, "alert", a.name, where, a.received_ts_ms))
    return sorted(out, key=lambda p: (p.ts_ms, p.scope_id, p.name))
