"""The fleet: every pod and dcgm exporter on one asyncio event loop in a background thread.

``with Fleet(config) as fleet:`` binds free loopback ports and returns once every server
listens; fault calls from the caller's thread are marshalled onto the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from pipeline.errors import ConfigError, LlmsloError
from simulator.config import FleetConfig
from simulator.dcgm import DcgmExporter
from simulator.gateway import GATEWAY_FAULTS, Gateway
from simulator.pod import EnginePod

__all__ = ["Fleet"]

T = TypeVar("T")


class Fleet:
    """A running simulated fleet (context manager).

    ``pods`` and ``dcgm`` are in config order; each has ``.url`` and ``.instance`` (its
    ``host:port``). Scrape targets and taps name pods by their config name (``pod-0``, …):
    :meth:`file_sd` gives the targets with those names, :meth:`describe` both. With
    ``config.gateway`` a :class:`~simulator.gateway.Gateway` fronts every pod
    (:attr:`gateway`; its faults through :meth:`set_gateway_fault`).
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.pods: list[EnginePod] = []
        self.dcgm: list[DcgmExporter] = []
        self.gateway: Gateway | None = None
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
        gw = self.config.gateway
        if gw is not None:
            self.gateway = Gateway(
                [p.url for p in self.pods],
                host=self.config.host,
                port=gw.port or 0,
                **gw.model_dump(exclude={"port"}),
            )
            await self.gateway.start()

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
        if self.gateway is not None:
            await self.gateway.stop()
        await asyncio.gather(
            *(p.stop() for p in self.pods), *(d.stop() for d in self.dcgm), return_exceptions=True
        )

    # ---- access -----------------------------------------------------------------------
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

    def set_gateway_fault(self, fault: str, on: bool = True) -> None:
        """Switch a gateway fault (:data:`simulator.gateway.GATEWAY_FAULTS`) on or off;
        raises ConfigError without a gateway or for an unknown fault."""
        if self.gateway is None:
            raise ConfigError(f"gateway fault {fault!r}: this fleet has no gateway")
        if fault not in GATEWAY_FAULTS:
            raise ConfigError(f"gateway fault: unknown {fault!r}; known: {sorted(GATEWAY_FAULTS)}")
        gateway = self.gateway
        self.call(gateway.set_fault(fault) if on else gateway.clear_fault(fault))

    def active_faults(self, pod: str) -> dict[str, dict[str, Any]]:
        """Same as ``GET {pod.url}/admin/faults``."""
        return self.pod(pod).faults.snapshot()

    def file_sd(self) -> list[dict[str, Any]]:
        """Prometheus file_sd groups of every pod and dcgm exporter, with the names people use.

        A pod is labelled ``pod`` (its name, which DCGM's ``pod`` label carries too, so GPUs
        join the engine they serve), ``node`` and ``model``; an exporter is named by its node.
        One target per group (a naming label names one target).
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
        if self.gateway is not None:
            groups.append({"targets": [self.gateway_instance], "labels": {"dialect": "epp"}})
        return groups

    @property
    def gateway_instance(self) -> str:
        """The gateway's ``host:port``: the name of its scrape rows and of probe records
        through it (the prober names an entry point by its URL's host:port)."""
        if self.gateway is None:
            raise ConfigError("this fleet has no gateway")
        return f"{self.gateway.host}:{self.gateway.port}"

    def describe(self) -> dict[str, Any]:
        """Pod and dcgm endpoints as JSON-ready data (what ``llmslo sim`` prints).

        ``instance`` is the name records carry (the pod's or node's name); ``address`` its
        ``host:port``.
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
            "gateway": None
            if self.gateway is None
            else {
                "url": self.gateway.url,
                "metrics": f"{self.gateway.url}/metrics",
                "instance": self.gateway_instance,
                "router_down_policy": self.gateway.router_down_policy,
            },
            "file_sd": self.file_sd(),
        }
