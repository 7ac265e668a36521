"""``llmslo jobs``: every interval, roll up, evaluate SLOs, detect signals, step flags, publish.

One :meth:`SloJobs.run_once` is a cycle at one event time: the injected clock's, or (by
default) the newest timestamp in the data, so replaying history gives the same answers.
A failing step is logged and counted (``llmslo_job_errors_total{job}``) and the next
cycle retries: the loop never dies on one bad cycle.

A cycle that computed and wrote the flags ends with a :class:`~slo.sinks.JobsHeartbeat`
to the transition sink (the ``flags`` topic beside the transitions). Its ``ts_ms`` is
wall-clock time: readers judge staleness by it, because event time stands still over a
finished or idle store while the flags it produced are still being served.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import duckdb
from pydantic import BaseModel, Field

from pipeline.config import STRICT
from pipeline.errors import LlmsloError
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo.buckets import check_bucket_bounds, observed_bounds
from slo.evaluate import SloStatus, evaluate
from slo.flags import UNKNOWN, FlagBoard, FlagPolicy, FlagState, FlagTransition
from slo.metrics import JobMetrics
from slo.rollups.counts import Rollup
from slo.rollups.requests import RequestRollup
from slo.signals.detectors import DetectorConfig, Finding, detect_all
from slo.signals.snapshot import Snapshot, load_snapshot
from slo.sinks import (
    JobsHeartbeat,
    ListTransitionSink,
    TransitionSink,
    create_output_tables,
    load_flag_states,
    write_findings,
    write_status,
)
from slo.spec.model import SloModel
from slo.window_sums import WindowSums

__all__ = ["CycleResult", "JobsConfig", "SloJobs", "data_clock"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class JobsConfig(BaseModel):
    """The ``slo`` section of the llmslo config file."""

    model_config = STRICT

    spec: Path | None = Field(default=None, strict=False, description="SLO spec file (llmslo/v1)")
    interval_s: float = Field(default=15.0, gt=0, description="seconds between cycles")
    settle_s: float = Field(
        default=600.0, ge=0, description="how far back each cycle recomputes rollups (late records)"
    )
    rollup_horizon_days: float = Field(
        default=7.0, gt=0, description="raw data a first build or rebuild reads"
    )
    minute_retention_days: float = Field(
        default=35.0, gt=0, description="slo_minute rows kept (≥ the longest period)"
    )
    prune_raw: bool = Field(
        default=True,
        description="delete raw rows older than store.raw_retention_days each hour (in llmslo run)",
    )
    kv_stale_s: float = Field(
        default=60.0, gt=0, description="a KV sample older than this is no observation"
    )
    forget_after_s: float = Field(
        default=3_600.0,
        gt=0,
        description="an instance unknown this long and no longer in the data (a pod deleted "
        "or rescheduled under a new name) is forgotten: dropped from the jobs' levels and "
        "/metrics, so a fleet that churns pods does not grow them without end",
    )
    pool_level: Literal["worst_held", "kv"] = Field(
        default="worst_held",
        description="a pool's level: worst_held = the worst level one instance has held for "
        "flags.dwell_s (never a mean that hides one instance); kv = from the pool's KV free "
        "ratio aggregated by pool_kv",
    )
    pool_kv: Literal["mean", "worst"] = Field(
        default="mean", description="pool KV free ratio from its instances (pool_level: kv)"
    )
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve /metrics here (0 = any free port)"
    )
    metrics_host: str = "127.0.0.1"
    detectors: DetectorConfig = DetectorConfig()
    flags: FlagPolicy = FlagPolicy()


@dataclass
class CycleResult:
    """What one cycle computed."""

    now_ms: int
    statuses: list[SloStatus] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    transitions: list[FlagTransition] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Every scope's degradation state after this cycle, (scope, scope_id) → state.
    flags: dict[tuple[str, str], FlagState] = field(default_factory=dict)


def _l3_pins(findings: list[Finding]) -> dict[str, tuple[str, Any]]:
    """Instances pinned at L3 and why: memory pressure (``oom_risk``) or a GPU that an XID
    took out (``xid_gpu_lost``). Other XIDs and signals do not force a level."""
    pins: dict[str, tuple[str, Any]] = {}
    for f in findings:
        if f.scope != "instance":
            continue
        if f.signal.startswith("xid_") and f.evidence.get("takes_gpu_out"):
            pins.setdefault(f.scope_id, ("xid_gpu_lost", f.evidence))
        elif f.signal == "oom_risk":
            pins[f.scope_id] = ("oom_risk", f.evidence)
    return pins


def _failed(result: CycleResult, jobs: tuple[str, ...]) -> bool:
    """Whether one of ``jobs`` failed in this cycle (the flags are then not this cycle's)."""
    return any(error.partition(":")[0] in jobs for error in result.errors)


def data_clock(con: duckdb.DuckDBPyConnection) -> Callable[[], int | None]:
    """Event time = newest sample or request in the store (``None`` while it is empty)."""

    def now() -> int | None:
        row = con.execute(
            "SELECT greatest((SELECT max(ts_ms) FROM engine_samples), "
            "(SELECT max(received_ts_ms) FROM requests))"
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    return now


class SloJobs:
    """The SLO engine's periodic jobs over one DuckDB connection."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        model: SloModel,
        config: JobsConfig | None = None,
        *,
        sink: TransitionSink | None = None,
        metrics: JobMetrics | None = None,
        clock: Callable[[], int | None] | None = None,
        raw_pruner: Callable[[int], object] | None = None,
        raw_retention_ms: int | None = None,
        on_cycle: Callable[[CycleResult], object] | None = None,
        wall_clock: Callable[[], float] = time.time,
        jobs_id: str | None = None,
    ) -> None:
        """``wall_clock`` (Unix seconds) stamps the heartbeats, ``jobs_id`` names this
        process in them (default host-pid). ``raw_pruner(before_ts_ms)`` (e.g. ``Store.prune``) runs hourly when
        ``config.prune_raw`` is set, keeping ``raw_retention_ms`` of raw rows (never less than
        ``settle_s``, so rollups are never recomputed from pruned minutes). ``on_cycle(result)``
        runs after every cycle's writes (the alert pusher of path B); its failures are
        logged and counted as job ``alerts``."""
        self.on_cycle = on_cycle
        self.wall_clock = wall_clock
        self.jobs_id = jobs_id or f"{socket.gethostname()}-{os.getpid()}"
        self.con = con
        self.raw_pruner = raw_pruner
        self.raw_retention_ms = raw_retention_ms
        self.model = model
        self.config = config or JobsConfig()
        self.sink: TransitionSink = sink if sink is not None else ListTransitionSink()
        self.metrics = metrics or JobMetrics()
        self.clock = clock or data_clock(con)
        self.rollup = Rollup(
            con,
            model,
            settle_ms=int(self.config.settle_s * 1000),
            horizon_ms=int(self.config.rollup_horizon_days * DAY_MS),
        )
        self.window_sums = WindowSums(con, model)  # told the rollup's rewrites each cycle
        self.request_rollup = RequestRollup(
            con,
            settle_ms=int(self.config.settle_s * 1000),
            horizon_ms=int(self.config.rollup_horizon_days * DAY_MS),
        )
        create_output_tables(con)
        for problem in check_bucket_bounds(model, observed_bounds(con)):
            log.warning("SLO spec vs stored histograms: %s", problem)
        self.board = FlagBoard(self.config.flags, load_flag_states(con))
        self.active: dict[tuple[str, str, str], Finding] = {}
        self._stop = threading.Event()
        self._last_prune_ms = 0

    def note_written(self, changed_from_ms: Mapping[str, int | None]) -> None:
        """Tell both rollups what was written to the raw tables since the last call (table
        → earliest event time of its new rows; ``None``: anything), e.g. the Iceberg
        mirror's :attr:`~pipeline.iceberg.mirror.MirrorReport.changed_from_ms`: each cycle
        then recomputes only the minutes new rows fell in, not the settle window."""
        self.rollup.note_written(changed_from_ms)
        self.request_rollup.note_written(changed_from_ms)

    def _timed(self, job: str, result: CycleResult, fn: Callable[[], T]) -> T | None:
        started = time.perf_counter()
        try:
            return fn()
        except (duckdb.Error, LlmsloError, ValueError) as exc:
            log.exception("slo job %s failed at %d", job, result.now_ms)
            self.metrics.errors.labels(job).inc()
            result.errors.append(f"{job}: {exc}")
            return None
        finally:
            self.metrics.duration.labels(job).observe(time.perf_counter() - started)

    def _detector_failed(self, name: str) -> None:
        self.metrics.errors.labels(f"detector:{name}").inc()

    def run_once(self, now_ms: int | None = None) -> CycleResult | None:
        """One cycle at ``now_ms`` (default: the clock). ``None`` when there is no data yet."""
        now = now_ms if now_ms is not None else self.clock()
        if now is None:
            return None
        result = CycleResult(now)
        self._timed("rollup", result, lambda: self.rollup.update(now))
        self._timed("request_rollup", result, lambda: self.request_rollup.update(now))
        judged = self.judge(result)
        if judged and not _failed(result, ("flags", "write")):
            self._timed("heartbeat", result, lambda: self._beat(result))
        if self.on_cycle is not None:
            hook = self.on_cycle
            self._timed("alerts", result, lambda: hook(result))
        self._timed("prune", result, lambda: self._prune(now))
        self.metrics.last_eval.set(now / 1000)
        return result

    def judge(self, result: CycleResult, *, status: bool = True) -> bool:
        """The part of a cycle that reads the rollups and raw rows as of ``result.now_ms`` and
        writes what it concluded: evaluate, detect, step flags, write. Every time inside it is
        ``result.now_ms`` (event time), never the wall clock, so a replay
        (:mod:`slo.replay`) that calls it step by step concludes what live cycles did.
        ``status=False`` leaves ``slo_status_current`` as it is (a replay writes it at its
        last step only: each write replaces the last). Returns whether a snapshot was read
        (the flags were stepped)."""
        now = result.now_ms
        result.statuses = self._timed("evaluate", result, lambda: self._evaluate(now)) or []
        snap = self._timed("snapshot", result, lambda: self._snapshot(now))
        if snap is not None:
            self.metrics.record_autoscalers(snap.autoscalers)
            result.findings = (
                self._timed(
                    "signals",
                    result,
                    lambda: detect_all(snap, self.config.detectors, self._detector_failed),
                )
                or []
            )
            result.transitions = (
                self._timed("flags", result, lambda: self._step_flags(snap, result.findings)) or []
            )
        self._timed("write", result, lambda: self._write(result, status))
        result.flags = dict(self.board.states)
        return snap is not None

    def _evaluate(self, now: int) -> list[SloStatus]:
        """Every SLO at ``now`` from the kept window sums, told what the rollup rewrote since;
        a failure forgets them (what the last read saw is unknown)."""
        self.window_sums.note_changes(self.rollup.take_changes())
        try:
            return evaluate(self.con, self.model, now, self.window_sums)
        except Exception:
            self.window_sums.reset()
            raise

    def _beat(self, result: CycleResult) -> None:
        self.sink.beat(
            JobsHeartbeat(
                ts_ms=int(self.wall_clock() * 1000),
                event_ts_ms=result.now_ms,
                jobs_id=self.jobs_id,
                interval_s=self.config.interval_s,
                errors=len(result.errors),
            )
        )

    def _snapshot(self, now: int) -> Snapshot:
        cfg = self.config.detectors
        return load_snapshot(
            self.con, now, int(cfg.lookback_s * 1000), int(cfg.ghost_grace_s * 1000)
        )

    def _step_flags(self, snap: Snapshot, findings: list[Finding]) -> list[FlagTransition]:
        pins = _l3_pins(findings)
        down = {f.scope_id: f.evidence for f in findings if f.signal == "target_down"}
        stale = snap.ago_ms(self.config.kv_stale_s)
        pools: dict[str, dict[str, float]] = {}
        unknown: dict[str, list[str]] = {}
        transitions: list[FlagTransition | None] = []
        observed = set(snap.engine) | set(down)
        self._forget_departed(snap, observed)
        for instance in sorted(observed):
            kv = snap.series(instance, "kv_usage")
            flagged_before = ("instance", instance) in self.board.states
            pinned = instance in pins and instance in snap.engine
            if kv is None and not (flagged_before or pinned):
                # nothing to judge a level on: a gateway, an autoscaler, a dcgm exporter, an
                # engine never seen up (one without a level cannot turn unknown either)
                continue
            fresh = kv is not None and len(kv) and kv.ts_ms[-1] >= stale
            free = 1.0 - kv.last() if kv is not None and fresh else None
            pool = snap.pools.get(instance, "")
            if instance in down or (kv is not None and not fresh and instance not in pins):
                reason = "target_down" if instance in down else "kv_stale"
                why = down.get(instance) or {"kv_last_ts_ms": int(kv.ts_ms[-1])}  # type: ignore[union-attr]
                transitions.append(
                    self.board.mark_unknown(snap.now_ms, "instance", instance, pool, reason, why)
                )
                unknown.setdefault(pool, []).append(instance)
                continue
            if free is not None:
                pools.setdefault(pool, {})[instance] = self._pool_input(snap, instance, free)
            evidence: dict[str, Any] = {"kv_usage": None if free is None else 1 - free}
            pin = pins.get(instance)
            if pin is not None:
                evidence[pin[0]] = pin[1]
            transitions.append(
                self.board.observe(
                    snap.now_ms,
                    "instance",
                    instance,
                    pool,
                    free,
                    pin is not None,
                    evidence,
                    pin[0] if pin else "oom_risk",
                )
            )
        for pool, frees in sorted(pools.items()):
            transitions.append(self._step_pool(snap, pool, frees, pins, unknown.get(pool, [])))
        for pool, members in sorted(unknown.items()):
            if pool not in pools and ("pool", pool) in self.board.states:
                # every instance down or stale: nothing vouches for the pool's last level
                transitions.append(
                    self.board.mark_unknown(
                        snap.now_ms,
                        "pool",
                        pool,
                        pool,
                        "no_instance_observed",
                        {"unknown_instances": members},
                    )
                )
        return [t for t in transitions if t is not None]

    def _forget_departed(self, snap: Snapshot, observed: set[str]) -> None:
        """Drop instances unknown for ``forget_after_s`` that the data no longer names."""
        horizon = snap.ago_ms(self.config.forget_after_s)
        departed = [
            key
            for key, state in self.board.states.items()
            if key[0] == "instance"
            and key[1] not in observed
            and state.level == UNKNOWN
            and state.since_ts_ms <= horizon
        ]
        for key in departed:
            del self.board.states[key]
        if departed:
            log.info(
                "flags: forgot %d departed instance(s), unknown since before %d",
                len(departed),
                horizon,
            )

    def _pool_input(self, snap: Snapshot, instance: str, free: float) -> float:
        """What one instance contributes to its pool's level (see ``pool_level``)."""
        if self.config.pool_level == "kv":
            return free
        # worst_held: the best (highest) free ratio over the dwell time is the level the
        # instance has held throughout it; an instance not yet observed that long counts 1.0
        start = snap.ago_ms(self.config.flags.dwell_s)
        kv = snap.series(instance, "kv_usage")
        if kv is None or int(kv.ts_ms[0]) > start:
            return 1.0
        held = kv.since(start)
        if not len(held):  # no scrape inside the dwell (a slow scrape): its last value held
            return free
        return float(1.0 - held.values.min())

    def _step_pool(
        self,
        snap: Snapshot,
        pool: str,
        frees: dict[str, float],
        pins: dict[str, tuple[str, Any]],
        unknown: list[str],
    ) -> FlagTransition | None:
        """The pool's level from its observed instances (unknown ones listed, not counted)."""
        values = list(frees.values())
        if self.config.pool_level == "worst_held" or self.config.pool_kv == "worst":
            free = min(values)
        else:
            free = sum(values) / len(values)
        all_pinned = all(i in pins for i in frees)  # one bad GPU does not send a pool to L3
        evidence = {
            "instances": len(values),
            "kv_free_by_instance": frees,
            "unknown_instances": unknown,
            "aggregate": self.config.pool_level
            if self.config.pool_level == "worst_held"
            else self.config.pool_kv,
        }
        if self.config.pool_level == "worst_held":
            evidence["worst_instance"] = min(frees, key=lambda i: frees[i])
            evidence["held_for_s"] = self.config.flags.dwell_s
        return self.board.observe(snap.now_ms, "pool", pool, pool, free, all_pinned, evidence)

    def _write(self, result: CycleResult, status: bool = True) -> None:
        current = {f.key: f for f in result.findings}
        started = [f for k, f in current.items() if k not in self.active]
        ended = [f for k, f in self.active.items() if k not in current]
        write_findings(self.con, result.now_ms, "firing", started)
        write_findings(self.con, result.now_ms, "resolved", ended)
        self.active = current
        if status:
            write_status(self.con, result.statuses)
        if result.transitions:
            self.sink.write(result.transitions)
            for t in result.transitions:
                self.metrics.transitions.labels(str(t.to_level)).inc()
                log.warning(
                    "degradation %s %s: L%d → L%d (%s)",
                    t.scope,
                    t.scope_id,
                    t.from_level,
                    t.to_level,
                    t.reason,
                )
        self.metrics.record_statuses(result.statuses)
        self.metrics.record_findings(result.findings)
        levels = {
            key: (key[1] if key[0] == "pool" else "", state.level)
            for key, state in self.board.states.items()
        }
        self.metrics.record_levels(levels)

    def _prune(self, now: int) -> None:
        if now - self._last_prune_ms < HOUR_MS:
            return
        self._last_prune_ms = now
        minutes_since = (
            now - int(self.config.minute_retention_days * DAY_MS) // MINUTE_MS * MINUTE_MS
        )
        self.rollup.prune(minutes_since)
        self.request_rollup.prune(minutes_since)
        if self.config.prune_raw and self.raw_pruner is not None and self.raw_retention_ms:
            keep_ms = max(self.raw_retention_ms, int(self.config.settle_s * 1000) + 2 * MINUTE_MS)
            self.raw_pruner(now - keep_ms)

    def run(self, max_cycles: int | None = None) -> int:
        """Cycle every ``interval_s`` until :meth:`stop` (or ``max_cycles``); returns cycles run."""
        cycles = 0
        while not self._stop.is_set() and (max_cycles is None or cycles < max_cycles):
            self.run_once()
            cycles += 1
            self._stop.wait(self.config.interval_s)
        return cycles

    def stop(self) -> None:
        self._stop.set()
