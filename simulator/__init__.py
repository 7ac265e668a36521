"""The fleet simulator: engine pods and dcgm exporters speaking the real formats on loopback.

Owns: the continuous-batching engine model over a KV block pool (``engine``), the
service-time profiles fitted from Splitwise measurements (``perf``), the metric dialects
(``dialects``: vllm, vllm-legacy, sglang, trtllm), the OpenAI-compatible streaming API
(``openai``, ``pod``), dcgm-exporter endpoints (``dcgm``), the fault catalogue (``faults``),
scenario timelines (``scenario``), the load generator and trace readers (``load``,
``traces``) and the history generator (``history``).

Public API (others code against it)::

    from simulator import Fleet, FleetConfig, PodConfig, NodeConfig
    with Fleet(FleetConfig(nodes=[...], pods=[...], speed=1.0, seed=0)) as fleet:
        fleet.pods[0].url; fleet.dcgm[0].url
        fleet.set_fault("pod-0", "stall"); fleet.clear_fault("pod-0", "stall")
    # what stands in front of the pods, started by the fleet (simulator.frontends): a gateway +
    # router (faults gateway_down, router_down, stale_kv_index) with an optional autoscaler
    # (autoscaler_lag), and a prefill/decode pair (kv_transfer_timeout)
    gateway = GatewayConfig(router_down_policy="fail_close", autoscaler=AutoscalerConfig())
    with Fleet(FleetConfig(pods=[...], gateway=gateway, pd=PdConfig(prefill="a", decode="b"))) as fleet:
        fleet.gateway.url; fleet.autoscaler.url; fleet.pd.url
        fleet.set_front_end_fault("router_down"); fleet.clear_front_end_fault("router_down")
"""

from __future__ import annotations

from simulator.config import (
    DIALECTS,
    AutoscalerConfig,
    EngineConfig,
    FleetConfig,
    GatewayConfig,
    NodeConfig,
    PdConfig,
    PodConfig,
    load_fleet_config,
    simple_fleet,
)
from simulator.faults import FAULTS, FaultBoard, UnknownFaultError
from simulator.fleet import Fleet

__all__ = [
    "DIALECTS",
    "FAULTS",
    "AutoscalerConfig",
    "EngineConfig",
    "FaultBoard",
    "Fleet",
    "FleetConfig",
    "GatewayConfig",
    "NodeConfig",
    "PdConfig",
    "PodConfig",
    "UnknownFaultError",
    "load_fleet_config",
    "simple_fleet",
]
