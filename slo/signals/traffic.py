"""Detectors that compare traffic across a pool or ranks: hot instance (requests or tokens),
hot DP rank, retry storm, numeric anomaly."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from slo.signals._serving import PoolThresholds, by_pool, pool_baselines
from slo.signals.findings import Finding, gini
from slo.signals.snapshot import Series, Snapshot

__all__ = [
    "TrafficThresholds",
    "detect_hot_instance",
    "detect_hot_rank",
    "detect_numeric_anomaly",
    "detect_retry_storm",
]


class TrafficThresholds(PoolThresholds):
    """Thresholds of hot instance, hot DP rank, retry storm and numeric anomaly; the pool
    baseline's (:class:`~slo.signals._serving.ServingThresholds`) too.
    """

    hot_max_over_mean: float = Field(default=1.5, gt=1)
    hot_min_sigma: float = Field(
        default=3.0, gt=0, description="excess over the mean in Poisson standard deviations"
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
    hot_min_tokens: int = Field(
        default=5000, ge=1, description="tokens in a pool before a token share is judged"
    )
    hot_rank_min_tokens_per_s: float = Field(
        default=5.0, ge=0, description="mean rank throughput below which ranks are not compared"
    )


def _hot(
    counts: list[float], cfg: TrafficThresholds, minimum: float, unit: float = 1.0
) -> tuple[int, float, float] | None:
    """(index, max/mean, sigma) of an instance far above the mean and beyond Poisson noise.

    ``unit`` is E[X²]/E[X] of one arrival's size X (1 for request counts; tokens per request
    when counting tokens), so the noise is that of a compound Poisson count: σ = √(mean · unit).
    """
    if len(counts) < 2 or sum(counts) < minimum or sum(counts) <= 0:
        return None
    mean = sum(counts) / len(counts)
    top = int(np.argmax(counts))
    sigma = (counts[top] - mean) / max(mean * unit, 1.0) ** 0.5
    if counts[top] / mean >= cfg.hot_max_over_mean and sigma >= cfg.hot_min_sigma:
        return top, counts[top] / mean, sigma
    return None


def _hot_halves(
    earlier: list[float],
    recent: list[float],
    cfg: TrafficThresholds,
    minimum: float,
    unit: float = 1.0,
) -> tuple[int, list[float], list[float]] | None:
    """The instance hot in *both* halves of the lookback (each half holding ≥ ``minimum``),
    with max/mean and σ of each half."""
    first, second = _hot(earlier, cfg, minimum, unit), _hot(recent, cfg, minimum, unit)
    if first is None or second is None or first[0] != second[0]:
        return None
    return second[0], [first[1], second[1]], [first[2], second[2]]


def _tapped(snap: Snapshot, instance: str) -> bool:
    return "tap_in_flight" in snap.engine.get(instance, {})


def detect_hot_instance(snap: Snapshot, cfg: TrafficThresholds) -> list[Finding]:
    """Per pool, among its serving instances (:func:`slo.signals._serving.pool_baselines`; fewer
    than ``pool_min_serving`` of them: no verdict): one instance far above the mean share of
    requests or of tokens, in *both* halves of the lookback (a sustained skew, not a burst
    of a sampled count); with max/mean and Gini over the serving instances, and the
    instances left out with why. Basis ``request_share`` when requests show it, else
    ``token_share``."""
    findings = []
    for pool, baseline in pool_baselines(snap, cfg).items():
        # only instances a tap sees have a share; an engine with no tap in front is unknown,
        # not idle (a P/D pair or gateway tapped at the entry is not hot against its pods)
        instances = [i for i in baseline.serving if i in snap.requests or _tapped(snap, i)]
        if len(instances) < cfg.pool_min_serving:
            continue
        stats = [snap.requests.get(i) for i in instances]
        recent = [float(s.recent_records) if s else 0.0 for s in stats]
        earlier = [float(s.records - s.recent_records) if s else 0.0 for s in stats]
        tokens_recent = [float(s.recent_completion_tokens) if s else 0.0 for s in stats]
        tokens_earlier = [
            float(s.completion_tokens - s.recent_completion_tokens) if s else 0.0 for s in stats
        ]
        tokens = sum(tokens_recent) + sum(tokens_earlier)
        by_requests = _hot_halves(earlier, recent, cfg, cfg.hot_min_requests / 2)
        by_tokens = None
        if sum(recent) + sum(earlier) >= cfg.hot_min_requests / 2 and tokens > 0:
            # a token count is compound Poisson: var = rate · E[X²], so one "unit" is E[X²]/E[X]
            unit = sum(s.completion_tokens_sq for s in stats if s) / tokens
            by_tokens = _hot_halves(
                tokens_earlier, tokens_recent, cfg, cfg.hot_min_tokens / 2, unit
            )
        hot = by_requests or by_tokens
        if hot is None:
            continue
        counts = [a + b for a, b in zip(earlier, recent, strict=True)]
        token_counts = [a + b for a, b in zip(tokens_earlier, tokens_recent, strict=True)]
        evidence: dict[str, Any] = {
            "max_over_mean": hot[1],
            "sigma": hot[2],
            "gini": gini(counts),
            "token_gini": gini(token_counts),
            "requests": dict(zip(instances, counts, strict=True)),
            "tokens": dict(zip(instances, token_counts, strict=True)),
            "left_out": dict(baseline.left_out),
        }
        basis = "request_share" if by_requests is not None else "token_share"
        findings.append(
            Finding(
                snap.now_ms,
                "hot_instance",
                "instance",
                instances[hot[0]],
                pool,
                "ticket",
                basis,
                evidence,
            )
        )
    return findings


def _rank_rates(ranks: dict[str, dict[str, Series]], start_ms: int, end_ms: int) -> list[float]:
    """Tokens/s of each rank between ``start_ms`` and ``end_ms`` (resets as restarts)."""
    rates = []
    for signals in ranks.values():
        tokens = signals.get("generation_tokens")
        part = tokens.since(start_ms) if tokens is not None else None
        if part is not None:
            keep = part.ts_ms <= end_ms
            part = Series(part.ts_ms[keep], part.values[keep])
        if part is None or len(part) < 2:
            rates.append(0.0)
            continue
        rates.append(part.increase() / max((part.ts_ms[-1] - part.ts_ms[0]) / 1000, 1e-9))
    return rates


def detect_hot_rank(snap: Snapshot, cfg: TrafficThresholds) -> list[Finding]:
    """Within one instance, DP ranks (SGLang ``dp_rank``, vLLM ``engine``) whose token
    throughput is ≥ ``hot_max_over_mean`` × the ranks' mean in both halves of the lookback;
    the queue gauges (running + waiting per rank) are the evidence beside it."""
    findings = []
    for instance, ranks in sorted(snap.ranks.items()):
        names = sorted(ranks)
        # halves of what was observed (a rank seen for less than the lookback still counts)
        first = min(int(s.ts_ms[0]) for signals in ranks.values() for s in signals.values())
        mid = (first + snap.now_ms) // 2
        ordered = {n: ranks[n] for n in names}
        halves = [_rank_rates(ordered, 0, mid), _rank_rates(ordered, mid, snap.now_ms)]
        hot_sets: list[set[str]] = []
        for rates in halves:
            mean = float(np.mean(rates))
            if mean < cfg.hot_rank_min_tokens_per_s:
                hot_sets.append(set())
                continue
            hot_sets.append(
                {n for n, r in zip(names, rates, strict=True) if r / mean >= cfg.hot_max_over_mean}
            )
        hot = sorted(hot_sets[0] & hot_sets[1])
        if not hot:
            continue
        rates = halves[1]
        queue = {
            n: float(
                sum(ranks[n][g].values.mean() for g in ("running", "waiting") if g in ranks[n])
            )
            for n in names
        }
        evidence = {
            "hot_ranks": hot,
            "tokens_per_s": dict(zip(names, rates, strict=True)),
            "max_over_mean": max(rates) / float(np.mean(rates)),
            "queue_mean": queue,
            "gini": gini(rates),
        }
        findings.append(
            Finding.on_instance(snap, "hot_rank", instance, "ticket", "rank_throughput", evidence)
        )
    return findings


def detect_retry_storm(snap: Snapshot, cfg: TrafficThresholds) -> list[Finding]:
    """Per pool: retries amplifying the pool's load, driven by failures across the pool
    (attempts of the second half of the lookback, as the failure detectors count them).

    A retry is attributed to the instance whose attempt failed before it. When instances
    causing retries (their caused retries over ``retry_share`` of their own attempts) are at
    most ``pool_share`` of the pool, their retries are *their* evidence (not-ready, prefill
    failure), not a storm, and are left out; the pool is raised when the retries that remain
    (from failures spread over the pool, or of unknown cause) exceed ``retry_share`` of its
    attempts. Evidence: the shares, retries by causing instance, and the load amplification
    (attempts per first attempt).
    """
    findings = []
    for pool, instances in by_pool(snap).items():
        stats = {i: snap.failures[i] for i in instances if i in snap.failures}
        attempts = sum(s.attempts for s in stats.values())
        retries = sum(s.retries for s in stats.values())
        if attempts < cfg.retry_min_attempts or retries / attempts <= cfg.retry_share:
            continue
        caused = {i: s.retries_caused for i, s in stats.items() if s.retries_caused}
        causing = sorted(
            i for i, n in caused.items() if n / max(stats[i].attempts, 1) > cfg.retry_share
        )
        widespread = len(causing) / len(instances) > cfg.pool_share
        pooled = retries if widespread else retries - sum(caused[i] for i in causing)
        if pooled / attempts <= cfg.retry_share:
            continue
        evidence = {
            "retry_share": retries / attempts,
            "pooled_retry_share": pooled / attempts,
            "attempts": attempts,
            "retries": retries,
            "amplification": attempts / max(attempts - retries, 1),
            "retries_by_cause": caused,
            "unattributed_retries": retries - sum(caused.values()),
            "causing_instances": causing,
        }
        findings.append(
            Finding(
                snap.now_ms, "retry_storm", "pool", pool, pool, "ticket", "tap_attempts", evidence
            )
        )
    return findings


def _finished(snap: Snapshot, instance: str) -> float:
    return sum(
        series.increase()
        for name, series in snap.engine.get(instance, {}).items()
        if name.startswith("requests_finished:")
    )


def detect_numeric_anomaly(snap: Snapshot, cfg: TrafficThresholds) -> list[Finding]:
    """Corrupted outputs (never normal), or finish_reason=error bursting above its usual share."""
    findings = []
    for instance in sorted(set(snap.engine) | set(snap.requests)):
        corrupted = snap.series(instance, "corrupted_requests")
        errors = snap.series(instance, "requests_finished:error")
        stats = snap.requests.get(instance)
        evidence: dict[str, Any] = {
            "corrupted_requests": corrupted.increase() if corrupted is not None else 0.0,
            "engine_errors": errors.increase() if errors is not None else 0.0,
            "engine_finished": _finished(snap, instance),
            "tap_finish_reason_error": stats.finish_errors if stats else 0,
            "tap_records": stats.records if stats else 0,
        }
        burst = evidence["corrupted_requests"] >= cfg.numeric_min_events
        for bad, total in (
            ("engine_errors", "engine_finished"),
            ("tap_finish_reason_error", "tap_records"),
        ):
            count, of = evidence[bad], evidence[total]
            burst |= (
                count >= cfg.numeric_min_events and of > 0 and count / of >= cfg.numeric_error_share
            )
        if burst:
            findings.append(
                Finding.on_instance(
                    snap,
                    "numeric_anomaly",
                    instance,
                    "page",
                    "error_counters",
                    evidence,
                )
            )
    return findings
