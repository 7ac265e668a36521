"""Engine dialects: how a pod's ``/metrics`` looks (vLLM V1, vLLM legacy, SGLang, TRT-LLM).

Each dialect is a :class:`MetricsDialect` subclass registered in :data:`DIALECT_CLASSES`;
see ``simulator/README.md`` for how to add one.
"""

from __future__ import annotations

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


def make_dialect(name: str, model: str, max_model_len: int) -> MetricsDialect:
    """A fresh dialect (with its own registry) for one pod."""
    return DIALECT_CLASSES[name](model, max_model_len)
