"""An autoscaler for the gateway's replicas, with desired/ready replicas and ``autoscaler_lag``.

Every ``tick_s`` it computes ``desired = ceil((forwarded + queued) / target_in_flight)``
clamped to ``[min_replicas, len(gateway.upstreams)]`` (the HPA formula on in-flight
requests). A scale-out makes the next idle pod *ready* ``startup_s`` later (model load);
under the ``autoscaler_lag`` fault every scale-out takes ``lag_s`` longer, so the gateway
queue grows while ready < desired, which is the matrix's evidence. A scale-in happens
after ``desired`` has stayed below ready for ``cooldown_s``.

It serves its own ``/metrics`` (``url``) shaped like a cluster-wide kube-state-metrics:
per HPA (labels ``namespace``, ``horizontalpodautoscaler``)
``kube_horizontalpodautoscaler_status_desired_replicas``, ``..._current_replicas``,
``..._spec_min_replicas``/``..._spec_max_replicas`` and ``kube_horizontalpodautoscaler_info``
naming the deployment it scales (``scaletargetref_kind``, ``scaletargetref_name``); per
deployment (``namespace``, ``deployment``) ``kube_deployment_spec_replicas`` and
``kube_deployment_status_replicas_ready``; plus the simulator's own
``llmslo_sim_autoscaler_lag_active``. Beside the gateway's HPA it exports an unrelated one
(:data:`NEIGHBOUR`, scaling in: more ready than desired), as a real cluster has: a reader
that sums the cluster's gauges sees no lag at all.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from pydantic import BaseModel, Field

from pipeline.config import STRICT
from pipeline.errors import ConfigError
from simulator.gateway import Gateway

__all__ = ["AUTOSCALER_FAULTS", "NEIGHBOUR", "Autoscaler", "AutoscalerLagParams", "Workload"]


class AutoscalerLagParams(BaseModel):
    """Extra seconds every scale-out takes while the fault is on."""

    model_config = STRICT

    lag_s: float = Field(default=30.0, gt=0, le=3600)


class Workload(NamedTuple):
    """An HPA and the deployment it scales, as kube-state-metrics names them."""

    namespace: str
    hpa: str
    deployment: str
    desired: int
    ready: int
    max_replicas: int


#: An unrelated workload's HPA and deployment on the same exporter, held still: a scale-in
#: in progress (ready above desired), so its numbers would hide the gateway's lag in a sum.
NEIGHBOUR = Workload("batch", "reranker", "reranker-v3", desired=2, ready=5, max_replicas=6)

#: The autoscaler's faults, with the signal an observer should see.
AUTOSCALER_FAULTS = {
    "autoscaler_lag": "ready replicas stay below desired for lag_s; the gateway queue grows",
}


_HPA_LABELS = ["namespace", "horizontalpodautoscaler"]
_DEPLOYMENT_LABELS = ["namespace", "deployment"]
_DESIRED = "kube_horizontalpodautoscaler_status_desired_replicas"
_CURRENT = "kube_horizontalpodautoscaler_status_current_replicas"
_MIN = "kube_horizontalpodautoscaler_spec_min_replicas"
_MAX = "kube_horizontalpodautoscaler_spec_max_replicas"
_INFO = "kube_horizontalpodautoscaler_info"
_SPEC = "kube_deployment_spec_replicas"
_READY = "kube_deployment_status_replicas_ready"
#: kube-state-metrics' families (name, help, labels), as v2.x exports them.
_FAMILIES = (
    (_DESIRED, "Desired number of replicas of pods managed by this autoscaler.", _HPA_LABELS),
    (_CURRENT, "Current number of replicas of pods managed by this autoscaler.", _HPA_LABELS),
    (_MIN, "Lower limit for the number of pods that can be set by the autoscaler.", _HPA_LABELS),
    (_MAX, "Upper limit for the number of pods that can be set by the autoscaler.", _HPA_LABELS),
    (
        _INFO,
        "Information about this autoscaler.",
        [
            *_HPA_LABELS,
            "scaletargetref_api_version",
            "scaletargetref_kind",
            "scaletargetref_name",
        ],
    ),
    (_SPEC, "Number of desired pods for a deployment.", _DEPLOYMENT_LABELS),
    (_READY, "The number of ready replicas per deployment.", _DEPLOYMENT_LABELS),
)


class Autoscaler:
    """Scales ``gateway.active`` between ``min_replicas`` and all its upstreams."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        min_replicas: int = 1,
        target_in_flight: float = 4.0,
        startup_s: float = 1.0,
        cooldown_s: float = 30.0,
        tick_s: float = 0.2,
        name: str = "llm-pool",
        namespace: str = "serving",
        host: str = "127.0.0.1",
    ) -> None:
        """``name``/``namespace``: the HPA's and its deployment's, as kube-state-metrics
        labels them; ``host``: where its ``/metrics`` listens (a free port)."""
        if not 1 <= min_replicas <= len(gateway.upstreams):
            raise ConfigError("autoscaler.min_replicas: between 1 and the gateway's upstreams")
        self.gateway = gateway
        self.min_replicas, self.target_in_flight = min_replicas, target_in_flight
        self.startup_s, self.cooldown_s, self.tick_s = startup_s, cooldown_s, tick_s
        self.lag: AutoscalerLagParams | None = None
        self.desired = min_replicas
        self._pending_ready_at: float | None = None
        self._below_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.host, self.port = host, 0
        self._runner: web.AppRunner | None = None
        r = self.registry = CollectorRegistry()
        self._hpa = {"namespace": namespace, "horizontalpodautoscaler": name}
        self._deployment = {"namespace": namespace, "deployment": name}
        self._gauges = {
            metric: Gauge(metric, doc, labels, registry=r) for metric, doc, labels in _FAMILIES
        }
        self._lagging = Gauge(
            "llmslo_sim_autoscaler_lag_active", "1 under autoscaler_lag", registry=r
        )
        self._export_static(name, len(gateway.upstreams))

    def _export_static(self, name: str, max_replicas: int) -> None:
        """The series that do not move: both HPAs' info and limits, the neighbour's numbers."""
        g, n = self._gauges, NEIGHBOUR
        target = {"scaletargetref_api_version": "apps/v1", "scaletargetref_kind": "Deployment"}
        g[_INFO].labels(**self._hpa, **target, scaletargetref_name=name).set(1)
        g[_MIN].labels(**self._hpa).set(self.min_replicas)
        g[_MAX].labels(**self._hpa).set(max_replicas)
        for family in (_DESIRED, _CURRENT):
            g[family].labels(**self._hpa)  # 0 until the first tick
        for family in (_SPEC, _READY):
            g[family].labels(**self._deployment)
        hpa = {"namespace": n.namespace, "horizontalpodautoscaler": n.hpa}
        deployment = {"namespace": n.namespace, "deployment": n.deployment}
        g[_INFO].labels(**hpa, **target, scaletargetref_name=n.deployment).set(1)
        g[_MIN].labels(**hpa).set(1)
        g[_MAX].labels(**hpa).set(n.max_replicas)
        g[_DESIRED].labels(**hpa).set(n.desired)
        g[_CURRENT].labels(**hpa).set(n.ready)
        g[_SPEC].labels(**deployment).set(n.desired)
        g[_READY].labels(**deployment).set(n.ready)

    @property
    def url(self) -> str:
        """Base URL of the autoscaler's ``/metrics`` (after :meth:`start`)."""
        return f"http://{self.host}:{self.port}"

    @property
    def ready(self) -> int:
        return len(self.gateway.active)

    async def start(self) -> None:
        """Scale the gateway in to ``min_replicas`` and start ticking (on the gateway's loop)."""
        await self.gateway.set_active(self.gateway.upstreams[: self.min_replicas])
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(
            app, handle_signals=False, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    def set_fault(self, name: str, params: dict[str, float] | None = None) -> None:
        """Switch on ``autoscaler_lag``; ConfigError for an unknown name or bad params."""
        if name not in AUTOSCALER_FAULTS:
            raise ConfigError(
                f"autoscaler fault: unknown {name!r}; known: {sorted(AUTOSCALER_FAULTS)}"
            )
        try:
            self.lag = AutoscalerLagParams.model_validate(params or {})
        except ValueError as exc:
            raise ConfigError(f"autoscaler_lag: {exc}") from exc
        self._lagging.set(1)

    def clear_fault(self, name: str) -> bool:
        was = name == "autoscaler_lag" and self.lag is not None
        self.lag = None
        self._pending_ready_at = None  # a scale-out held back by the lag starts over, normally
        self._lagging.set(0)
        return was

    async def _run(self) -> None:
        while True:
            await self.tick(time.monotonic())
            await asyncio.sleep(self.tick_s)

    async def tick(self, now_s: float) -> None:
        """One control step at ``now_s`` (monotonic seconds)."""
        gw = self.gateway
        load = gw.in_flight_total + gw.waiting
        wanted = math.ceil(load / self.target_in_flight) if load else self.min_replicas
        self.desired = max(self.min_replicas, min(len(gw.upstreams), wanted))
        if self._pending_ready_at is not None and now_s >= self._pending_ready_at:
            self._pending_ready_at = None
            await gw.set_active(gw.upstreams[: self.ready + 1])
        if self.desired > self.ready and self._pending_ready_at is None:
            delay = self.startup_s + (self.lag.lag_s if self.lag is not None else 0.0)
            self._pending_ready_at = now_s + delay
        if self.desired < self.ready:
            self._below_since = self._below_since if self._below_since is not None else now_s
            if now_s - self._below_since >= self.cooldown_s:
                await gw.set_active(gw.upstreams[: self.ready - 1])
                self._below_since = None
        else:
            self._below_since = None
        g = self._gauges
        g[_DESIRED].labels(**self._hpa).set(self.desired)
        g[_CURRENT].labels(**self._hpa).set(self.ready + (self._pending_ready_at is not None))
        g[_SPEC].labels(**self._deployment).set(self.desired)  # the HPA writes spec.replicas
        g[_READY].labels(**self._deployment).set(self.ready)
