"""What stands in front of a running fleet's pods: a gateway (with an autoscaler) and a P/D
pair, started on the fleet's event loop from :class:`simulator.config.FrontEndsConfig`.

``with FrontEnds(fleet, config) as fronts:`` starts them and stops them again;
:meth:`FrontEnds.describe` gives their URLs (what ``llmslo sim`` prints) and
:meth:`FrontEnds.file_sd` their scrape targets, named like the pods
(``gateway``, ``autoscaler``, ``pd``) and labelled with the pool (model) they front.
Their faults (:data:`FRONT_END_FAULTS`) go through :meth:`FrontEnds.set_fault`.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from pydantic import BaseModel

from pipeline.errors import ConfigError
from simulator.autoscaler import Autoscaler, AutoscalerLagParams
from simulator.config import FrontEndsConfig
from simulator.fleet import Fleet
from simulator.gateway import Gateway
from simulator.pd import KvTransferTimeoutParams, PdPair

__all__ = ["FRONT_END_FAULTS", "FrontEnds", "validate_front_end_fault"]

#: Fault → the front end that takes it.
FRONT_END_FAULTS = {
    "stale_kv_index": "gateway",
    "autoscaler_lag": "autoscaler",
    "kv_transfer_timeout": "pd",
}


def validate_front_end_fault(fault: str, params: dict[str, Any]) -> None:
    """Check a front-end fault and its params without a fleet; raises ConfigError."""
    if fault not in FRONT_END_FAULTS:
        raise ConfigError(f"front-end fault: unknown {fault!r}; known: {list(FRONT_END_FAULTS)}")
    model: dict[str, type[BaseModel]] = {
        "kv_transfer_timeout": KvTransferTimeoutParams,
        "autoscaler_lag": AutoscalerLagParams,
    }
    try:
        if fault in model:
            model[fault].model_validate(params)
        elif params:
            raise ValueError(f"takes no params, got {sorted(params)}")
    except ValueError as exc:
        raise ConfigError(f"{fault}: {exc}") from exc


class FrontEnds:
    """The gateway, autoscaler and P/D pair of ``config`` over ``fleet`` (context manager);
    each attribute is ``None`` when not configured."""

    def __init__(self, fleet: Fleet, config: FrontEndsConfig | None = None) -> None:
        self.fleet = fleet
        self.config = config if config is not None else fleet.config.front_ends
        self.gateway: Gateway | None = None
        self.autoscaler: Autoscaler | None = None
        self.pd: PdPair | None = None

    def __enter__(self) -> FrontEnds:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _pool(self, pod_names: list[str]) -> str:
        models = {self.fleet.pod(n).model for n in pod_names}
        return models.pop() if len(models) == 1 else ""

    def gateway_pods(self) -> list[str]:
        """Pod names behind the gateway: as configured, else every pod not in the P/D pair."""
        spec, pd = self.config.gateway, self.config.pd
        if spec is not None and spec.pods:
            return list(spec.pods)
        paired = {pd.prefill, pd.decode} if pd is not None else set()
        return [p.name for p in self.fleet.pods if p.name not in paired]

    def start(self) -> None:
        """Start what is configured; raises ConfigError when the gateway has no pods."""
        spec, pd = self.config.gateway, self.config.pd
        if pd is not None:
            prefill, decode = self.fleet.pod(pd.prefill), self.fleet.pod(pd.decode)
            self.pd = PdPair(
                prefill.url,
                decode.url,
                model=decode.model,
                transfer_base_s=pd.transfer_base_s,
                transfer_per_block_s=pd.transfer_per_block_s,
                seed=self.fleet.config.seed,
            )
            self.fleet.call(self.pd.start())
        if spec is None:
            return
        pods = self.gateway_pods()
        if not pods:
            raise ConfigError("front_ends.gateway: no pods to route to")
        scaler = spec.autoscaler
        self.gateway = Gateway(
            [self.fleet.pod(n).url for n in pods],
            policy=spec.policy,
            max_in_flight=spec.max_in_flight,
            max_queue=spec.max_queue,
            replica_in_flight=scaler.replica_in_flight if scaler is not None else None,
        )
        self.fleet.call(self.gateway.start())
        if scaler is not None:
            self.autoscaler = Autoscaler(
                self.gateway,
                min_replicas=min(scaler.min_replicas, len(pods)),
                target_in_flight=scaler.target_in_flight,
                startup_s=scaler.startup_s,
                cooldown_s=scaler.cooldown_s,
            )
            self.fleet.call(self.autoscaler.start())

    def stop(self) -> None:
        for part in (self.autoscaler, self.gateway, self.pd):
            if part is not None:
                self.fleet.call(part.stop())

    def _target(self, fault: str) -> Any:
        kind = FRONT_END_FAULTS.get(fault)
        if kind is None:
            raise ConfigError(
                f"front-end fault: unknown {fault!r}; known: {list(FRONT_END_FAULTS)}"
            )
        part = getattr(self, kind)
        if part is None:
            raise ConfigError(f"{fault}: this fleet has no {kind}")
        return part

    def set_fault(self, fault: str, **params: Any) -> None:
        """Switch a front end's fault on; ConfigError for an unknown fault, a missing front
        end or bad params."""
        part = self._target(fault)
        if isinstance(part, Gateway):
            self.fleet.call(part.set_fault(fault))
        else:
            part.set_fault(fault, params)

    def clear_fault(self, fault: str) -> bool:
        """Switch it off; returns whether it was on."""
        part = self._target(fault)
        if isinstance(part, Gateway):
            return self.fleet.call(part.clear_fault(fault))
        return bool(part.clear_fault(fault))

    def targets(self) -> list[tuple[str, str, str]]:
        """(name, base URL, pool) of every front end that serves ``/metrics``."""
        out = []
        if self.gateway is not None:
            out.append(("gateway", self.gateway.url, self._pool(self.gateway_pods())))
        if self.autoscaler is not None:
            out.append(("autoscaler", self.autoscaler.url, self._pool(self.gateway_pods())))
        if self.pd is not None and self.config.pd is not None:
            out.append(("pd", self.pd.url, self._pool([self.config.pd.decode])))
        return out

    def file_sd(self) -> list[dict[str, Any]]:
        """Prometheus file_sd groups of the front ends, named and labelled with their pool."""
        return [
            {"targets": [url.removeprefix("http://")], "labels": {"instance": name, "pool": pool}}
            for name, url, pool in self.targets()
        ]

    def describe(self) -> dict[str, Any]:
        """Front-end endpoints as JSON-ready data (what ``llmslo sim`` prints beside the pods)."""
        out: dict[str, Any] = {
            name: {"url": url, "pool": pool} for name, url, pool in self.targets()
        }
        if self.gateway is not None:
            out["gateway"].update(policy=self.gateway.policy, pods=self.gateway_pods())
        if self.pd is not None and self.config.pd is not None:
            out["pd"].update(prefill=self.config.pd.prefill, decode=self.config.pd.decode)
        return out
