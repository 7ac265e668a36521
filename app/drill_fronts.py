"""Drill fleets whose fault sits in front of the pods: a P/D pair, a prefix-locality router,
an autoscaler: the fleet's ``gateway:`` and ``pd:`` (:mod:`simulator.frontends`), the same
front ends ``llmslo sim`` and the gateway modes of :mod:`app.drill` start.

Each such mode gets a fleet of its own: pods, the front end, the real pipeline and edges of
:mod:`app.drill` (one stream tap in front of the entry point, the collector over the pods,
the dcgm exporters and the front ends). After the warm-up the fault is set on the front
end, held and removed; the finding is expected on the front end's instance, and anything
raised elsewhere is a false positive.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.drill_edges import DrillEdges
from app.drill_modes import DrillMode
from app.drill_pipeline import PipelineProcess
from app.drill_profile import DrillProfile, FleetRun, drill_config, injection_times, sleep_until
from app.drill_rows import read_rows
from app.drill_score import ModeResult, false_positives, score_mode
from app.sections import load_config
from pipeline.bus import Bus
from pipeline.errors import ConfigError
from simulator import Fleet, FleetConfig, NodeConfig, PodConfig

__all__ = ["FRONT_END_FLEETS", "FrontEndFleet", "run_front_end_fleet"]


@dataclass(frozen=True)
class FrontEndFleet:
    """Pods, front ends and load of one kind of front-end drill fleet.

    ``front_ends``: the fleet config's ``gateway``/``pd`` keys; ``entry``: the front end
    the load goes through (``gateway`` or ``pd``); ``faulted``: the one that takes the
    fault; ``rate_per_s``: background Poisson load in total.
    """

    pods: int
    front_ends: dict[str, Any]
    entry: str
    faulted: str
    rate_per_s: float
    engine: dict[str, Any] | None = None


#: DrillMode.front_end → its fleet.
FRONT_END_FLEETS: dict[str, FrontEndFleet] = {
    # a P/D pair over two pods, and one pod beside it that serves nothing (healthy)
    "pd": FrontEndFleet(3, {"pd": {"prefill": "p0", "decode": "p1"}}, "pd", "pd", 3.0),
    # four pods that each cache 64 prefixes, behind a prefix-locality router
    "locality": FrontEndFleet(
        4,
        {"gateway": {"policy": "prefix_locality"}},
        "gateway",
        "gateway",
        6.0,
        engine={"prefix_cache_prefixes": 64},
    ),
    # one ready replica of three at a light load (0.3 req/s); the mode brings the ramp
    "autoscaler": FrontEndFleet(
        3,
        {
            "gateway": {
                "policy": "least_in_flight",
                "autoscaler": {
                    "target_in_flight": 2,
                    "replica_in_flight": 2,
                    "startup_s": 1.0,
                    "cooldown_s": 20.0,
                },
            }
        },
        "gateway",
        "autoscaler",
        0.3,
    ),
}


def _fleet_config(
    name: str, kind: FrontEndFleet, seed: int, prefill_chunk_tokens: int
) -> FleetConfig:
    return FleetConfig.model_validate(
        {
            "nodes": [NodeConfig(name=f"{name}-node", gpus=kind.pods)],
            "pods": [
                PodConfig.model_validate(
                    {
                        "name": f"p{i}",
                        "dialect": "vllm",
                        "node": f"{name}-node",
                        "gpus": [i],
                        "engine": {
                            "prefill_chunk_tokens": prefill_chunk_tokens,
                            **(kind.engine or {}),
                        },
                    }
                )
                for i in range(kind.pods)
            ],
            **kind.front_ends,
            "seed": seed,
        }
    )


def _address(url: str) -> str:
    return url.removeprefix("http://")


def run_front_end_fleet(
    name: str,
    mode: DrillMode,
    profile: DrillProfile,
    workdir: Path,
    rng: random.Random,
    say: Any,
) -> tuple[list[ModeResult], FleetRun]:
    """Drill ``mode`` (with ``front_end`` set) on a fleet of its own; returns its result and
    the fleet's false positives. Raises ConfigError for an unknown ``front_end``."""
    kind = FRONT_END_FLEETS.get(mode.front_end or "")
    if kind is None or mode.fault is None:
        raise ConfigError(f"drill mode {mode.name}: unknown front_end {mode.front_end!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "drill.duckdb"
    for stale in (db, db.with_suffix(".duckdb.wal")):
        stale.unlink(missing_ok=True)
    [inject_s] = injection_times([mode], profile, rng)
    end_s = inject_s + profile.hold_s + profile.clear_s
    with ExitStack() as stack:
        bus = stack.enter_context(Bus(load_config(None).bus))
        fleet = stack.enter_context(
            Fleet(_fleet_config(name, kind, profile.seed, profile.prefill_chunk_tokens))
        )
        urls = {front: url for front, url, _ in fleet.front_ends.targets()}
        gpu_pods = {p.name: p.instance for p in fleet.pods}
        pipeline = stack.enter_context(
            PipelineProcess(drill_config(bus.bootstrap_servers, db, profile, gpu_pods))
        )
        metrics = [p.url for p in fleet.pods] + [d.url for d in fleet.dcgm] + list(urls.values())
        edges = stack.enter_context(
            DrillEdges(
                bus,
                [urls[kind.entry]],
                [f"{url}/metrics" for url in metrics],
                scrape_s=profile.scrape_s,
                rate_per_s=kind.rate_per_s,
                duration_s=end_s + 5,
                tap_options=dict(mode.tap),
                load_options=dict(mode.load),
            )
        )
        instance = _address(urls[kind.faulted])
        if say:
            say(f"[drill] {name}: {mode.name} on {kind.faulted} {instance}, {end_s:.0f} s")
        t0 = time.monotonic()
        result = ModeResult(mode.name, name, instance, mode.fault, 0, 0)
        sleep_until(t0 + inject_s)
        extra = (
            edges.extra_load(0, mode.extra_rate_per_s, profile.hold_s, mode.extra_load)
            if mode.extra_rate_per_s
            else None
        )
        fleet.set_front_end_fault(mode.fault, **dict(mode.params))
        result.injected_ts_ms = int(time.time() * 1000)
        if say:
            say(f"[drill] {name} t={inject_s:5.1f}s set {mode.name} on {kind.faulted}")
        sleep_until(t0 + inject_s + profile.hold_s)
        if extra is not None:
            extra.set()
        fleet.clear_front_end_fault(mode.fault)
        result.removed_ts_ms = int(time.time() * 1000)
        sleep_until(t0 + end_s)
        end_ms = int(time.time() * 1000)
        time.sleep(2 * profile.scrape_s)
        pipeline.finish()
        findings, flags = read_rows(stack.enter_context(pipeline.stored()))
        score_mode(result, mode, findings, flags, end_ms)
        others = [p.instance for p in fleet.pods] + [
            _address(u) for f, u in urls.items() if f != kind.faulted
        ]
    run = FleetRun(
        name,
        [mode.name],
        others,
        round(end_s / 60, 2),
        # Every request goes through the faulted front end or the one in front of it (the
        # gateway queues while its autoscaler lags; the tap retries a P/D pair's 504s), so
        # what the entry front end and the pool raise after injection is the fault's doing.
        false_positives(
            name,
            findings,
            flags,
            {
                instance: (result.injected_ts_ms, mode),
                _address(urls[kind.entry]): (result.injected_ts_ms, mode),
            },
            pool_faulted_ms=result.injected_ts_ms,
        ),
    )
    return [result], run
