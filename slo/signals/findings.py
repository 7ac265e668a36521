"""What detectors return and how they are tuned: :class:`Finding`, :class:`DetectorConfig`.

Shared by the detector modules and by the writers (``slo_findings``, ``/metrics``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, Field

from pipeline.config import STRICT
from slo.signals.snapshot import Series, Snapshot

__all__ = ["Detector", "DetectorConfig", "Finding", "covers", "gini", "gpu_of"]


def _namespace_slash_name(value: str) -> str:
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name or value != value.strip():
        raise ValueError(f"{value!r} is not namespace/name (an HPA's kube-state-metrics labels)")
    return value


class DetectorConfig(BaseModel):
    """Thresholds of every detector (seconds, fractions, counts)."""

    model_config = STRICT

    lookback_s: float = Field(default=600, gt=0, description="raw rows read per cycle")
    stall_for_s: float = Field(
        default=60, gt=0, description="running > 0 with flat tokens this long is a stall"
    )
    ghost_grace_s: float = Field(default=2, ge=0)
    ghost_min: int = Field(default=1, ge=1, description="ghost requests needed to report")
    preemptions_per_min: float = Field(default=5, gt=0)
    preemption_kv_usage: float = Field(default=0.85, gt=0, le=1)
    fragmentation_ratio: float = Field(
        default=0.25, gt=0, lt=1, description="1 − largest free run / free blocks"
    )
    fragmentation_for_s: float = Field(default=300, gt=0)
    fragmentation_room: float = Field(
        default=0.3, gt=0, lt=1, description="KV free ratio that counts as room"
    )
    hot_max_over_mean: float = Field(default=1.5, gt=1)
    hot_min_sigma: float = Field(
        default=3.0, gt=0, description="excess over the mean in Poisson standard deviations"
    )
    fragmentation_min_growth: float = Field(
        default=3.0,
        gt=0,
        description="waiting requests added over the window (admission signature)",
    )
    hot_min_requests: int = Field(default=100, ge=1)
    retry_share: float = Field(default=0.1, gt=0, lt=1)
    retry_min_attempts: int = Field(default=20, ge=1)
    numeric_error_share: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="finish_reason=error share of finished requests that is a burst",
    )
    numeric_min_events: int = Field(default=3, ge=1)
    queue_for_s: float = Field(default=120, gt=0)
    queue_min_waiting: float = Field(default=5, ge=0)
    queue_growth_per_min: float = Field(default=3, gt=0)
    oom_kv_usage: float = Field(default=0.99, gt=0, le=1)
    oom_fb_used: float = Field(
        default=0.98, gt=0, le=1, description="frame-buffer used share (FB is ~90 % pre-allocated)"
    )
    down_for_s: float = Field(
        default=10, gt=0, description="a target failing every scrape this long is down"
    )
    down_min_scrapes: int = Field(default=2, ge=1, description="failed scrapes in a row needed")
    restart_hold_s: float = Field(
        default=300, gt=0, description="how long a crash/restart stays reported after it"
    )
    not_ready_for_s: float = Field(
        default=20, gt=0, description="up but not ready this long is a not-ready worker"
    )
    slow_min_samples: int = Field(
        default=20, ge=5, description="requests per side a latency-shift test needs"
    )
    slow_p_value: float = Field(
        default=1e-3, gt=0, lt=1, description="one-sided Mann–Whitney p-value to call a shift"
    )
    slow_median_ratio: float = Field(
        default=1.5, gt=1, description="instance median / pool median that counts as slow"
    )
    hot_min_tokens: int = Field(
        default=5000, ge=1, description="tokens in a pool before a token share is judged"
    )
    hot_rank_min_tokens_per_s: float = Field(
        default=5.0, ge=0, description="mean rank throughput below which ranks are not compared"
    )
    pool_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of a pool's instances with a signal that raises it on the pool",
    )
    serving_min_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of an instance's answered attempts (client cancels aside) that must"
        " be served (ok, no finish_reason=error) for it to count in its pool's baseline",
    )
    pool_min_serving: int = Field(
        default=2,
        ge=2,
        description="serving instances a pool needs for any pool-relative verdict (hot "
        "instance, latency shift, failure share over the pool)",
    )
    entry_window_s: float = Field(
        default=60, gt=0, description="recent probes an entry point is judged on"
    )
    entry_min_failures: int = Field(default=2, ge=1, description="failed probes needed")
    entry_failure_share: float = Field(
        default=0.5, gt=0, le=1, description="failed share of recent probes that is an outage"
    )
    gateway_window_s: float = Field(
        default=60, gt=0, description="window over which gateway refusals are counted"
    )
    gateway_min_refusals: int = Field(
        default=3, ge=1, description="refusals of one kind in the window needed to report"
    )
    kv_transfer_window_s: float = Field(
        default=120, gt=0, description="recent window of the P/D KV-transfer counters"
    )
    kv_transfer_min_failures: int = Field(
        default=3,
        ge=1,
        description="failed (or expired, the larger) transfers in the window to report",
    )
    kv_transfer_p99_s: float = Field(
        default=1.0, gt=0, description="p99 transfer time, seconds, that counts as slow"
    )
    kv_transfer_p99_ratio: float = Field(
        default=3.0, gt=1, description="p99 now / p99 before that counts as a shift"
    )
    kv_transfer_min_transfers: int = Field(default=10, ge=1)
    kv_index_window_s: float = Field(
        default=120, gt=0, description="recent window of the engines' prefix-cache hit ratio"
    )
    kv_index_min_rejections: int = Field(
        default=3, ge=1, description="router hints rejected since the onset to report"
    )
    kv_index_drop: float = Field(
        default=0.3,
        gt=0,
        lt=1,
        description="relative fall of the prefix-cache hit ratio (token-weighted: a "
        "conversation's first turn always misses and long prompts hit only their prefix, so "
        "a stale index lowers it by a third to a half, not to zero)",
    )
    kv_index_min_baseline: float = Field(
        default=0.1, ge=0, lt=1, description="hit ratio before below which nothing can fall"
    )
    autoscaler_lag_for_s: float = Field(
        default=180,
        gt=0,
        description="desired > ready this long is a lag (longer than a pod's normal start-up)",
    )
    autoscaler_min_queue_growth: float = Field(
        default=3, ge=0, description="requests the queue in front of the pool grew by meanwhile"
    )
    autoscalers: list[Annotated[str, AfterValidator(_namespace_slash_name)]] = Field(
        default=[],
        description="HPAs autoscaler_lag judges, as namespace/name (kube-state-metrics "
        "labels); empty: every HPA a kube-state-metrics target exports",
    )
    gpu_pods: dict[str, str] = Field(
        default={}, description="dcgm pod label → engine instance, when they differ"
    )
    failure_min_count: int = Field(
        default=5, ge=1, description="failed attempts an instance needs before it is judged"
    )
    failure_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="share of an instance's attempts failing that is"
        " reported whatever its pool does",
    )
    failure_over_pool: float = Field(
        default=3.0, gt=1, description="instance failure share / rest of the pool's that counts"
    )
    failure_min_share: float = Field(
        default=0.02, gt=0, le=1, description="least failure share judged against the pool"
    )
    failure_p_value: float = Field(
        default=1e-3, gt=0, lt=1, description="one-sided binomial p-value against the pool"
    )
    failure_page_share: float = Field(
        default=0.25, gt=0, le=1, description="failure share from which a finding pages"
    )
    ghost_window_s: float = Field(
        default=60, gt=0, description="window of the running-vs-tap and disconnect comparison"
    )
    ghost_match_s: float = Field(
        default=15,
        gt=0,
        description="tap in-flight samples this close before and after an engine sample are"
        " matched with it (covers the scrape and the tap's gauge interval)",
    )
    ghost_unmatched_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of tap disconnects the engine never aborted that counts as ghosts",
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


Detector = Callable[[Snapshot, DetectorConfig], list[Finding]]


def gini(values: Sequence[float]) -> float:
    """Gini coefficient of non-negative shares: 0 = even, → 1 = all on one."""
    x = np.sort(np.asarray(values, dtype=float))
    if len(x) == 0 or x.sum() == 0:
        return 0.0
    n = len(x)
    return float((2 * np.arange(1, n + 1) - n - 1).dot(x) / (n * x.sum()))


def gpu_of(snap: Snapshot, cfg: DetectorConfig, instance: str) -> dict[str, Series]:
    pods = [pod for pod, inst in cfg.gpu_pods.items() if inst == instance] + [instance]
    for pod in pods:
        if pod in snap.gpu:
            return snap.gpu[pod]
    return {}


def covers(series: Series | None, start_ms: int) -> bool:
    return series is not None and len(series) >= 2 and int(series.ts_ms[0]) <= start_ms
