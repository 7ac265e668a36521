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
    jitter_min_shift_s: float = Field(
        default=0.01,
        ge=0,
        description=(
            "ITL jitter: the instance's median must also exceed the pool's by this much (s). "
            "A third of the example spec's 30-ms target: a pod at 6.7 ms beside a pool at "
            "4 ms is 1.7x and significant, and no user sees it"
        ),
    )


#: Prompt-length bins of the pool's TTFT curve: its prompt-length deciles.
_PROMPT_BINS = 10


def _by_prompt_length(
    mine: np.ndarray, mine_prompts: np.ndarray, pool: np.ndarray, pool_prompts: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Both sides' TTFT as multiples of what the pool takes for a prompt of the same length,
    so an instance routed longer prompts than its peers (prefix-aware routing, a tenant's
    documents) is not called slow for doing more prefill work.

    The pool's curve is a line through its per-decile medians (prompt tokens, TTFT):
    prefill grows with the prompt, and the medians keep one slow peer from bending it; a
    line also carries the curve past the longest prompt the pool saw. ``None`` where a
    side's prompt lengths are unknown (an engine that reports no usage) or the pool's
    prompts are all of one length: the caller compares the raw values.
    """
    if (mine_prompts < 0).any() or (pool_prompts < 0).any() or np.ptp(pool_prompts) == 0:
        return None
    edges = np.quantile(pool_prompts, np.linspace(0, 1, _PROMPT_BINS + 1)[1:-1])
    bins = np.searchsorted(edges, pool_prompts)
    points = [
        (np.median(pool_prompts[bins == b]), np.median(pool[bins == b])) for b in np.unique(bins)
    ]
    xs, ys = np.array(points).T
    slope, intercept = np.polyfit(xs, ys, 1) if len(xs) > 1 else (0.0, float(ys[0]))
    if slope < 0:  # prompt length does not explain this pool's TTFT: one level for all
        slope, intercept = 0.0, float(np.median(pool))
    floor = 0.1 * float(np.median(pool))  # a queue-free short prompt still takes time
    if floor <= 0:
        return None

    def expected(prompts: np.ndarray) -> np.ndarray:
        return np.maximum(intercept + slope * prompts, floor)

    return mine / expected(mine_prompts), pool / expected(pool_prompts)


def _scaled(
    instance: str, samples: dict[str, np.ndarray], lengths: dict[str, np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray] | None:
    """``instance``'s and the rest's values at equal prompt length, or ``None`` where some
    instance's lengths are missing or do not pair with its values."""
    known = {i: p for i, p in lengths.items() if p is not None and len(p) == len(samples[i])}
    if not known or len(known) != len(samples):
        return None
    others = [i for i in samples if i != instance]
    return _by_prompt_length(
        samples[instance],
        known[instance],
        np.concatenate([samples[i] for i in others]),
        np.concatenate([known[i] for i in others]),
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
    the rest of their pool's serving instances; none in a pool with fewer than
    ``pool_min_serving`` serving instances holding samples. With ``prompts`` (the latency
    key of each sample's prompt length) the values are compared at equal prompt length
    (:func:`_by_prompt_length`) where every instance's lengths are known. ``min_shift_s``:
    the instance's raw median must also exceed the rest's by that much."""
    findings = []
    for baseline in pool_baselines(snap, cfg).values():
        serving = [i for i in baseline.serving if i in snap.latency]
        samples = {i: snap.latency[i][metric] for i in serving}
        lengths = {i: snap.latency[i].get(prompts) for i in serving} if prompts else {}
        if len(samples) < cfg.pool_min_serving:
            continue
        for instance, mine in samples.items():
            rest = [v for other, v in samples.items() if other != instance]
            if len(mine) < cfg.slow_min_samples or not rest:
                continue
            pool = np.concatenate(rest)
            if len(pool) < cfg.slow_min_samples:
                continue
            raw_medians = float(np.median(mine)), float(np.median(pool))
            if raw_medians[0] - raw_medians[1] < min_shift_s:
                continue
            scaled = _scaled(instance, samples, lengths)
            basis = "mann_whitney" if scaled is None else "mann_whitney_by_prompt_length"
            if scaled is not None:
                mine, pool = scaled
            mine_median, pool_median = float(np.median(mine)), float(np.median(pool))
            if pool_median <= 0 or mine_median / pool_median < cfg.slow_median_ratio:
                continue
            test = mannwhitneyu(mine, pool, alternative="greater")
            if test.pvalue >= cfg.slow_p_value:
                continue
            evidence = {
                "metric": metric,
                "median_s": raw_medians[0],
                "pool_median_s": raw_medians[1],
                # at equal prompt length where basis says so, else of the raw values
                "median_ratio": mine_median / pool_median,
                "prob_superiority": float(test.statistic) / (len(mine) * len(pool)),
                "p_value": float(test.pvalue),
                "n": len(mine),
                "pool_n": len(pool),
                "left_out": dict(baseline.left_out),
            }
            findings.append(Finding.on_instance(snap, signal, instance, "ticket", basis, evidence))
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
