"""What detectors return: :class:`Finding`, and the thresholds every family shares.

Shared by the detector modules and by the writers (``slo_findings``, ``/metrics``). Each
family's thresholds sit beside its detectors; :mod:`slo.signals.config` composes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from pipeline.config import STRICT
from slo.signals.snapshot import Series, Snapshot

__all__ = ["CommonThresholds", "Finding", "covers", "gini", "gpu_of"]


class CommonThresholds(BaseModel):
    """Thresholds several detector families read: the lookback, the GPU join, the pool rule.

    Each family's model (``EngineThresholds`` in :mod:`slo.signals.engine`, …) extends it;
    :class:`slo.signals.config.DetectorConfig` composes them all.
    """

    model_config = STRICT

    lookback_s: float = Field(default=600, gt=0, description="raw rows read per cycle")
    pool_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of a pool's instances with a signal that raises it on the pool",
    )
    gpu_pods: dict[str, str] = Field(
        default={}, description="dcgm pod label → engine instance, when they differ"
    )


@dataclass(frozen=True)
class Finding:
    """One active failure signature."""

    ts_ms: int
    signal: str
    scope: str  # instance | pool
    scope_id: str
    pool: str
    severity: str  # page | ticket | info
    basis: str  # what the finding rests on, e.g. block_stats or admission_signature
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.signal, self.scope, self.scope_id)

    @classmethod
    def on_instance(
        cls,
        snap: Snapshot,
        signal: str,
        instance: str,
        severity: str,
        basis: str,
        evidence: dict[str, Any],
    ) -> Finding:
        """A finding on ``instance`` as of the snapshot, in the instance's pool."""
        return cls(
            snap.now_ms,
            signal,
            "instance",
            instance,
            snap.pools.get(instance, ""),
            severity,
            basis,
            evidence,
        )


# a string: DetectorConfig composes the family modules, which import this one


def gini(values: Sequence[float]) -> float:
    """Gini coefficient of non-negative shares: 0 = even, → 1 = all on one."""
    x = np.sort(np.asarray(values, dtype=float))
    if len(x) == 0 or x.sum() == 0:
        return 0.0
    n = len(x)
    return float((2 * np.arange(1, n + 1) - n - 1).dot(x) / (n * x.sum()))


def gpu_of(snap: Snapshot, cfg: CommonThresholds, instance: str) -> dict[str, Series]:
    pods = [pod for pod, inst in cfg.gpu_pods.items() if inst == instance] + [instance]
    for pod in pods:
        if pod in snap.gpu:
            return snap.gpu[pod]
    return {}


def covers(series: Series | None, start_ms: int) -> bool:
    return series is not None and len(series) >= 2 and int(series.ts_ms[0]) <= start_ms
