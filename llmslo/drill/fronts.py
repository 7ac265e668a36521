"""Drill fleets whose fault sits in front of the pods: a P/D pair, a prefix-locality router,
an autoscaler: the fleet's ``gateway:`` and ``pd:`` (:mod:`simulator.frontends`), the same
front ends ``llmslo sim`` and the gateway modes of :mod:`llmslo.drill.matrix` start.

Each such mode gets a fleet of its own, run by the one fleet runner (:mod:`llmslo.drill.fleet`)
from the data here: pods, the front ends, the entry front end (one stream tap in front of it)
and the front end that takes the fault. The collector scrapes the pods, the dcgm exporters
and the front ends. After the warm-up the fault is set on the front end, held and removed;
the finding is expected on the front end's instance; what the entry front end and the pool
raise after injection is the fault's doing, anything else raised is a false positive.

:func:`drill_fleet_config` builds the pods of every drill fleet, these and :mod:`llmslo.drill.matrix`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmslo.drill.modes import DrillMode
from pipeline.errors import ConfigError
from simulator import FleetConfig, NodeConfig, PodConfig

__all__ = [
    "FRONT_END_FLEETS",
    "FrontEndFleet",
    "drill_fleet_config",
    "front_end_config",
    "front_end_fleet",
]


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


def drill_fleet_config(
    name: str,
    pods: int,
    seed: int,
    prefill_chunk_tokens: int,
    *,
    pod_prefix: str = "",
    engine: Mapping[str, Any] | None = None,
    front_ends: Mapping[str, Any] | None = None,
) -> FleetConfig:
    """The simulated fleet of a drill fleet ``name``: ``pods`` vLLM pods named
    ``{pod_prefix}p0``, … on one node ``{name}-node``, one GPU each, with the drill's
    ``prefill_chunk_tokens`` and ``engine``'s other settings, and ``front_ends`` (the fleet
    config's ``gateway``/``pd`` keys). Raises ``ValidationError`` for a front end or engine
    setting the simulator refuses."""
    return FleetConfig.model_validate(
        {
            "nodes": [NodeConfig(name=f"{name}-node", gpus=max(pods, 1))],
            "pods": [
                PodConfig.model_validate(
                    {
                        "name": f"{pod_prefix}p{i}",
                        "dialect": "vllm",
                        "node": f"{name}-node",
                        "gpus": [i],
                        "engine": {"prefill_chunk_tokens": prefill_chunk_tokens, **(engine or {})},
                    }
                )
                for i in range(pods)
            ],
            **(front_ends or {}),
            "seed": seed,
        }
    )


def front_end_config(
    name: str, kind: FrontEndFleet, seed: int, prefill_chunk_tokens: int
) -> FleetConfig:
    """The simulated fleet of one front-end drill fleet: ``kind.pods`` pods (named ``p0``,
    …: the front ends name them so) and its front ends."""
    return drill_fleet_config(
        name,
        kind.pods,
        seed,
        prefill_chunk_tokens,
        engine=kind.engine,
        front_ends=kind.front_ends,
    )


def front_end_fleet(mode: DrillMode) -> FrontEndFleet:
    """The fleet kind of a mode with ``front_end`` set; raises ConfigError for an unknown
    ``front_end`` (or a mode without a fault to set on it)."""
    kind = FRONT_END_FLEETS.get(mode.front_end or "")
    if kind is None or mode.fault is None:
        raise ConfigError(f"drill mode {mode.name}: unknown front_end {mode.front_end!r}")
    return kind
