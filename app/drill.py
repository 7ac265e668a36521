"""Chaos drills: inject each failure mode into a simulated fleet and score the real pipeline.

Per fleet: the embedded broker, the pipeline of ``llmslo run`` (ingest + SLO jobs on a fresh
DuckDB file), a simulated fleet, one stream tap per pod, the collector and Poisson load
through the taps, all in this process (:mod:`app.drill_edges`).
After a warm-up each mode's fault is set on its own pod at a seeded random moment, held,
then removed, and the run goes on to see it clear. The stored ``slo_findings`` and
``flag_transitions`` are then scored (:mod:`app.drill_score`) against the expected
signals (:mod:`app.drill_modes`). Pods without a fault are the healthy instances: anything
raised on them is a false positive. A healthy control fleet (no faults) runs last.

Time is compressed where that is honest (:class:`DrillProfile`, stated in the report):
scrape and jobs every 2 s, ``stall_for_s`` 20, flag dwell 20 s, entry/gateway windows 20 s
with a probe every 2 s, a 60-second detector lookback and a crash reported for 40 s after
the restart instead of 60 s, 120 s, 60 s and 10 s, 600 s and 300 s; the fault itself runs at
the simulator's real speed.

Alerts: with ``prometheus-alertmanager`` installed each fleet gets a real Alertmanager on
loopback that the pipeline's alert pusher posts to; ``first_alert_s`` is when it received
the first alert of a detecting signal on the mode's instance (:mod:`app.drill_alerts`).
Load is stated as a share of one pod's capacity (:mod:`simulator.capacity`, measured on
the engine model); the report gives the harness's own event-loop lateness beside it.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.drill_alerts import Alertmanager, AlertWatch, find_alertmanager
from app.drill_edges import DrillEdges
from app.drill_fronts import run_front_end_fleet
from app.drill_lag import LoopLag
from app.drill_modes import FLAG, MODES, DrillMode
from app.drill_pipeline import PipelineProcess
from app.drill_profile import DrillProfile, FleetRun, drill_config, injection_times, sleep_until
from app.drill_rows import alert_rows, kv_crossings, read_rows
from app.drill_score import (
    ModeResult,
    alert_false_positives,
    false_positives,
    score_alerts,
    score_mode,
)
from app.sections import load_config
from pipeline.bus import Bus
from pipeline.errors import ConfigError
from simulator import Fleet, FleetConfig, GatewayConfig, NodeConfig, PodConfig
from simulator.capacity import Capacity, Sustainable, measure_capacity, sustainable_capacity
from simulator.config import EngineConfig

__all__ = ["DrillProfile", "DrillReport", "FleetRun", "plan_fleets", "run_drill"]

#: The drill's token mix (``simulator.traces.poisson_arrivals`` defaults, exponential).
MEAN_PROMPT_TOKENS = 512.0
MEAN_OUTPUT_TOKENS = 128.0

log = logging.getLogger(__name__)


@dataclass
class DrillReport:
    """The whole drill: per-mode results, per-fleet false positives, the profile used."""

    started_ts_ms: int
    profile: DrillProfile
    results: list[ModeResult] = field(default_factory=list)
    fleets: list[FleetRun] = field(default_factory=list)
    alertmanager: str | None = None  # the binary used; None: not run (not installed)
    capacity_rps: float | None = None  # one pod's saturated throughput at the drill's mix
    capacity_method: str = ""
    sustainable_rps: float | None = None  # what it serves without degrading (healthy_load's base)
    sustainable_method: str = ""

    @property
    def false_positive_count(self) -> int:
        return sum(len(f.false_positives) for f in self.fleets)

    def as_dict(self) -> dict[str, Any]:
        return {
            "started_ts_ms": self.started_ts_ms,
            "profile": asdict(self.profile),
            "results": [asdict(r) for r in self.results],
            "fleets": [asdict(f) for f in self.fleets],
            "false_positives": self.false_positive_count,
            "alertmanager": self.alertmanager,
            "capacity_rps": self.capacity_rps,
            "capacity_method": self.capacity_method,
            "sustainable_rps": self.sustainable_rps,
            "sustainable_method": self.sustainable_method,
            "healthy_load": self.profile.healthy_load,
        }


def plan_fleets(modes: Sequence[DrillMode], per_fleet: int) -> list[list[DrillMode]]:
    """Modes that change load or taps get a fleet each; the others share, ``per_fleet`` a fleet."""
    shared = [m for m in modes if not m.own_fleet]
    plan = [shared[i : i + per_fleet] for i in range(0, len(shared), per_fleet)]
    return plan + [[m] for m in modes if m.own_fleet]


def run_drill(
    modes: Sequence[DrillMode],
    workdir: Path,
    profile: DrillProfile = DrillProfile(),
    *,
    healthy_control: bool = True,
    say: Any = None,
) -> DrillReport:
    """Drill every mode, then (``healthy_control``) a fleet with no faults; returns the report.

    Raises :class:`ConfigError` when nothing is to be run, or when Alertmanager is required
    (``LLMSLO_REQUIRE_TOOLS=1``) but not installed. ``say(text)`` gets progress lines.
    """
    if not modes and not healthy_control:
        raise ConfigError("drill: no modes and no healthy control run: nothing to do")
    if profile.healthy_load is not None and not 0 < profile.healthy_load <= 2:
        raise ConfigError("drill: healthy_load must be a share of capacity in (0, 2]")
    binary = find_alertmanager()
    workdir.mkdir(parents=True, exist_ok=True)
    capacity = _pod_capacity(profile.prefill_chunk_tokens)
    report = DrillReport(
        int(time.time() * 1000), profile, alertmanager=binary, capacity_rps=capacity.rps
    )
    report.capacity_method = capacity.describe()
    sustainable = None
    if profile.healthy_load is not None:
        sustainable = _sustainable_capacity(profile.prefill_chunk_tokens)
        report.sustainable_rps = round(sustainable.rps, 3)
        report.sustainable_method = sustainable.describe()
    rng = random.Random(profile.seed)
    plan = plan_fleets(modes, profile.modes_per_fleet)
    if healthy_control:
        plan.append([])
    for index, fleet_modes in enumerate(plan):
        name = f"fleet{index}" if fleet_modes else "healthy"
        rate = profile.rate_per_pod
        if not fleet_modes and sustainable is not None and profile.healthy_load is not None:
            rate = profile.healthy_load * sustainable.rps
        if fleet_modes and fleet_modes[0].front_end:
            mode = fleet_modes[0]
            results, run = run_front_end_fleet(name, mode, profile, workdir / name, rng, say)
        else:
            results, run = _run_fleet(
                name, fleet_modes, profile, workdir / name, rng, say, rate=rate, alertmanager=binary
            )
            run.rate_per_pod, run.load_share = round(rate, 3), round(rate / capacity.rps, 3)
            if sustainable is not None:
                run.sustainable_share = round(rate / sustainable.rps, 3)
        report.results += results
        report.fleets.append(run)
    return report


@functools.cache
def _pod_capacity(prefill_chunk_tokens: int) -> Capacity:
    """One drill pod's saturated throughput at the drill's token mix (seconds of CPU, once)."""
    return measure_capacity(
        EngineConfig(prefill_chunk_tokens=prefill_chunk_tokens),
        MEAN_PROMPT_TOKENS,
        MEAN_OUTPUT_TOKENS,
    )


@functools.cache
def _sustainable_capacity(prefill_chunk_tokens: int) -> Sustainable:
    """The rate one drill pod serves without degrading (~20 s of CPU, once): the base of
    ``healthy_load``. A share of the saturated throughput is no healthy load for a KV-bound
    engine: at 0.7 of it the pod runs out of KV blocks about once a minute and preempts."""
    return sustainable_capacity(
        EngineConfig(prefill_chunk_tokens=prefill_chunk_tokens),
        MEAN_PROMPT_TOKENS,
        MEAN_OUTPUT_TOKENS,
    )


def _fleet_config(
    name: str,
    pods: int,
    seed: int,
    prefill_chunk_tokens: int,
    gateway: GatewayConfig | None = None,
) -> FleetConfig:
    return FleetConfig(
        nodes=[NodeConfig(name=f"{name}-node", gpus=max(pods, 1))],
        pods=[
            PodConfig(
                name=f"{name}-p{i}",
                dialect="vllm",
                node=f"{name}-node",
                gpus=[i],
                engine=EngineConfig(prefill_chunk_tokens=prefill_chunk_tokens),
            )
            for i in range(pods)
        ],
        seed=seed,
        gateway=gateway,
    )


def _run_fleet(
    name: str,
    modes: list[DrillMode],
    profile: DrillProfile,
    workdir: Path,
    rng: random.Random,
    say: Any,
    *,
    rate: float,
    alertmanager: str | None,
) -> tuple[list[ModeResult], FleetRun]:
    pool_scoped = any(m.pool_scoped for m in modes)
    healthy = 0 if pool_scoped else profile.healthy_pods
    pod_count = max(len(modes), 1) + healthy if modes else profile.healthy_pods + 1
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "drill.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    schedule = injection_times(modes, profile, rng)
    end_s = max((t + profile.hold_s for t in schedule), default=profile.healthy_minutes * 60)
    end_s += profile.clear_s if modes else 0
    with ExitStack() as stack:
        watch, alertmanager_url = None, None
        if alertmanager is not None:
            manager = stack.enter_context(Alertmanager(alertmanager, workdir / "alertmanager"))
            watch, alertmanager_url = stack.enter_context(AlertWatch(manager.url)), manager.url
        bus = stack.enter_context(Bus(load_config(None).bus))
        gateway = _gateway_config(modes)
        fleet = stack.enter_context(
            Fleet(
                _fleet_config(name, pod_count, profile.seed, profile.prefill_chunk_tokens, gateway)
            )
        )
        entry = fleet.gateway.url if fleet.gateway is not None else None
        gpu_pods = {p.name: p.instance for p in fleet.pods}
        config = drill_config(bus.bootstrap_servers, db, profile, gpu_pods, alertmanager_url)
        pipeline = stack.enter_context(PipelineProcess(config))
        edges = stack.enter_context(
            DrillEdges(
                bus,
                [p.url for p in fleet.pods],
                [
                    f"{url}/metrics"
                    for url in [
                        *(p.url for p in fleet.pods),
                        *(d.url for d in fleet.dcgm),
                        *([entry] if entry else []),
                    ]
                ],
                scrape_s=profile.scrape_s,
                rate_per_s=rate * pod_count,
                duration_s=end_s + 5,
                tap_options={k: v for m in modes for k, v in m.tap.items()},
                load_options={k: v for m in modes for k, v in m.load.items()},
                probe_url=entry,
                probe_interval_s=profile.probe_interval_s,
            )
        )
        if say:
            say(
                f"[drill] {name}: {pod_count} pods at {rate:.2f} req/s each, "
                f"modes {[m.name for m in modes] or 'none'}, {end_s:.0f} s"
            )
        lags = {"pods": LoopLag(fleet.loop), "taps": LoopLag(edges.loop)}
        t0 = time.monotonic()
        results = _play(fleet, edges, modes, schedule, profile, t0, name, say)
        _wait_out(t0, end_s, name, say)
        end_ms = int(time.time() * 1000)
        harness_lag = {name: lag.stop() for name, lag in lags.items()}
        time.sleep(2 * profile.scrape_s)
        pipeline.finish()
        stored = stack.enter_context(pipeline.stored())
        findings, flags = read_rows(stored)
        alerts = alert_rows(watch.received()) if watch is not None else []
        faulted: dict[str, tuple[int, DrillMode]] = {}
        for result, mode in zip(results, modes, strict=True):
            score_mode(result, mode, findings, flags, end_ms)
            score_alerts(result, mode, alerts, end_ms)
            if FLAG in mode.expected:
                result.kv_crossing_s = kv_crossings(stored, pipeline.flag_policy, result)
            faulted[result.instance] = (result.injected_ts_ms, mode)
    run = FleetRun(
        name,
        [m.name for m in modes],
        [p for p in gpu_pods.values() if p not in faulted],
        round(end_s / 60, 2),
        false_positives(name, findings, flags, faulted)
        + alert_false_positives(name, alerts, faulted),
        alerts=sorted({a.name for a in alerts}),
        harness_lag_ms=harness_lag,
    )
    return results, run


def _gateway_config(modes: list[DrillMode]) -> GatewayConfig | None:
    """The fleet's gateway when a mode needs one (``None``: no gateway, no prober)."""
    if not any(m.needs_gateway for m in modes):
        return None
    options = {k: v for m in modes for k, v in m.gateway.items()}
    return GatewayConfig.model_validate({"health_interval_s": 1.0, **options})


def _wait_out(t0: float, end_s: float, name: str, say: Any, every_s: float = 300.0) -> None:
    """Sleep until ``t0 + end_s``, saying how far the run is every ``every_s`` (long
    healthy runs print progress)."""
    while time.monotonic() < t0 + end_s:
        sleep_until(min(t0 + end_s, time.monotonic() + every_s))
        if say and time.monotonic() < t0 + end_s - 1:
            say(f"[drill] {name}: {(time.monotonic() - t0) / 60:.1f} of {end_s / 60:.1f} min")


def _play(
    fleet: Fleet,
    edges: DrillEdges,
    modes: list[DrillMode],
    schedule: list[float],
    profile: DrillProfile,
    t0: float,
    fleet_name: str,
    say: Any,
) -> list[ModeResult]:
    """Set and clear each mode's fault on its pod (pod i for mode i; every pod when the mode
    is pool-scoped) at its scheduled time; returns the results with real wall times."""
    events = sorted(
        [(t, "set", i) for i, t in enumerate(schedule)]
        + [(t + profile.hold_s, "clear", i) for i, t in enumerate(schedule)]
    )
    extra: dict[int, threading.Event] = {}
    results = [
        ModeResult(
            m.name,
            fleet_name,
            fleet.gateway_instance if m.on_gateway else fleet.pods[i].instance,
            m.fault,
            0,
            0,
        )
        for i, m in enumerate(modes)
    ]
    for at_s, action, i in events:
        sleep_until(t0 + at_s)
        mode = modes[i]
        pods = fleet.pods if mode.pool_scoped else [fleet.pods[i]]
        now_ms = int(time.time() * 1000)
        if mode.extra_rate_per_s and action == "set":
            extra[i] = edges.extra_load(i, mode.extra_rate_per_s, profile.hold_s, mode.extra_load)
        elif i in extra:
            extra.pop(i).set()
        if mode.on_gateway and mode.fault is not None:
            if action == "set":
                fleet.set_front_end_fault(mode.fault)
            else:
                fleet.clear_front_end_fault(mode.fault)
            pods = []
        for pod in pods:
            if mode.fault is None:
                continue
            if action == "set":
                fleet.set_fault(pod.name, mode.fault, **dict(mode.params))
            else:
                fleet.clear_fault(pod.name, mode.fault)
        if action == "set":
            results[i].injected_ts_ms = now_ms
        else:
            results[i].removed_ts_ms = now_ms
        if say:
            say(
                f"[drill] {fleet_name} t={at_s:5.1f}s {action} {mode.name} on {results[i].instance}"
            )
    return results


def select_modes(spec: str) -> list[DrillMode]:
    """``all`` or a comma-separated list of :data:`MODES` names; raises ConfigError naming
    an unknown one."""
    if spec.strip() == "all":
        return list(MODES.values())
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ConfigError(f"--modes: unknown {unknown}; known: all, {', '.join(MODES)}")
    return [MODES[n] for n in names]
