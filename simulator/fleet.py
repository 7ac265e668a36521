"""The fleet: every pod and dcgm exporter on one asyncio event loop in a background thread.

``with Fleet(config) as fleet:`` binds free loopback ports and returns once every server
listens, the front ends of ``config.gateway``/``config.pd`` (:mod:`simulator.frontends`)
included; fault calls from the caller's thread are marshalled onto the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from pipeline.errors import ConfigError, LlmsloError
from simulator.autoscaler import Autoscaler
from simulator.config import FleetConfig
from simulator.dcgm import DcgmExporter
from simulator.frontends import FrontEnds
from simulator.gateway import Gateway
from simulator.pd import PdPair
from simulator.pod import EnginePod

__all__ = ["Fleet"]

T = TypeVar("T")


class Fleet:
    """A running simulated fleet (context manager).

    ``pods`` and ``dcgm`` are in config order; each has ``.url`` and ``.instance`` (its
    ``host:port``). Scrape targets and taps name pods by their config name (``pod-0``, …):
    :meth:`file_sd` gives the targets with those names, :meth:`describe` both. With
    ``config.gateway`` a :class:`~simulator.gateway.Gateway` fronts its pods
    (:attr:`gateway`, scaled by :attr:`autoscaler` when configured); with ``config.pd`` a
    :class:`~simulator.pd.PdPair` serves over two pods (:attr:`pd`). Their faults go
    through :meth:`set_front_end_fault`.
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.pods: list[EnginePod] = []
        self.dcgm: list[DcgmExporter] = []
        self.front_ends = FrontEnds(config, self.pods)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the loop thread and every server; raises LlmsloError if binding fails."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="llmslo-sim", daemon=True)
        self._thread.start()
        try:
            self.call(self._start())
        except OSError as exc:
            self.close()
            raise LlmsloError(f"simulator could not bind: {exc}") from exc

    async def _start(self) -> None:
        by_node: dict[str, DcgmExporter] = {}
        for node in self.config.nodes:
            exporter = DcgmExporter(node, host=self.config.host)
            by_node[node.name] = exporter
            self.dcgm.append(exporter)
        for i, pod_config in enumerate(self.config.pods):
            pod = EnginePod(
                pod_config,
                host=self.config.host,
                speed=self.config.speed,
                seed=self.config.seed * 1_000_003 + i,
            )
            self.pods.append(pod)
            if pod_config.node is not None:
                by_node[pod_config.node].attach(pod)
        await asyncio.gather(*(p.start() for p in self.pods), *(d.start() for d in self.dcgm))
        await self.front_ends.start()

    def close(self) -> None:
        """Stop every server and the loop thread (idempotent)."""
        loop = self._loop
        if loop is None:
            return
        if loop.is_running():
            try:
                self.call(self._stop(), timeout=30)
            finally:
                loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)
        loop.close()
        self._loop = None

    async def _stop(self) -> None:
        await self.front_ends.stop()
        await asyncio.gather(
            *(p.stop() for p in self.pods), *(d.stop() for d in self.dcgm), return_exceptions=True
        )

    # ---- access -----------------------------------------------------------------------
    @property
    def gateway(self) -> Gateway | None:
        """The gateway + router of ``config.gateway`` (``None`` without one)."""
        return self.front_ends.gateway

    @property
    def autoscaler(self) -> Autoscaler | None:
        """The autoscaler of ``config.gateway.autoscaler``, scaling :attr:`gateway`."""
        return self.front_ends.autoscaler

    @property
    def pd(self) -> PdPair | None:
        """The prefill/decode pair of ``config.pd``."""
        return self.front_ends.pd

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise LlmsloError("fleet is not running")
        return self._loop

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the fleet's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def pod(self, name: str) -> EnginePod:
        """The pod called ``name``; raises ConfigError if there is none."""
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise ConfigError(f"pod: unknown {name!r}")

    def set_fault(self, pod: str, fault: str, **params: Any) -> dict[str, Any]:
        """Same as ``POST {pod.url}/admin/faults``; raises ConfigError on bad names/params."""
        target = self.pod(pod)
        return self.call(target.set_fault(fault, params))

    def clear_fault(self, pod: str, fault: str) -> bool:
        """Same as ``DELETE {pod.url}/admin/faults/{fault}``; returns whether it was active."""
        target = self.pod(pod)
        return self.call(target.clear_fault(fault))

    def set_front_end_fault(self, fault: str, **params: Any) -> None:
        """Switch on a fault of the gateway, its autoscaler or the P/D pair
        (:data:`simulator.frontends.FRONT_END_FAULTS`); raises ConfigError for an unknown
        fault, a front end this fleet lacks or bad params."""
        self.call(self.front_ends.set_fault(fault, params))

    def clear_front_end_fault(self, fault: str) -> bool:
        """Switch it off again; returns whether it was on. ConfigError as the setter."""
        return self.call(self.front_ends.clear_fault(fault))

    def active_faults(self, pod: str) -> dict[str, dict[str, Any]]:
        """Same as ``GET {pod.url}/admin/faults``."""
        return self.pod(pod).faults.snapshot()

    def file_sd(self) -> list[dict[str, Any]]:
        """Prometheus file_sd groups of every pod and dcgm exporter, with the names people use.

        A pod is labelled ``pod`` (its name, which DCGM's ``pod`` label carries too, so GPUs
        join the engine they serve), ``node`` and ``model``; an exporter is named by its node.
        One target per group (a naming label names one target). The front ends follow
        (:meth:`simulator.frontends.FrontEnds.file_sd`).
        """
        groups: list[dict[str, Any]] = [
            {
                "targets": [p.instance],
                "labels": {"pod": p.name, "node": p.config.node, "model": p.model}
                if p.config.node
                else {"pod": p.name, "model": p.model},
            }
            for p in self.pods
        ]
        groups += [
            {"targets": [d.instance], "labels": {"instance": d.node, "node": d.node}}
            for d in self.dcgm
        ]
        return groups + self.front_ends.file_sd()

    @property
    def gateway_instance(self) -> str:
        """The gateway's ``host:port``: the name of its scrape rows and probe records when
        it is addressed by URL (as the drill does; the prober names an entry point by its
        URL's host:port unless told otherwise). Its file_sd group names it ``gateway``."""
        if self.gateway is None:
            raise ConfigError("this fleet has no gateway")
        return f"{self.gateway.host}:{self.gateway.port}"

    def describe(self) -> dict[str, Any]:
        """Pod and dcgm endpoints as JSON-ready data (what ``llmslo sim`` prints).

        ``instance`` is the name records carry (the pod's or node's name); ``address`` its
        ``host:port``. ``gateway``, ``autoscaler`` and ``pd`` are ``None`` when absent.
        """
        return {
            "pods": [
                {
                    "name": p.name,
                    "url": p.url,
                    "instance": p.name,
                    "address": p.instance,
                    "dialect": p.dialect,
                    "model": p.model,
                    "node": p.config.node,
                    "gpus": p.config.gpus,
                }
                for p in self.pods
            ],
            "dcgm": [
                {"node": d.node, "url": d.url, "instance": d.node, "address": d.instance}
                for d in self.dcgm
            ],
            **self.front_ends.describe(),
            "file_sd": self.file_sd(),
        }
