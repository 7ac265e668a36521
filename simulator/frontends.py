"""What stands in front of the pods: the gateway + router (with its autoscaler) and the P/D
pair of a :class:`simulator.config.FleetConfig` (``gateway:``, ``pd:``).

One mechanism, started by the :class:`simulator.fleet.Fleet` and by nothing else: the fleet
owns the event loop these servers run on, the pods they route to and the fleet's
``file_sd``/``describe``, so one ``with Fleet(config)`` brings everything up in order
(pods, then the P/D pair, then the gateway, then the autoscaler over that gateway) and
takes it down again, and the fleet's ``file_sd`` lists the pods and their front ends
together. :class:`FrontEnds` is the fleet's part that holds them; reach it as
``fleet.front_ends`` (or ``fleet.gateway``, ``fleet.autoscaler``, ``fleet.pd``).

Their scrape targets are named like the pods (``gateway``, ``autoscaler``, ``pd``) and
labelled with the pool (model) they front; the gateway's carries its router's dialect. Their
faults (:data:`FRONT_END_FAULTS`) go through :meth:`simulator.fleet.Fleet.set_front_end_fault`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from pipeline.errors import ConfigError
from simulator.autoscaler import AUTOSCALER_FAULTS, Autoscaler, AutoscalerLagParams
from simulator.config import FleetConfig
from simulator.gateway import GATEWAY_FAULTS, Gateway
from simulator.pd import KvTransferTimeoutParams, PdPair
from simulator.pod import EnginePod

__all__ = ["FRONT_END_FAULTS", "FrontEnds", "validate_front_end_fault"]

#: Fault → the front end that takes it.
FRONT_END_FAULTS: dict[str, str] = {
    **dict.fromkeys(GATEWAY_FAULTS, "gateway"),
    **dict.fromkeys(AUTOSCALER_FAULTS, "autoscaler"),
    "kv_transfer_timeout": "pd",
}
_PARAMS: dict[str, type[BaseModel]] = {
    "kv_transfer_timeout": KvTransferTimeoutParams,
    "autoscaler_lag": AutoscalerLagParams,
}
#: InferencePool name of a gateway whose pods serve several models.
_MIXED_POOL = "default"


def validate_front_end_fault(fault: str, params: dict[str, Any]) -> None:
    """Check a front-end fault and its params without a fleet; raises ConfigError."""
    if fault not in FRONT_END_FAULTS:
        raise ConfigError(f"front-end fault: unknown {fault!r}; known: {list(FRONT_END_FAULTS)}")
    try:
        if fault in _PARAMS:
            _PARAMS[fault].model_validate(params)
        elif params:
            raise ValueError(f"takes no params, got {sorted(params)}")
    except ValueError as exc:
        raise ConfigError(f"{fault}: {exc}") from exc


class FrontEnds:
    """The gateway, autoscaler and P/D pair of ``config`` over ``pods`` (the fleet's, by
    name); each attribute is ``None`` when not configured. Started and stopped by the fleet
    on its loop."""

    def __init__(self, config: FleetConfig, pods: Sequence[EnginePod]) -> None:
        self.config = config
        self._pods = pods
        self.gateway: Gateway | None = None
        self.autoscaler: Autoscaler | None = None
        self.pd: PdPair | None = None

    def _pod(self, name: str) -> EnginePod:
        return next(p for p in self._pods if p.name == name)  # names validated by FleetConfig

    def _pool(self, pod_names: Sequence[str]) -> str:
        """The model these pods serve, '' when they serve several."""
        models = {self._pod(n).model for n in pod_names}
        return models.pop() if len(models) == 1 else ""

    def gateway_pods(self) -> list[str]:
        """Pod names behind the gateway (:meth:`FleetConfig.gateway_pods`)."""
        return self.config.gateway_pods()

    async def start(self) -> None:
        """Start what is configured, on the running loop; OSError if a port cannot be bound."""
        host, pd = self.config.host, self.config.pd
        if pd is not None:
            decode = self._pod(pd.decode)
            self.pd = PdPair(
                self._pod(pd.prefill).url,
                decode.url,
                host=host,
                model=decode.model,
                transfer_base_s=pd.transfer_base_s,
                transfer_per_block_s=pd.transfer_per_block_s,
                seed=self.config.seed,
            )
            await self.pd.start()
        spec = self.config.gateway
        if spec is None:
            return
        pods = self.gateway_pods()
        scaler = spec.autoscaler
        self.gateway = Gateway(
            [self._pod(n).url for n in pods],
            host=host,
            port=spec.port or 0,
            policy=spec.policy,
            router_down_policy=spec.router_down_policy,
            max_in_flight=spec.max_in_flight,
            max_queue=spec.max_queue,
            health_interval_s=spec.health_interval_s,
            replica_in_flight=scaler.replica_in_flight if scaler is not None else None,
            pool=spec.pool or self._pool(pods) or _MIXED_POOL,
            router_names=spec.router_names,
        )
        await self.gateway.start()
        if scaler is not None:
            self.autoscaler = Autoscaler(
                self.gateway,
                min_replicas=min(scaler.min_replicas, len(pods)),
                target_in_flight=scaler.target_in_flight,
                startup_s=scaler.startup_s,
                cooldown_s=scaler.cooldown_s,
                host=host,
            )
            await self.autoscaler.start()

    async def stop(self) -> None:
        """Stop what runs, the autoscaler before the gateway it scales."""
        for part in (self.autoscaler, self.gateway, self.pd):
            if part is not None:
                await part.stop()

    def _part(self, fault: str) -> Gateway | Autoscaler | PdPair:
        kind = FRONT_END_FAULTS.get(fault)
        if kind is None:
            raise ConfigError(
                f"front-end fault: unknown {fault!r}; known: {list(FRONT_END_FAULTS)}"
            )
        part: Gateway | Autoscaler | PdPair | None = getattr(self, kind)
        if part is None:
            raise ConfigError(f"{fault}: this fleet has no {kind}")
        return part

    async def set_fault(self, fault: str, params: dict[str, Any]) -> None:
        """Switch a front end's fault on; ConfigError for an unknown fault, a missing front
        end or bad params."""
        part = self._part(fault)
        if isinstance(part, Gateway):
            validate_front_end_fault(fault, params)
            await part.set_fault(fault)
        else:
            part.set_fault(fault, params)

    async def clear_fault(self, fault: str) -> bool:
        """Switch it off; returns whether it was on. ConfigError as :meth:`set_fault`."""
        part = self._part(fault)
        if isinstance(part, Gateway):
            return await part.clear_fault(fault)
        return bool(part.clear_fault(fault))

    def targets(self) -> list[tuple[str, str, str]]:
        """(name, base URL, pool) of every front end that serves ``/metrics``; pool '' when
        its pods serve several models."""
        out = []
        if self.gateway is not None:
            pool = self._pool(self.gateway_pods())
            out.append(("gateway", self.gateway.url, pool))
            if self.autoscaler is not None:
                out.append(("autoscaler", self.autoscaler.url, pool))
        if self.pd is not None and self.config.pd is not None:
            out.append(("pd", self.pd.url, self._pool([self.config.pd.decode])))
        return out

    def file_sd(self) -> list[dict[str, Any]]:
        """Prometheus file_sd groups of the front ends, named and labelled with their pool;
        the gateway's names its router's dialect (``epp``, or ``dynamo-frontend`` for
        Dynamo's names): a router serves no model to probe."""
        groups = []
        for name, url, pool in self.targets():
            labels = {"instance": name} | ({"pool": pool} if pool else {})
            if name == "gateway" and self.config.gateway is not None:
                names = self.config.gateway.router_names
                labels["dialect"] = "dynamo-frontend" if names == "dynamo" else "epp"
            groups.append({"targets": [url.removeprefix("http://")], "labels": labels})
        return groups

    def describe(self) -> dict[str, Any]:
        """``gateway``, ``autoscaler`` and ``pd`` as JSON-ready data (``None`` when absent)."""
        urls = {name: (url, pool) for name, url, pool in self.targets()}
        out: dict[str, Any] = {"gateway": None, "autoscaler": None, "pd": None}
        for name, (url, pool) in urls.items():
            out[name] = {
                "url": url,
                "metrics": f"{url}/metrics",
                "instance": name,
                "address": url.removeprefix("http://"),
                "pool": pool,
            }
        if self.gateway is not None:
            out["gateway"].update(
                policy=self.gateway.policy,
                router_down_policy=self.gateway.router_down_policy,
                pods=self.gateway_pods(),
            )
        if self.autoscaler is not None:
            out["autoscaler"].update(scales="gateway", min_replicas=self.autoscaler.min_replicas)
        if self.pd is not None and self.config.pd is not None:
            out["pd"].update(prefill=self.config.pd.prefill, decode=self.config.pd.decode)
        return out
