"""The fault catalogue: every fault a pod can be switched into, with validated parameters.

A fault is *data*: a name, a pydantic parameter model and the observable signal it is
documented to produce. The engine, the HTTP layer and the dcgm exporter read the active
set (:class:`FaultBoard`) and change behaviour; nothing else knows fault names.

To add a fault: add a params model and a :data:`FAULTS` row here, then read it where the
behaviour lives (``engine.py`` for scheduling, ``pod.py`` for HTTP, ``dcgm.py`` for GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from pipeline.config import STRICT
from pipeline.errors import ConfigError

__all__ = ["FAULTS", "FaultBoard", "FaultSpec", "UnknownFaultError", "validate_fault"]


class UnknownFaultError(ConfigError):
    """The fault name is not in the catalogue."""


class _Params(BaseModel):
    model_config = STRICT


class NoParams(_Params):
    pass


class StallParams(_Params):
    engine_active: float = Field(
        0.0, ge=0, le=1, description="GPU activity during the hang (0 idle, 1 spin)"
    )


class KvLeakParams(_Params):
    blocks_per_s: float = Field(
        50.0, gt=0, le=1e7, description="leaked KV blocks per simulated second"
    )
    max_fraction: float = Field(
        default=1.0, gt=0, le=1, description="stop leaking at this pool fraction"
    )


class FragmentationParams(_Params):
    """The free pool split into runs of at most ``largest_free_run`` blocks.

    The default, 32 blocks of 16 tokens, holds a 511-token prompt: about half of the
    drill's (exponential, mean 512) fit a run and are admitted past the longer ones, so the
    running batch keeps working while the queue of prompts that fit no run grows.
    """

    largest_free_run: int = Field(
        default=32, ge=0, description="largest contiguous free run (blocks)"
    )
    preempt_probability: float = Field(
        0.01, ge=0, le=1, description="per step, chance to preempt one"
    )


class PreemptionCascadeParams(_Params):
    reserve_fraction: float = Field(default=0.9, ge=0, le=1, description="pool fraction taken away")
    preempt_probability: float = Field(
        0.3, ge=0, le=1, description="per step, chance to preempt one"
    )


class FactorParams(_Params):
    factor: float = Field(default=5.0, ge=1, le=1000, description="service-time multiplier")


class JitterParams(_Params):
    mean_ms: float = Field(
        50.0, ge=0, le=60000, description="mean extra delay per step (exponential)"
    )


class FractionParams(_Params):
    fraction: float = Field(default=1.0, ge=0, le=1, description="share of requests affected")


class AfterTokensParams(_Params):
    fraction: float = Field(default=1.0, ge=0, le=1, description="share of requests affected")
    after_tokens: int = Field(default=1, ge=1, description="cut the stream after this many tokens")


class XidParams(_Params):
    code: int = Field(
        default=79, ge=0, le=1000, description="NVIDIA XID code (79 also hangs the engine)"
    )
    message: str | None = Field(
        default=None, max_length=256, description="err_msg label; default: NVIDIA's name"
    )


class HotRankParams(_Params):
    ranks: list[int] = Field(
        default=[0], min_length=1, max_length=64, description="DP ranks that run hot"
    )
    factor: float = Field(
        default=4.0, gt=1, le=100, description="their share of tokens and requests vs the rest"
    )


@dataclass(frozen=True)
class FaultSpec:
    """One catalogue row: parameter model and the documented observable signal."""

    name: str
    params: type[_Params]
    signal: str


FAULTS: dict[str, FaultSpec] = {
    spec.name: spec
    for spec in (
        FaultSpec("stall", StallParams, "running > 0, generation tokens flat, GPU activity drops"),
        FaultSpec(
            "wedge",
            NoParams,
            "running 0 and KV freed, waiting grows, generation tokens flat, /health 200",
        ),
        FaultSpec("kv_leak", KvLeakParams, "KV usage climbs through 0.90/0.95/0.99 without load"),
        FaultSpec(
            "fragmentation",
            FragmentationParams,
            "waiting grows while KV usage says there is room; preemptions; the running batch "
            "and tokens go on with the prompts that fit a run",
        ),
        FaultSpec(
            "preemption_cascade",
            PreemptionCascadeParams,
            "preemptions rise, KV > 0.9, waiting grows",
        ),
        FaultSpec("ghost", NoParams, "running stays up after clients disconnect, no abort counted"),
        FaultSpec("slow_prefill", FactorParams, "TTFT grows by the factor"),
        FaultSpec(
            "slow_decode",
            FactorParams,
            "ITL/TPOT grow by the factor on average, unevenly per step (jitter grows)",
        ),
        FaultSpec("itl_jitter", JitterParams, "ITL tail widens"),
        FaultSpec(
            "nan_burst", FractionParams, "finish_reason=error, corrupted_requests_total rises"
        ),
        FaultSpec("not_ready", NoParams, "/health 503, new requests 503"),
        FaultSpec("crash", NoParams, "port closed; counters reset when it comes back"),
        FaultSpec("xid", XidParams, "DCGM_FI_DEV_XID_ERRORS = code on the pod's GPUs"),
        FaultSpec(
            "hot_rank",
            HotRankParams,
            "SGLang pod with engine.dp_size > 1: the chosen dp_rank series carry factor× the "
            "tokens and running/queued requests of the others",
        ),
        FaultSpec("prefill_failure", FractionParams, "HTTP 500 before the first token"),
        FaultSpec("failure_after_first_token", AfterTokensParams, "stream cut without [DONE]"),
        FaultSpec("model_load_failure", NoParams, "never ready: /health 503 and 503 on requests"),
    )
}


def validate_fault(name: str, params: dict[str, Any] | None) -> BaseModel:
    """The validated parameters of fault ``name``.

    Raises :class:`UnknownFaultError` for an unknown name and :class:`ConfigError` naming
    the field for bad parameters.
    """
    spec = FAULTS.get(name)
    if spec is None:
        raise UnknownFaultError(f"fault: unknown {name[:64]!r}; known: {sorted(FAULTS)}")
    if params is not None and not isinstance(params, dict):
        raise ConfigError("params: must be an object")
    try:
        return spec.params.model_validate(params or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise ConfigError(f"params.{path}: {first['msg']}") from exc


class FaultBoard:
    """The faults active on one pod right now, with their parameters and start times.

    ``now_s`` is injected by the caller (simulated seconds), so leaks grow from when the
    fault was set.
    """

    def __init__(self) -> None:
        self._active: dict[str, tuple[Any, float]] = {}

    def set(self, name: str, params: dict[str, Any] | None, now_s: float) -> BaseModel:
        """Activate (or re-parameterise) ``name``; raises on unknown name or bad params."""
        validated = validate_fault(name, params)
        self._active[name] = (validated, now_s)
        return validated

    def clear(self, name: str) -> bool:
        """Deactivate ``name``; returns whether it was active."""
        return self._active.pop(name, None) is not None

    def get(self, name: str) -> Any | None:
        """The params of ``name`` when active, else None."""
        entry = self._active.get(name)
        return entry[0] if entry else None

    def since(self, name: str) -> float | None:
        """When ``name`` was set (simulated seconds), else None."""
        entry = self._active.get(name)
        return entry[1] if entry else None

    def __contains__(self, name: object) -> bool:
        return name in self._active

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``{name: params}`` of every active fault, for the admin endpoint."""
        return {name: params.model_dump() for name, (params, _) in sorted(self._active.items())}
