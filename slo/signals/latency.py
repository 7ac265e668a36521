"""Detectors of one instance's latency shifted against the rest of its pool.

Slow prefill (TTFT), slow decode (TPOT) and ITL jitter (per request p99 gap − median gap,
the tap's ``itl_jitter_s``) are signals of their own, not only SLO burn: an
instance whose distribution sits above its pool's, by a one-sided Mann–Whitney U test
(scipy) *and* an effect size (median ratio and the probability of superiority U/(n·m)), with
a minimum number of tap records on each side. The pool is its serving instances only
(:mod:`slo.signals._serving`): a pod failing most requests, down, stalled or not ready is neither
judged nor part of the baseline.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field
from scipy.stats import mannwhitneyu

from slo.signals._serving import PoolThresholds, pool_baselines
from slo.signals.findings import Finding
from slo.signals.snapshot import Snapshot

__all__ = ["LatencyThresholds", "detect_itl_jitter", "detect_slow_decode", "detect_slow_prefill"]


class LatencyThresholds(PoolThresholds):
    """Thresholds of the latency shifts against the pool (slow prefill, slow decode, ITL
    jitter); the pool baseline's (:class:`~slo.signals._serving.ServingThresholds`) too.
    """

    slow_min_samples: int = Field(
        default=20, ge=5, description="requests per side a latency-shift test needs"
    )
    slow_p_value: float = Field(
        default=1e-3, gt=0, lt=1, description="one-sided Mann–Whitney p-value to call a shift"
    )
    slow_median_ratio: float = Field(
        default=1.5, gt=1, description="instance median / pool median that counts as slow"
    )


def _shifted(snap: Snapshot, cfg: LatencyThresholds, metric: str, signal: str) -> list[Finding]:
    """Serving instances (:func:`slo.signals._serving.pool_baselines`) whose ``metric`` sits above
    the rest of their pool's serving instances; none in a pool with fewer than
    ``pool_min_serving`` serving instances holding samples."""
    findings = []
    for baseline in pool_baselines(snap, cfg).values():
        samples = {i: snap.latency[i][metric] for i in baseline.serving if i in snap.latency}
        if len(samples) < cfg.pool_min_serving:
            continue
        for instance, mine in samples.items():
            rest = [v for other, v in samples.items() if other != instance]
            if len(mine) < cfg.slow_min_samples or not rest:
                continue
            pool = np.concatenate(rest)
            if len(pool) < cfg.slow_min_samples:
                continue
            mine_median, pool_median = float(np.median(mine)), float(np.median(pool))
            if pool_median <= 0 or mine_median / pool_median < cfg.slow_median_ratio:
                continue
            test = mannwhitneyu(mine, pool, alternative="greater")
            if test.pvalue >= cfg.slow_p_value:
                continue
            evidence = {
                "metric": metric,
                "median_s": mine_median,
                "pool_median_s": pool_median,
                "median_ratio": mine_median / pool_median,
                "prob_superiority": float(test.statistic) / (len(mine) * len(pool)),
                "p_value": float(test.pvalue),
                "n": len(mine),
                "pool_n": len(pool),
                "left_out": dict(baseline.left_out),
            }
            findings.append(
                Finding.on_instance(snap, signal, instance, "ticket", "mann_whitney", evidence)
            )
    return findings


def detect_slow_prefill(snap: Snapshot, cfg: LatencyThresholds) -> list[Finding]:
    """An instance's TTFT shifted above the rest of its pool (ok tap records)."""
    return _shifted(snap, cfg, "ttft_s", "slow_prefill")


def detect_slow_decode(snap: Snapshot, cfg: LatencyThresholds) -> list[Finding]:
    """An instance's TPOT shifted above the rest of its pool (ok tap records)."""
    return _shifted(snap, cfg, "tpot_s", "slow_decode")


def detect_itl_jitter(snap: Snapshot, cfg: LatencyThresholds) -> list[Finding]:
    """An instance's per-request ITL jitter (p99 gap − median gap, requests with ≥ 10 token
    chunks) shifted above the rest of its pool: a stuttering stream, even when the mean
    TPOT barely moves (ok tap records)."""
    return _shifted(snap, cfg, "itl_jitter_s", "itl_jitter")
