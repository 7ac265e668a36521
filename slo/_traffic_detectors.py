"""Detectors that compare traffic across a pool: hot instance, retry storm, numeric anomaly."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from slo.findings import DetectorConfig, Finding, gini
from slo.snapshot import Snapshot

__all__ = ["by_pool", "detect_hot_instance", "detect_numeric_anomaly", "detect_retry_storm"]


def by_pool(snap: Snapshot) -> dict[str, list[str]]:
    pools: dict[str, list[str]] = defaultdict(list)
    for instance in sorted(set(snap.requests) | set(snap.engine)):
        pools[snap.pools.get(instance, "")].append(instance)
    return pools


def _hot(counts: list[int], cfg: DetectorConfig) -> tuple[int, float, float] | None:
    """(index, max/mean, sigma) of an instance far above the mean and beyond Poisson noise."""
    if len(counts) < 2 or sum(counts) < cfg.hot_min_requests / 2:
        return None
    mean = sum(counts) / len(counts)
    top = int(np.argmax(counts))
    sigma = (counts[top] - mean) / max(mean, 1.0) ** 0.5
    if counts[top] / mean >= cfg.hot_max_over_mean and sigma >= cfg.hot_min_sigma:
        return top, counts[top] / mean, sigma
    return None


def detect_hot_instance(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """Per pool: one instance far above the mean share of requests, in *both* halves of the
    lookback (a sustained skew, not a burst of a sampled count); with max/mean and Gini."""
    findings = []
    for pool, instances in by_pool(snap).items():
        stats = [snap.requests.get(i) for i in instances]
        recent = [s.recent_records if s else 0 for s in stats]
        earlier = [(s.records - s.recent_records) if s else 0 for s in stats]
        first, second = _hot(earlier, cfg), _hot(recent, cfg)
        if first is None or second is None or first[0] != second[0]:
            continue
        counts = [a + b for a, b in zip(earlier, recent, strict=True)]
        findings.append(
            Finding(
                snap.now_ms,
                "hot_instance",
                "instance",
                instances[second[0]],
                pool,
                "ticket",
                "request_share",
                {
                    "max_over_mean": [first[1], second[1]],
                    "sigma": [first[2], second[2]],
                    "gini": gini(counts),
                    "requests": dict(zip(instances, counts, strict=True)),
                },
            )
        )
    return findings


def detect_retry_storm(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """Per pool: retried attempts as a share of all attempts above ``retry_share``."""
    findings = []
    for pool, instances in by_pool(snap).items():
        attempts = sum(snap.requests[i].records for i in instances if i in snap.requests)
        retries = sum(snap.requests[i].retries for i in instances if i in snap.requests)
        if attempts >= cfg.retry_min_attempts and retries / attempts > cfg.retry_share:
            findings.append(
                Finding(
                    snap.now_ms,
                    "retry_storm",
                    "pool",
                    pool,
                    pool,
                    "ticket",
                    "tap_attempts",
                    {"retry_share": retries / attempts, "attempts": attempts, "retries": retries},
                )
            )
    return findings


def _finished(snap: Snapshot, instance: str) -> float:
    return sum(
        series.increase()
        for name, series in snap.engine.get(instance, {}).items()
        if name.startswith("requests_finished:")
    )


def detect_numeric_anomaly(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
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
