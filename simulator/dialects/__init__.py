"""Engine dialects: how a pod's ``/metrics`` looks (vLLM V1, vLLM legacy, SGLang, TRT-LLM).

Each dialect is a :class:`MetricsDialect` subclass registered in :data:`DIALECT_CLASSES`;
see ``simulator/README.md`` for how to add one.
"""

from __future__ import annotations

from pipeline.errors import ConfigError
from simulator.dialects._base import MetricsDialect, token_buckets
from simulator.dialects.sglang import SglangDialect
from simulator.dialects.trtllm import TrtllmDialect
from simulator.dialects.vllm import VllmDialect, VllmLegacyDialect

__all__ = ["DIALECT_CLASSES", "MetricsDialect", "make_dialect", "token_buckets"]

#: dialect name → class
DIALECT_CLASSES: dict[str, type[MetricsDialect]] = {
    "vllm": VllmDialect,
    "vllm-legacy": VllmLegacyDialect,
    "sglang": SglangDialect,
    "trtllm": TrtllmDialect,
}


def make_dialect(name: str, model: str, max_model_len: int, dp_size: int = 1) -> MetricsDialect:
    """A fresh dialect (with its own registry) for one pod.

    ``dp_size`` > 1 (DP ranks, ``dp_rank`` label) is modelled by the SGLang dialect only;
    raises :class:`ConfigError` for another dialect.
    """
    if dp_size > 1:
        if name != "sglang":
            raise ConfigError(f"engine.dp_size: DP ranks are modelled for sglang, not {name}")
        return SglangDialect(model, max_model_len, dp_size=dp_size)
    return DIALECT_CLASSES[name](model, max_model_len)
