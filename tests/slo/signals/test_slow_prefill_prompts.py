"""Slow prefill is judged at equal prompt length: a pod routed longer prompts than its
peers is not slow for doing more prefill work; a pod slower at the same prompts is."""

from __future__ import annotations

import numpy as np
import pytest

from slo.signals.detectors import DetectorConfig
from slo.signals.latency import detect_slow_prefill
from tests.slo.signals.test_pool_baseline import pod, pool

CFG = DetectorConfig()
#: A healthy engine's prefill: 50 ms of overhead and 0.2 ms per prompt token.
OVERHEAD_S, PER_TOKEN_S = 0.05, 0.0002


def _routed(prompts: dict[int, tuple[int, int]], slow: dict[int, float], *, known: bool = True):
    """Three serving pods, 60 ok requests each; pod i's prompts uniform in ``prompts[i]``
    tokens, its TTFT the healthy curve × ``slow.get(i, 1)`` with 10 % noise."""
    snap = pool(healthy=3, failing=0)
    rng = np.random.default_rng(3)
    for i, (low, high) in prompts.items():
        lengths = rng.integers(low, high, 60).astype(float)
        ttft = (OVERHEAD_S + PER_TOKEN_S * lengths) * slow.get(i, 1.0)
        snap.latency[pod(i)]["ttft_s"] = ttft * rng.lognormal(0, 0.1, 60)
        snap.latency[pod(i)]["ttft_prompt_tokens"] = lengths if known else np.full(60, -1.0)
    return snap


def test_a_pod_routed_longer_prompts_is_not_slow() -> None:
    # pod 0 takes the long documents (2-3k tokens), its peers chat (200-1,000): its TTFT is
    # three times theirs, at the same speed per token.
    snap = _routed({0: (2000, 3000), 1: (200, 1000), 2: (200, 1000)}, {})
    assert detect_slow_prefill(snap, CFG) == []


@pytest.mark.parametrize(
    "prompts",
    [
        {0: (200, 1000), 1: (200, 1000), 2: (200, 1000)},
        {0: (2000, 3000), 1: (200, 3000), 2: (200, 1000)},
    ],
    ids=["same prompts", "longer prompts too"],
)
def test_a_pod_slower_at_the_same_prompt_length_is_found(prompts: dict[int, tuple[int, int]]):
    snap = _routed(prompts, {0: 2.5})
    found = detect_slow_prefill(snap, CFG)
    assert [f.scope_id for f in found] == [pod(0)]
    assert found[0].basis == "mann_whitney_by_prompt_length"
    assert found[0].evidence["median_ratio"] > 2


def test_without_prompt_lengths_the_raw_ttft_is_compared() -> None:
    """An engine that reports no usage: no length to compare at, the raw shift decides."""
    snap = _routed({0: (200, 1000), 1: (200, 1000), 2: (200, 1000)}, {0: 2.5}, known=False)
    found = detect_slow_prefill(snap, CFG)
    assert [(f.scope_id, f.basis) for f in found] == [(pod(0), "mann_whitney")]
