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

from pydantic import Field

from slo.signals._serving import PoolThresholds, pool_baselines
from slo.signals._shift import ShiftTest, shifted
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
    jitter_min_shift_s: float = Field(
        default=0.01,
        ge=0,
        description=(
            "ITL jitter: the instance's median must also exceed the pool's by this much (s). "
            "A third of the example spec's 30-ms target: a pod at 6.7 ms beside a pool at "
            "4 ms is 1.7x and significant, and no user sees it"
        ),
    )


def _shifted(
    snap: Snapshot,
    cfg: LatencyThresholds,
    metric: str,
    signal: str,
    *,
    prompts: str | None = None,
    min_shift_s: float = 0.0,
) -> list[Finding]:
    """Serving instances (:func:`slo.signals._serving.pool_baselines`) whose ``metric`` sits above
    the rest of their pool's serving instances (:func:`slo.signals._shift.shifted`); none in a
    pool with fewer than ``pool_min_serving`` serving instances holding samples. With
    ``prompts`` (the latency key of each sample's prompt length) the values are compared at
    equal prompt length where every instance's lengths are known. ``min_shift_s``: the
    instance's raw median must also exceed the rest's by that much."""
    test = ShiftTest(cfg.slow_min_samples, cfg.slow_p_value, cfg.slow_median_ratio, min_shift_s)
    findings = []
    for baseline in pool_baselines(snap, cfg).values():
        serving = [i for i in baseline.serving if i in snap.latency]
        samples = {i: snap.latency[i][metric] for i in serving}
        if len(samples) < cfg.pool_min_serving:
            continue
        lengths = {i: snap.latency[i].get(prompts) for i in serving} if prompts else None
        for shift in shifted(samples, lengths, test):
            evidence = {
                "metric": metric,
                "median_s": shift.median_s,
                "pool_median_s": shift.pool_median_s,
                # at equal prompt length where basis says so, else of the raw values
                "median_ratio": shift.median_ratio,
                "prob_superiority": shift.prob_superiority,
                "p_value": shift.p_value,
                "n": shift.n,
                "pool_n": shift.pool_n,
                "left_out": dict(baseline.left_out),
            }
            findings.append(
                Finding.on_instance(snap, signal, shift.instance, "ticket", shift.basis, evidence)
            )
    return findings


def detect_slow_prefill(snap: Snapshot, cfg: LatencyThresholds) -> list[Finding]:
    """An instance's TTFT shifted above the rest of its pool at equal prompt length (ok tap
    records; raw TTFT where an engine reports no prompt tokens)."""
    return _shifted(snap, cfg, "ttft_s", "slow_prefill", prompts="ttft_prompt_tokens")


def detect_slow_decode(snap: Snapshot, cfg: LatencyThresholds) -> list[Finding]:
    """An instance's TPOT shifted above the rest of its pool (ok tap records)."""
    return _shifted(snap, cfg, "tpot_s", "slow_decode")


def detect_itl_jitter(snap: Snapshot, cfg: LatencyThresholds) -> list[Finding]:
    """An instance's per-request ITL jitter (p99 gap − median gap, requests with ≥ 10 token
    chunks) shifted above the rest of its pool: a stuttering stream, even when the mean
    TPOT barely moves (ok tap records)."""
    return _shifted(snap, cfg, "itl_jitter_s", "itl_jitter", min_shift_s=cfg.jitter_min_shift_s)
