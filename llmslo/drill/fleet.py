"""One drill fleet, start to finish: the runner every kind of drill fleet goes through.

A :class:`FleetPlan` says everything that differs between fleets, as data: the simulated
fleet's config, the modes and when each is injected (seconds from the fleet's start), the
load, and, for a fleet whose load enters through a front end (a P/D pair, a locality
router, an autoscaler's gateway: :mod:`llmslo.drill.fronts`), that entry front end and the
front end that takes the fault. :func:`run_fleet` then runs the same skeleton for all:
a real Alertmanager (when installed), the embedded broker, the pipeline of ``llmslo run``
on a fresh DuckDB file in a process of its own (:mod:`llmslo.drill.pipeline`), the simulated
fleet in another (:mod:`llmslo.drill.pods`), the edges (:mod:`llmslo.drill.edges`), the
harness's loop-lateness sampling, the faults set and cleared on schedule, a final cycle,
and the scoring (:mod:`llmslo.drill.score`).

The plan and everything :func:`run_fleet` returns pickle: a fleet runs in a worker process
of its own (:mod:`llmslo.drill.jobs`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from llmslo.drill.alerts import Alertmanager, AlertWatch
from llmslo.drill.edges import DrillEdges
from llmslo.drill.lag import LoopLag
from llmslo.drill.modes import FLAG, DrillMode
from llmslo.drill.pipeline import PipelineProcess
from llmslo.drill.pods import PodsProcess
from llmslo.drill.profile import DrillProfile, FleetRun, drill_config, sleep_until
from llmslo.drill.rows import alert_rows, kv_crossings, read_rows
from llmslo.drill.score import (
    AlertRow,
    FalsePositive,
    FindingRow,
    FlagRow,
    ModeResult,
    alert_false_positives,
    false_positives,
    score_alerts,
    score_mode,
)
from llmslo.sections import load_config
from pipeline.bus import Bus
from pipeline.errors import ConfigError
from pipeline.processes import freeze_startup_heap
from simulator import FleetConfig

__all__ = ["FleetPlan", "Say", "run_fleet"]

#: Where progress lines go (``None``: nowhere).
Say = Callable[[str], None] | None


@dataclass(frozen=True)
class FleetPlan:
    """One fleet of a drill, as data (it pickles: it crosses to a worker process).

    ``modes[i]`` is set ``inject_s[i]`` seconds after the fleet starts, on pod ``i`` (every
    pod when pool-scoped), on the gateway for a gateway fault, or on the front end
    ``faulted`` (a key of :meth:`simulator.frontends.FrontEnds.targets`: ``gateway``,
    ``autoscaler``, ``pd``) when given. ``entry``: the front end every request enters
    through (one tap in front of it); ``None``: one tap per pod. When ``entry`` is set,
    what the entry front end and the pool raise after injection is the fault's doing.
    ``rate_per_s``: the background Poisson load in total (req/s); ``rate_per_pod`` and
    ``load_share`` (of one pod's capacity) are what the report states. ``probe``: probe the
    fleet's gateway (modes in front of the taps).
    """

    name: str
    modes: tuple[DrillMode, ...]
    config: FleetConfig
    inject_s: tuple[float, ...]
    rate_per_s: float
    rate_per_pod: float
    load_share: float | None = None
    entry: str | None = None
    faulted: str | None = None
    probe: bool = False
    healthy_minutes: float = 0.0  # how long a fleet without modes runs

    def end_s(self, profile: DrillProfile) -> float:
        """Seconds from the fleet's start to the end of its run (before the final cycle)."""
        if not self.modes:
            return self.healthy_minutes * 60
        holds = (m.hold(profile.hold_s) for m in self.modes)
        return max(t + h for t, h in zip(self.inject_s, holds, strict=True)) + profile.clear_s


def _address(url: str) -> str:
    return url.removeprefix("http://")


def run_fleet(
    plan: FleetPlan,
    profile: DrillProfile,
    workdir: Path,
    alertmanager: str | None,
    say: Say = None,
) -> tuple[list[ModeResult], FleetRun]:
    """Run ``plan`` in this process and score it; returns each mode's result and the fleet's
    run record (false positives, alerts received, harness lateness, wall seconds).

    ``alertmanager``: the binary to run one with (``None``: alerts not run). Raises what
    starting a part raises (``ConfigError``, ``BusError``, ``DrillChildError``,
    ``OSError``); everything started is stopped first.
    """
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "drill.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    modes, end_s = list(plan.modes), plan.end_s(profile)
    with ExitStack() as stack:
        watch, alertmanager_url = None, None
        if alertmanager is not None:
            manager = stack.enter_context(Alertmanager(alertmanager, workdir / "alertmanager"))
            watch, alertmanager_url = stack.enter_context(AlertWatch(manager.url)), manager.url
        bus = stack.enter_context(Bus(load_config(None).bus))
        fleet = stack.enter_context(PodsProcess(plan.config))
        front_ends = fleet.front_ends
        gpu_pods = {p.name: p.instance for p in fleet.pods}
        config = drill_config(bus.bootstrap_servers, db, profile, gpu_pods, alertmanager_url)
        pipeline = stack.enter_context(PipelineProcess(config))
        # Before the load starts: a full collection must not rescan the ~200k startup
        # objects while it runs (an 85–115 ms pause of every pod's token stream at once).
        freeze_startup_heap()
        metrics = [
            *(p.url for p in fleet.pods),
            *(d.url for d in fleet.dcgm),
            *front_ends.values(),
        ]
        edges = stack.enter_context(
            DrillEdges(
                bus,
                [front_ends[plan.entry]] if plan.entry else [p.url for p in fleet.pods],
                [f"{url}/metrics" for url in metrics],
                scrape_s=profile.scrape_s,
                rate_per_s=plan.rate_per_s,
                duration_s=end_s + 5,
                tap_options={k: v for m in modes for k, v in m.tap.items()},
                load_options={k: v for m in modes for k, v in m.load.items()},
                probe_url=fleet.gateway.url if plan.probe and fleet.gateway else None,
                probe_interval_s=profile.probe_interval_s,
            )
        )
        targets = [_target(plan, fleet, front_ends, i) for i in range(len(modes))]
        if say:
            say(
                f"{len(fleet.pods)} pods, {plan.rate_per_s:.2f} req/s in all, modes "
                f"{[m.name for m in modes] or 'none'} on {targets or 'nothing'}, {end_s:.0f} s"
            )
        taps_lag = LoopLag(edges.loop)
        stack.callback(taps_lag.stop)  # stopped before its loop closes, also on Ctrl-C
        fleet.start_lag()
        t0, started_ts_ms = time.monotonic(), int(time.time() * 1000)
        results = _play(fleet, edges, plan, targets, profile, t0, say)
        _wait_out(t0, end_s, say)
        end_ms = int(time.time() * 1000)
        harness_lag = {"pods": fleet.stop_lag(), "taps": taps_lag.stop()}
        time.sleep(2 * profile.scrape_s)
        pipeline.finish()
        stored = stack.enter_context(pipeline.stored())
        findings, flags = read_rows(stored)
        alerts = alert_rows(watch.received()) if watch is not None else []
        for result, mode in zip(results, modes, strict=True):
            score_mode(result, mode, findings, flags, end_ms)
            score_alerts(result, mode, alerts, end_ms)
            if FLAG in mode.expected:
                result.kv_crossing_s = kv_crossings(stored, pipeline.flag_policy, result)
        entry = _address(front_ends[plan.entry]) if plan.entry else None
        instances = [p.instance for p in fleet.pods] + [_address(u) for u in front_ends.values()]
    faulted = {r.instance: (r.injected_ts_ms, m) for r, m in zip(results, modes, strict=True)}
    run = FleetRun(
        plan.name,
        [m.name for m in modes],
        [i for i in instances if i not in faulted],
        round(end_s / 60, 2),
        _false_positives(plan.name, findings, flags, alerts, faulted, entry),
        rate_per_pod=round(plan.rate_per_pod, 3),
        load_share=plan.load_share,
        alerts=sorted({a.name for a in alerts}),
        harness_lag_ms=harness_lag,
        inject_s=list(plan.inject_s),
        started_ts_ms=started_ts_ms,
        wall_s=round(time.monotonic() - started, 1),
        setup_s=round(t0 - started, 1),
    )
    return results, run


def _target(plan: FleetPlan, fleet: PodsProcess, front_ends: dict[str, str], i: int) -> str:
    """The instance mode ``i`` is scored on: its front end's, the gateway's, or pod ``i``'s."""
    mode = plan.modes[i]
    if plan.faulted is not None:
        return _address(front_ends[plan.faulted])
    if mode.on_gateway:
        if fleet.gateway is None:
            raise ConfigError(f"mode {mode.name}: the fleet has no gateway")
        return fleet.gateway.instance
    return fleet.pods[i].instance


def _false_positives(
    fleet: str,
    findings: list[FindingRow],
    flags: list[FlagRow],
    alerts: list[AlertRow],
    faulted: dict[str, tuple[int, DrillMode]],
    entry: str | None,
) -> list[FalsePositive]:
    """What nothing in the drill explains. Where every request enters through a front end
    (``entry``), what that front end and the pool raise after the first injection is the
    fault's doing too (the gateway queues while its autoscaler lags; the tap retries a P/D
    pair's 504s)."""
    pool_ms = None
    if entry is not None and faulted:
        pool_ms, mode = min(faulted.values(), key=lambda v: v[0])
        faulted = faulted | {entry: (pool_ms, mode)}
        alerts = [a for a in alerts if a.instance is not None or a.received_ts_ms < pool_ms]
    return sorted(
        false_positives(fleet, findings, flags, faulted, pool_faulted_ms=pool_ms)
        + alert_false_positives(fleet, alerts, faulted),
        key=lambda p: (p.ts_ms, p.scope_id, p.name),
    )


def _wait_out(t0: float, end_s: float, say: Say, every_s: float = 300.0) -> None:
    """Sleep until ``t0 + end_s``, saying how far the run is every ``every_s`` (long
    healthy runs print progress)."""
    while time.monotonic() < t0 + end_s:
        sleep_until(min(t0 + end_s, time.monotonic() + every_s))
        if say and time.monotonic() < t0 + end_s - 1:
            say(f"{(time.monotonic() - t0) / 60:.1f} of {end_s / 60:.1f} min")


def _play(
    fleet: PodsProcess,
    edges: DrillEdges,
    plan: FleetPlan,
    targets: list[str],
    profile: DrillProfile,
    t0: float,
    say: Say,
) -> list[ModeResult]:
    """Set and clear each mode's fault at its scheduled time (on a front end, or on pod i
    for mode i, every pod when the mode is pool-scoped); returns the results with the real
    wall times."""
    modes = plan.modes
    events = sorted(
        [(t, "set", i) for i, t in enumerate(plan.inject_s)]
        + [(t + modes[i].hold(profile.hold_s), "clear", i) for i, t in enumerate(plan.inject_s)]
    )
    extra: dict[int, threading.Event] = {}
    results = [
        ModeResult(m.name, plan.name, targets[i], m.fault, 0, 0) for i, m in enumerate(modes)
    ]
    for at_s, action, i in events:
        sleep_until(t0 + at_s)
        mode = modes[i]
        now_ms = int(time.time() * 1000)
        if mode.extra_rate_per_s and action == "set":
            tap = 0 if plan.entry else i  # behind an entry front end there is one tap
            hold_s = mode.hold(profile.hold_s)
            extra[i] = edges.extra_load(tap, mode.extra_rate_per_s, hold_s, mode.extra_load)
        elif i in extra:
            extra.pop(i).set()
        _switch(fleet, plan, mode, i, on=action == "set")
        if action == "set":
            results[i].injected_ts_ms = now_ms
        else:
            results[i].removed_ts_ms = now_ms
        if say:
            say(f"t={at_s:5.1f}s {action} {mode.name} on {targets[i]}")
    return results


def _switch(fleet: PodsProcess, plan: FleetPlan, mode: DrillMode, i: int, *, on: bool) -> None:
    """Set (``on``) or clear mode ``i``'s fault where it belongs."""
    if mode.fault is None:
        return
    if plan.faulted is not None or mode.on_gateway:
        if on:
            fleet.set_front_end_fault(mode.fault, **dict(mode.params))
        else:
            fleet.clear_front_end_fault(mode.fault)
        return
    for pod in fleet.pods if mode.pool_scoped else [fleet.pods[i]]:
        if on:
            fleet.set_fault(pod.name, mode.fault, **dict(mode.params))
        else:
            fleet.clear_fault(pod.name, mode.fault)
