"""Chaos drills: inject each failure mode into a simulated fleet and score the real pipeline.

Per fleet: the embedded broker, the pipeline of ``llmslo run`` (ingest + SLO jobs on a fresh
DuckDB file), a simulated fleet, one stream tap per pod (or one in front of the fleet's entry
front end), the collector and Poisson load through the taps, all in one worker process of
its own (:mod:`llmslo.drill.fleet` runs a fleet, :mod:`llmslo.drill.jobs` runs ``jobs`` of them at
a time, longest first). Here the fleets are planned as data (:class:`FleetPlan`).
After a warm-up each mode's fault is set on its own pod (or front end) at a random moment
seeded by (seed, fleet index), held, then removed, and the run goes on to see it clear. The
stored ``slo_findings`` and ``flag_transitions`` are then scored (:mod:`llmslo.drill.score`)
against the expected signals (:mod:`llmslo.drill.modes`). Pods without a fault are the healthy
instances: anything raised on them is a false positive. A healthy control fleet (no
faults) is planned last.

Time is compressed where that is honest (:class:`DrillProfile`, stated in the report):
scrape and jobs every 2 s, ``stall_for_s`` 20, flag dwell 20 s, entry/gateway windows 20 s
with a probe every 2 s, a 60-second detector lookback and a crash reported for 40 s after
the restart instead of 60 s, 120 s, 60 s and 10 s, 600 s and 300 s; the fault itself runs at
the simulator's real speed.

Alerts: with ``prometheus-alertmanager`` installed each fleet gets a real Alertmanager on
loopback that the pipeline's alert pusher posts to; ``first_alert_s`` is when it received
the first alert of a detecting signal on the mode's instance (:mod:`llmslo.drill.alerts`).
Load is stated as a share of one pod's capacity (:mod:`simulator.capacity`, measured on
the engine model); the report gives the harness's own event-loop lateness beside it.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmslo.drill.alerts import find_alertmanager
from llmslo.drill.fleet import FleetPlan
from llmslo.drill.fronts import drill_fleet_config, front_end_config, front_end_fleet
from llmslo.drill.hogs import cpu_hogs
from llmslo.drill.jobs import DrillInterrupted, FleetFailure, run_plans
from llmslo.drill.modes import MODES, DrillMode
from llmslo.drill.profile import DrillProfile, FleetRun, fleet_rng, injection_times
from llmslo.drill.score import ModeResult
from pipeline.errors import ConfigError
from simulator import GatewayConfig
from simulator.capacity import Capacity, Sustainable, measure_capacity, sustainable_capacity
from simulator.config import EngineConfig

__all__ = [
    "JOBS",
    "MAX_PODS",
    "DrillProfile",
    "DrillReport",
    "FleetFailure",
    "FleetRun",
    "plan_fleets",
    "run_drill",
]

#: The drill's token mix (``simulator.traces.poisson_arrivals`` defaults, exponential).
MEAN_PROMPT_TOKENS = 512.0
MEAN_OUTPUT_TOKENS = 128.0

#: Fleets at a time, and their pods together: the two 9-pod fleets run one after the other,
#: each beside the control (3 pods) and a small fleet (a gateway's or a front end's, 1–4 pods).
#: Measured on 2 cores (2026-12-06): the 26 modes' fleets done in 723 s (two at a time, no pod
#: bound: 1,125 s on 2026-12-04).
JOBS = 4
MAX_PODS = 15

#: The CPU hogs' own bound: a whole matrix one fleet at a time takes ~30 minutes.
HOGS_MAX_S = 3 * 3600.0

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
    jobs: int = 1  # fleets run at a time (worker processes)
    max_pods: int | None = None  # the running fleets' pods together (None: jobs alone bound)
    wall_s: float | None = None  # the whole drill's wall seconds, first start to last teardown
    modes_wall_s: float | None = None  # from the first start until the last mode fleet ended
    failed: list[FleetFailure] = field(default_factory=list)  # fleets that did not finish
    interrupted: bool = False  # stopped by Ctrl-C: the fleets that finished are reported

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
            "hogs": self.profile.hogs,
            "hog_class": self.profile.hog_class,
            "jobs": self.jobs,
            "max_pods": self.max_pods,
            "wall_s": self.wall_s,
            "modes_wall_s": self.modes_wall_s,
            "failed": [asdict(f) for f in self.failed],
            "interrupted": self.interrupted,
        }


def plan_fleets(modes: Sequence[DrillMode], per_fleet: int) -> list[list[DrillMode]]:
    """Modes that change the fleet's load, taps or entry point get a fleet each; the others
    share, ``per_fleet`` a fleet, those with extra load on their own pod (hot instance,
    ghosts) last, so they fill the last shared fleet rather than a fleet of their own."""
    shared = sorted((m for m in modes if not m.own_fleet), key=lambda m: bool(m.extra_rate_per_s))
    plan = [shared[i : i + per_fleet] for i in range(0, len(shared), per_fleet)]
    return plan + [[m] for m in modes if m.own_fleet]


def run_drill(
    modes: Sequence[DrillMode],
    workdir: Path,
    profile: DrillProfile = DrillProfile(),
    *,
    healthy_control: bool = True,
    jobs: int = JOBS,
    max_pods: int | None = MAX_PODS,
    say: Any = None,
    advance: Callable[[float], None] | None = None,
) -> DrillReport:
    """Drill every mode, then (``healthy_control``) a fleet with no faults; returns the report.

    Each fleet runs in a worker process of its own, ``jobs`` at a time and their pods
    together within ``max_pods`` (:mod:`llmslo.drill.jobs`);
    a fleet that fails is listed in ``DrillReport.failed`` with its error, the others are
    reported. ``say(text)`` gets the drill's own progress lines, and with ``say`` the
    workers print theirs to stderr; ``advance(n)`` is called with a fleet's mode count (1
    for the healthy control) as it ends. On Ctrl-C the report of the fleets that finished
    comes back with ``interrupted`` set. Raises :class:`ConfigError` when nothing is to be run,
    for a bad profile, ``jobs`` or front end, or when Alertmanager is required
    (``LLMSLO_REQUIRE_TOOLS=1``) but not installed.
    """
    if not modes and not healthy_control:
        raise ConfigError("drill: no modes and no healthy control run: nothing to do")
    if profile.healthy_load is not None and not 0 < profile.healthy_load <= 2:
        raise ConfigError("drill: healthy_load must be a share of capacity in (0, 2]")
    if jobs < 1:
        raise ConfigError(f"drill: jobs must be ≥ 1, not {jobs}")
    if max_pods is not None and max_pods < 1:
        raise ConfigError(f"drill: max_pods must be ≥ 1, not {max_pods}")
    groups = plan_fleets(modes, profile.modes_per_fleet) + ([[]] if healthy_control else [])
    for group in groups:
        if group and group[0].front_end:
            front_end_fleet(group[0])  # refuse an unknown front end before anything starts
    binary = find_alertmanager()
    workdir.mkdir(parents=True, exist_ok=True)
    capacity = _pod_capacity(profile.prefill_chunk_tokens)
    report = DrillReport(
        int(time.time() * 1000),
        profile,
        alertmanager=binary,
        capacity_rps=capacity.rps,
        jobs=jobs,
        max_pods=max_pods,
    )
    report.capacity_method = capacity.describe()
    healthy_rps = profile.rate_per_pod
    sustainable = None
    if profile.healthy_load is not None:
        sustainable = _sustainable_capacity(profile.prefill_chunk_tokens)
        report.sustainable_rps = round(sustainable.rps, 3)
        report.sustainable_method = sustainable.describe()
        healthy_rps = profile.healthy_load * sustainable.rps
    plans = [
        _plan(index, group, profile, capacity.rps, healthy_rps)
        for index, group in enumerate(groups)
    ]
    if say:
        within = "" if max_pods is None else f" within {max_pods} pods"
        say(f"[drill] {len(plans)} fleets, {jobs} at a time{within}, longest first")
    if say and profile.hogs:
        say(f"[drill] {profile.hogs} CPU hog(s) ({profile.hog_class}) beside the fleets")
    started = time.monotonic()
    modes_ended: list[float] = []

    def ended(plan: FleetPlan, outcome: object) -> None:
        if plan.modes:
            modes_ended.append(time.monotonic())
        if advance is not None:
            advance(len(plan.modes) or 1)

    try:
        with cpu_hogs(profile.hogs, max_s=HOGS_MAX_S, hog_class=profile.hog_class):
            outcomes = run_plans(
                plans,
                profile,
                workdir,
                binary,
                jobs=jobs,
                progress=say is not None,
                say=say,
                start_gap_s=profile.start_gap_s if jobs > 1 else 0.0,
                max_pods=max_pods,
                on_outcome=ended,
            )
    except DrillInterrupted as stopped:
        outcomes = stopped.outcomes
        report.interrupted = True
    report.wall_s = round(time.monotonic() - started, 1)
    if modes_ended:
        report.modes_wall_s = round(max(modes_ended) - started, 1)
    for outcome in outcomes:
        if isinstance(outcome, FleetFailure):
            report.failed.append(outcome)
        else:
            results, run = outcome
            if sustainable is not None and not run.modes:
                run.sustainable_share = round(run.rate_per_pod / sustainable.rps, 3)
            report.results += results
            report.fleets.append(run)
    return report


def _plan(
    index: int,
    modes: list[DrillMode],
    profile: DrillProfile,
    capacity_rps: float,
    healthy_rps: float,
) -> FleetPlan:
    """Fleet ``index`` of the drill as data (``healthy_rps``: each pod's load in the healthy
    control); its injection moments come from its own rng (seed, index), so they do not
    depend on which fleets run, or in what order."""
    name = f"fleet{index}" if modes else "healthy"
    inject_s = tuple(injection_times(modes, profile, fleet_rng(profile.seed, index)))
    if modes and modes[0].front_end:
        kind = front_end_fleet(modes[0])
        rate = kind.rate_per_s / kind.pods
        return FleetPlan(
            name,
            tuple(modes),
            front_end_config(name, kind, profile.seed, profile.prefill_chunk_tokens),
            inject_s,
            kind.rate_per_s,
            rate,
            round(rate / capacity_rps, 3),
            entry=kind.entry,
            faulted=kind.faulted,
        )
    rate = profile.rate_per_pod if modes else healthy_rps
    pool_scoped = any(m.pool_scoped for m in modes)
    healthy = 0 if pool_scoped else profile.healthy_pods
    pods = max(len(modes), 1) + healthy if modes else profile.healthy_pods + 1
    return FleetPlan(
        name,
        tuple(modes),
        drill_fleet_config(
            name,
            pods,
            profile.seed,
            profile.prefill_chunk_tokens,
            pod_prefix=f"{name}-",
            front_ends=_gateway_config(modes),
        ),
        inject_s,
        rate * pods,
        rate,
        round(rate / capacity_rps, 3),
        probe=any(m.needs_gateway for m in modes),
        healthy_minutes=profile.healthy_minutes,
    )


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
        saturated=_pod_capacity(prefill_chunk_tokens),  # measured once for both
    )


def _gateway_config(modes: list[DrillMode]) -> dict[str, GatewayConfig]:
    """The fleet's gateway when a mode needs one (none: no gateway, no prober)."""
    if not any(m.needs_gateway for m in modes):
        return {}
    options = {k: v for m in modes for k, v in m.gateway.items()}
    return {"gateway": GatewayConfig.model_validate({"health_interval_s": 1.0, **options})}


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
