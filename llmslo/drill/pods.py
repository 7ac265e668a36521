"""The simulated fleet of one drill fleet (pods, dcgm exporters, front ends) in a process of
its own.

The simulated pods stand in for engines, whose token timing is the GPU's. Sharing one
interpreter lock with the fleet's taps, collector and load, a pod's next token waited for
whatever held the lock: with four fleets on two cores the pods' loop ran late by p99
17–22 ms, max 63 ms, and a pool's ITL-jitter SLO burned before any fault (the taps rightly
measured a stutter, but one the harness made). In production the engine and its sidecar
tap are separate processes; so they are here, and the engine stand-ins take a higher CPU
weight (nice :data:`POD_NICE`) than everything else of the drill. Apart but at the same
weight, beside three other fleets and two hogs, a pod still missed a step by 30–40 ms a few
times in two minutes (one 65–75 ms gap in every request of its batch, measured by the taps
within 3 ms of the simulator's own writes) and a pool's ITL burn paged. Faults are set and
cleared over the child's pipe (:mod:`llmslo.drill.child`), the same calls as
:class:`simulator.Fleet`'s, and the child samples its own loop's lateness for the report.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from llmslo.drill.child import DrillChild, child_setup, serve_commands
from llmslo.drill.lag import LoopLag
from pipeline.processes import freeze_startup_heap
from simulator import Fleet, FleetConfig

__all__ = ["POD_NICE", "Endpoint", "PodsLayout", "PodsProcess"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    """A server of the simulated fleet: its name, base URL and ``host:port``."""

    name: str
    url: str
    instance: str


@dataclass(frozen=True)
class PodsLayout:
    """Where the child's servers listen: pods and dcgm exporters in config order, the front
    ends (``gateway``, ``autoscaler``, ``pd``) that serve ``/metrics``, and the gateway."""

    pods: tuple[Endpoint, ...]
    dcgm: tuple[Endpoint, ...]
    front_ends: dict[str, str]  # name → base URL
    gateway: Endpoint | None


def _layout(fleet: Fleet) -> PodsLayout:
    gateway = None
    if fleet.gateway is not None:
        gateway = Endpoint("gateway", fleet.gateway.url, fleet.gateway_instance)
    return PodsLayout(
        tuple(Endpoint(p.name, p.url, p.instance) for p in fleet.pods),
        tuple(Endpoint(d.node, d.url, d.instance) for d in fleet.dcgm),
        {name: url for name, url, _ in fleet.front_ends.targets()},
        gateway,
    )


#: The pods' CPU weight, as a nice value: the engine stand-ins keep the time a GPU would keep
#: while their fleet's taps, load and pipeline, the other fleets and the hogs take the CPU.
POD_NICE = -10


def _take_engine_weight() -> None:
    """Raise this process's CPU weight to :data:`POD_NICE` (needs ``CAP_SYS_NICE``; without
    it the pods run at the default weight, and the report's pods lateness says so)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, POD_NICE)
    except OSError as exc:
        log.warning(
            "drill pods: cannot take nice %d (%s); they run at the default weight", POD_NICE, exc
        )


def _serve(commands: Connection, config: FleetConfig, log_level: int) -> None:
    """The child: run the fleet and answer fault and lateness calls until the parent goes."""
    child_setup(log_level)
    _take_engine_weight()
    try:
        fleet = Fleet(config)
        fleet.start()
    except BaseException as exc:
        commands.send(("failed", f"{type(exc).__name__}: {exc}"))
        raise
    lag: list[LoopLag] = []
    try:
        freeze_startup_heap()  # a full collection would stop every pod's stream at once
        commands.send(("started", _layout(fleet)))
        serve_commands(
            commands,
            {
                "set_fault": lambda pod, fault, params: fleet.set_fault(pod, fault, **params),
                "clear_fault": fleet.clear_fault,
                "set_front_end_fault": lambda fault, params: fleet.set_front_end_fault(
                    fault, **params
                ),
                "clear_front_end_fault": fleet.clear_front_end_fault,
                "start_lag": lambda: lag.append(LoopLag(fleet.loop)),
                "stop_lag": lambda: lag[-1].stop() if lag else {},
            },
        )
    finally:
        for sampler in lag:
            sampler.stop()
        fleet.close()


class PodsProcess(DrillChild):
    """``with PodsProcess(config) as fleet: …``: :class:`simulator.Fleet` in a child process
    (a :class:`~llmslo.drill.child.DrillChild`).

    :attr:`pods`, :attr:`dcgm`, :attr:`front_ends` and :attr:`gateway` say where its servers
    listen. Raises :class:`~llmslo.drill.child.DrillChildError` when the child fails to
    start (a port it cannot bind) or dies; fault calls raise :class:`ConfigError` for bad
    names or params, as :class:`simulator.Fleet`'s do.
    """

    def __init__(self, config: FleetConfig, *, start_timeout_s: float = 60.0) -> None:
        super().__init__("drill pods", _serve, (config,), start_timeout_s=start_timeout_s)
        self.config = config

    def _running(self) -> PodsLayout:
        if not isinstance(self.started, PodsLayout):
            raise RuntimeError("the drill's pods are not running")
        return self.started

    @property
    def pods(self) -> tuple[Endpoint, ...]:
        return self._running().pods

    @property
    def dcgm(self) -> tuple[Endpoint, ...]:
        return self._running().dcgm

    @property
    def front_ends(self) -> dict[str, str]:
        return self._running().front_ends

    @property
    def gateway(self) -> Endpoint | None:
        return self._running().gateway

    def set_fault(self, pod: str, fault: str, **params: Any) -> dict[str, Any]:
        """:meth:`simulator.Fleet.set_fault` in the child."""
        result: dict[str, Any] = self.call("set_fault", pod, fault, params)
        return result

    def clear_fault(self, pod: str, fault: str) -> bool:
        """:meth:`simulator.Fleet.clear_fault` in the child."""
        return bool(self.call("clear_fault", pod, fault))

    def set_front_end_fault(self, fault: str, **params: Any) -> None:
        """:meth:`simulator.Fleet.set_front_end_fault` in the child."""
        self.call("set_front_end_fault", fault, params)

    def clear_front_end_fault(self, fault: str) -> bool:
        """:meth:`simulator.Fleet.clear_front_end_fault` in the child."""
        return bool(self.call("clear_front_end_fault", fault))

    def start_lag(self) -> None:
        """Start sampling the child's loop lateness (:class:`~llmslo.drill.lag.LoopLag`)."""
        self.call("start_lag")

    def stop_lag(self) -> dict[str, float]:
        """Stop sampling; returns the lateness p50 / p99 / max in ms (empty without samples)."""
        summary: dict[str, float] = self.call("stop_lag")
        return summary
