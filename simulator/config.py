"""Fleet configuration: nodes with GPUs, engine pods placed on them, engine knobs.

Validated once with pydantic at the boundary (YAML file or Python); a bad config raises
:class:`pipeline.errors.ConfigError` whose message names the field path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from pipeline.config import STRICT, FreePortOr, load_yaml
from pipeline.errors import ConfigError
from simulator.gateway_metrics import RouterNames
from simulator.perf import PROFILES

__all__ = [
    "DIALECTS",
    "AutoscalerConfig",
    "EngineConfig",
    "FleetConfig",
    "GatewayConfig",
    "NodeConfig",
    "PdConfig",
    "PodConfig",
    "load_fleet_config",
    "simple_fleet",
]

#: Engine dialects a pod may speak on ``/metrics``.
DIALECTS = ("vllm", "vllm-legacy", "sglang", "trtllm")

Dialect = Literal["vllm", "vllm-legacy", "sglang", "trtllm"]


class _Model(BaseModel):
    model_config = STRICT


class EngineConfig(_Model):
    """Continuous-batching engine knobs (vLLM names where they exist)."""

    num_gpu_blocks: int = Field(default=2048, ge=16, description="KV blocks in the pool")
    block_size: int = Field(default=16, ge=1, le=1024, description="tokens per KV block")
    max_num_seqs: int = Field(default=64, ge=1, description="max requests in the running batch")
    max_num_batched_tokens: int = Field(
        default=8192, ge=16, description="token budget of one engine step"
    )
    max_model_len: int = Field(default=32768, ge=16, description="max prompt + output tokens")
    chunked_prefill: bool = Field(
        default=True,
        description="split prefills into chunks that share a step with the running decodes "
        "(vLLM V1, SGLang and TRT-LLM do by default); False: whole prompts in their own pass",
    )
    prefill_chunk_tokens: int = Field(
        default=512,
        ge=16,
        description="chunked prefill: prompt tokens prefilled per step at most (the seeds' "
        "typical 512-token chunk), shared by every prefilling request",
    )
    profile: str = Field(
        default="llama2-70b/h100/tp8",
        description="service-time profile (simulator.perf). TP8 by default: with 512-token "
        "prefill chunks a step lasts ~57 ms against ~31 ms of decode, inside the seeds' 30 ms "
        "ITL-jitter target; on TP4 (~62 vs ~30 ms, as Splitwise measured) it is just outside",
    )
    mean_output_tokens: float = Field(
        200.0, gt=0, description="mean natural output length when ignore_eos is not set"
    )
    dp_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description="data-parallel ranks the metrics report (SGLang dp_rank); the ranks "
        "share this engine model and split its tokens and queue (evenly unless hot_rank)",
    )
    prefix_cache_prefixes: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="prompt prefixes (first 256 characters) this pod keeps cached, LRU: a "
        "request hits the prefix cache only when its prefix is held (what a locality router "
        "aims for); None: every request shares the pool's one system prompt, always cached",
    )
    prefix_cache_broken: bool = Field(
        default=False,
        description="the prefix cache never hits (a release that changed the prefix hash or "
        "cache key): queries are counted, hits stay at zero",
    )
    honours_include_usage: bool = Field(
        default=True,
        description="send the usage chunk when a stream asks for it with "
        "stream_options.include_usage; False models the engines and older versions that "
        "ignore the option and never send usage in a stream",
    )

    @model_validator(mode="after")
    def _known_profile(self) -> EngineConfig:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; known: {sorted(PROFILES)}")
        return self


class NodeConfig(_Model):
    """One GPU node; it gets one dcgm-exporter endpoint."""

    name: str = Field(min_length=1, max_length=128)
    gpus: int = Field(default=8, ge=1, le=64)
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    fb_total_mib: int = Field(default=81559, ge=1024)


class PodConfig(_Model):
    """One engine pod: dialect, served model, placement on a node's GPUs."""

    name: str = Field(min_length=1, max_length=128)
    dialect: Dialect = "vllm"
    model: str = Field(default="llama-3-8b", min_length=1, max_length=256)
    node: str | None = None
    gpus: list[int] = Field(default_factory=lambda: [0])
    namespace: str = "default"
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig.model_validate({}))
    port: FreePortOr | None = Field(
        default=None, description="fixed port; default (or 0) a free one"
    )


class AutoscalerConfig(_Model):
    """The gateway's autoscaler (:class:`simulator.autoscaler.Autoscaler`)."""

    min_replicas: int = Field(default=1, ge=1)
    target_in_flight: float = Field(default=4.0, gt=0, description="requests per replica")
    startup_s: float = Field(default=1.0, ge=0, description="a new replica's model load")
    cooldown_s: float = Field(default=30.0, ge=0)
    replica_in_flight: int = Field(
        default=4, ge=1, description="requests the gateway forwards per ready replica"
    )


class GatewayConfig(_Model):
    """A gateway with its router (:class:`simulator.gateway.Gateway`) in front of ``pods``:
    the entry point clients and ``llmslo probe`` call; its ``/metrics`` speak its router's
    names (``router_names``: the Inference Extension EPP's or llm-d-router's, collector dialect
    ``epp``; NVIDIA Dynamo's frontend, dialect ``dynamo-frontend``). With ``autoscaler`` the gateway's pods
    are scaled between ``min_replicas`` and all of them."""

    policy: Literal["round_robin", "least_in_flight", "prefix_locality"] = "round_robin"
    router_down_policy: Literal["fail_open", "fail_close", "reject"] = Field(
        default="fail_close",
        description="while the router is down: route blind (fail_open), 503 (fail_close), "
        "429 (reject)",
    )
    pods: list[str] | None = Field(
        default=None, description="pod names it routes to; default every pod not in the P/D pair"
    )
    max_in_flight: int = Field(default=64, ge=1, description="requests forwarded at once")
    max_queue: int = Field(default=64, ge=0, description="requests waiting; more get 429")
    health_interval_s: float = Field(default=1.0, gt=0, le=60, description="pod readiness checks")
    pool: str | None = Field(
        default=None,
        min_length=1,
        description="InferencePool name (inference_pool_* metrics) and the pool label of its "
        "scrape target; default the model its pods serve ('default' when they serve several)",
    )
    port: FreePortOr | None = Field(default=None, description="fixed port; default a free one")
    router_names: RouterNames = Field(
        default="inference-extension",
        description="the router's metric names: the Inference Extension EPP "
        "(inference-extension), llm-d-router's EPP with its deprecated twins (llm-d-router), "
        "or NVIDIA Dynamo's frontend (dynamo)",
    )
    autoscaler: AutoscalerConfig | None = Field(
        default=None, description="scale the gateway's pods (none by default: all serve)"
    )


class PdConfig(_Model):
    """A prefill/decode pair (:class:`simulator.pd.PdPair`) over two of the fleet's pods."""

    prefill: str = Field(min_length=1)
    decode: str = Field(min_length=1)
    transfer_base_s: float = Field(default=0.002, ge=0)
    transfer_per_block_s: float = Field(default=0.0002, ge=0)


class FleetConfig(_Model):
    """The whole simulated fleet.

    ``speed`` > 1 makes simulated service time run faster (service times are divided by
    it) so tests finish quickly; ``seed`` makes output lengths and jitter reproducible.
    """

    nodes: list[NodeConfig] = Field(default_factory=list)
    pods: list[PodConfig] = Field(default_factory=list)
    speed: float = Field(default=1.0, gt=0, le=10000)
    seed: int = 0
    host: str = "127.0.0.1"
    gateway: GatewayConfig | None = Field(
        default=None,
        description="a gateway + router (and its autoscaler) in front of the pods (none by default)",
    )
    pd: PdConfig | None = Field(
        default=None, description="a prefill/decode pair over two pods (none by default)"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_front_ends_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and "front_ends" in data:
            raise ValueError(
                "front_ends: no longer a key; write its gateway: (with autoscaler:) and pd: "
                "at the top level of the fleet config"
            )
        return data

    @model_validator(mode="after")
    def _placement(self) -> FleetConfig:
        nodes = {n.name: n for n in self.nodes}
        if len(nodes) != len(self.nodes):
            raise ValueError("node names must be unique")
        if len({p.name for p in self.pods}) != len(self.pods):
            raise ValueError("pod names must be unique")
        for pod in self.pods:
            if pod.node is None:
                continue
            node = nodes.get(pod.node)
            if node is None:
                raise ValueError(f"pod {pod.name!r} is on unknown node {pod.node!r}")
            bad = [g for g in pod.gpus if not 0 <= g < node.gpus]
            if bad:
                raise ValueError(f"pod {pod.name!r} uses GPUs {bad} that node {node.name!r} lacks")
        self._front_end_pods()
        return self

    def _front_end_pods(self) -> None:
        names = {p.name for p in self.pods}
        if self.pd is not None:
            unknown = [n for n in (self.pd.prefill, self.pd.decode) if n not in names]
            if unknown:
                raise ValueError(f"pd: unknown pods {unknown}")
            if self.pd.prefill == self.pd.decode:
                raise ValueError("pd: prefill and decode must be two pods")
        if self.gateway is not None:
            unknown = [n for n in self.gateway.pods or [] if n not in names]
            if unknown:
                raise ValueError(f"gateway.pods: unknown pods {unknown}")
            if not self.gateway_pods():
                raise ValueError("gateway: no pods to route to (every pod is in the P/D pair)")

    def gateway_pods(self) -> list[str]:
        """Pod names behind the gateway: as configured, else every pod not in the P/D pair."""
        if self.gateway is not None and self.gateway.pods:
            return list(self.gateway.pods)
        paired = {self.pd.prefill, self.pd.decode} if self.pd is not None else set()
        return [p.name for p in self.pods if p.name not in paired]


def _format_error(exc: ValidationError, prefix: str) -> str:
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{prefix}{path}: {err['msg']}")
    return "; ".join(parts)


def load_fleet_config(source: Path | str | dict[str, Any]) -> FleetConfig:
    """Validate a fleet config from a YAML file path or a dict.

    Raises :class:`ConfigError` naming every bad field path.
    """
    if isinstance(source, dict):
        data: Any = source
    else:
        try:
            data = load_yaml(Path(source).read_text(encoding="utf-8"), str(source))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{source}: cannot read fleet config: {exc}") from exc
    if isinstance(data, dict) and "simulator" in data and "pods" not in data:
        data = data["simulator"]
    if not isinstance(data, dict):
        raise ConfigError("fleet config: top level must be a mapping")
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc, "")) from exc


def simple_fleet(
    pods: int,
    dialects: list[str] | None = None,
    *,
    gpus_per_node: int = 8,
    model: str = "llama-3-8b",
    speed: float = 1.0,
    seed: int = 0,
    engine: EngineConfig | None = None,
) -> FleetConfig:
    """``pods`` pods, one GPU each, packed onto as many nodes as needed; dialects round-robin."""
    if pods < 0:
        raise ConfigError("pods: must be >= 0")
    names = dialects or ["vllm"]
    unknown = [d for d in names if d not in DIALECTS]
    if unknown:
        raise ConfigError(f"dialects: unknown {unknown}; known: {list(DIALECTS)}")
    node_count = max(1, -(-pods // gpus_per_node))
    nodes = [NodeConfig(name=f"node-{i}", gpus=gpus_per_node) for i in range(node_count)]
    pod_list = [
        PodConfig(
            name=f"pod-{i}",
            dialect=names[i % len(names)],
            model=model,
            node=f"node-{i // gpus_per_node}",
            gpus=[i % gpus_per_node],
            engine=engine or EngineConfig.model_validate({}),
        )
        for i in range(pods)
    ]
    return FleetConfig(nodes=nodes, pods=pod_list, speed=speed, seed=seed)
