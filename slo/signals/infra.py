"""Detectors for the serving infrastructure around the engines (the matrix's last rows):
a P/D KV transfer that times out, a router KV-locality index gone stale, an autoscaler that
lags behind its load.

Each finding sits on the component that fails — the instance exporting the transfer
counters (the decode engine, or the simulator's P/D pair), the router, the
kube-state-metrics target — and carries the engines' side as evidence. Routers and
autoscalers join the engines of their pool; one whose pool is unlabelled (``''``) is taken
to front every engine of the snapshot.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, Field

from slo.signals.findings import CommonThresholds, Finding
from slo.signals.snapshot import AutoscalerSeries, Series, Snapshot

__all__ = [
    "InfraThresholds",
    "detect_autoscaler_lag",
    "detect_kv_index_stale",
    "detect_kv_transfer_timeout",
    "histogram_quantile",
]


def _namespace_slash_name(value: str) -> str:
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name or value != value.strip():
        raise ValueError(f"{value!r} is not namespace/name (an HPA's kube-state-metrics labels)")
    return value


class InfraThresholds(CommonThresholds):
    """Thresholds of the P/D KV transfer, the router's KV index and the autoscalers."""

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


def histogram_quantile(q: float, increases: dict[float, float]) -> float | None:
    """The ``q`` quantile of cumulative bucket increases (``le`` → count), interpolated
    linearly inside the bucket as Prometheus does; ``None`` without observations. A quantile
    in the ``+Inf`` bucket is the highest finite bound."""
    bounds = sorted(increases)
    if not bounds or increases[bounds[-1]] <= 0:
        return None
    rank = q * increases[bounds[-1]]
    lower_bound, lower_count = 0.0, 0.0
    for le in bounds:
        count = increases[le]
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


def _bucket_increases(
    snap: Snapshot, instance: str, signal: str, start_ms: int, end_ms: int | None = None
) -> dict[float, float]:
    buckets = snap.buckets.get(instance, {}).get(signal, {})
    return {le: series.increase(start_ms, end_ms) for le, series in buckets.items()}


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def detect_kv_transfer_timeout(snap: Snapshot, cfg: InfraThresholds) -> list[Finding]:
    """KV transfers failing or expiring (basis ``failed_transfers``, page), or their p99
    time shifted past ``kv_transfer_p99_s`` and ``kv_transfer_p99_ratio`` × the instance's
    own earlier p99 (``latency_shift``, ticket), over the last ``kv_transfer_window_s``.
    Evidence: failed, expired (the producer freed the blocks: cleanup completed), transfers,
    p99 now and before, leaked blocks and their growth (cleanup failed) where exported."""
    findings = []
    start = snap.ago_ms(cfg.kv_transfer_window_s)
    for instance, signals in snap.engine.items():
        has_buckets = "kv_transfer_time" in snap.buckets.get(instance, {})
        if "kv_transfer_failures" not in signals and not has_buckets:
            continue
        failed, expired = (
            s.increase(start) if (s := signals.get(name)) is not None else 0.0
            for name in ("kv_transfer_failures", "kv_transfer_expired")
        )
        recent = _bucket_increases(snap, instance, "kv_transfer_time", start)
        before = _bucket_increases(snap, instance, "kv_transfer_time", 0, start)
        p99, p99_before = histogram_quantile(0.99, recent), histogram_quantile(0.99, before)
        transfers = max(recent.values(), default=0.0)
        leaked = signals.get("kv_transfer_leaked_blocks")
        evidence: dict[str, Any] = {
            "failed_transfers": failed,
            "expired_requests": expired,
            "transfers": transfers,
            "p99_transfer_s": _rounded(p99),
            "p99_transfer_before_s": _rounded(p99_before),
            "window_s": cfg.kv_transfer_window_s,
        }
        if leaked is not None and len(leaked):
            evidence["leaked_blocks"] = leaked.last()
            recent_leaked = leaked.since(start)  # empty when the target stopped exporting it
            if len(recent_leaked):
                evidence["leaked_blocks_added"] = leaked.last() - float(recent_leaked.values[0])
        # One timed-out transfer can count on both sides (the decode's failed read and the
        # prefill's expired blocks): the larger count, not the sum, is the number of events.
        if max(failed, expired) >= cfg.kv_transfer_min_failures:
            basis, severity = "failed_transfers", "page"
        elif (
            p99 is not None
            and p99_before is not None
            and transfers >= cfg.kv_transfer_min_transfers
            and p99 >= cfg.kv_transfer_p99_s
            and p99 >= cfg.kv_transfer_p99_ratio * p99_before
        ):
            basis, severity = "latency_shift", "ticket"
        else:
            continue
        findings.append(
            Finding.on_instance(snap, "kv_transfer_timeout", instance, severity, basis, evidence)
        )
    return findings


def _fronted(snap: Snapshot, component: str) -> list[str]:
    """The engines a router / autoscaler in ``component``'s pool fronts (every engine when
    its pool is unlabelled), itself excluded."""
    pool = snap.pools.get(component, "")
    return sorted(
        i for i in snap.engine if i != component and (not pool or snap.pools.get(i, "") == pool)
    )


def _hit_ratio(
    snap: Snapshot, engines: list[str], start_ms: int, end_ms: int | None
) -> tuple[float | None, float]:
    hits, queries = (
        sum(
            s.increase(start_ms, end_ms) for i in engines if (s := snap.series(i, name)) is not None
        )
        for name in ("prefix_cache_hits", "prefix_cache_queries")
    )
    return (hits / queries if queries > 0 else None), queries


def _first_increase(series: Series) -> tuple[int, int] | None:
    """Timestamps (ms) of the last scrape before a counter first rose and of the scrape that
    saw it risen; ``None`` if it stayed flat."""
    risen = np.flatnonzero(np.diff(series.values) != 0)
    if not len(risen):
        return None
    return int(series.ts_ms[risen[0]]), int(series.ts_ms[risen[0] + 1])


def detect_kv_index_stale(snap: Snapshot, cfg: InfraThresholds) -> list[Finding]:
    """On a router: its locality hints were rejected (≥ ``kv_index_min_rejections`` since the
    first rejection of the lookback, the *onset*; a rejected hint is a returning prefix, so
    prompts still share prefixes) and the prefix-cache hit ratio of the engines it fronts
    over the last ``kv_index_window_s`` (from the onset at the earliest) fell by
    ≥ ``kv_index_drop`` against their ratio before the onset (basis ``hints_rejected``).

    A stale index rejects each known prefix's next hint once (that pod then caches it) and
    never learns new prefixes, so the rejections come as a burst and the ratio stays low:
    the finding holds while the onset is in the lookback. Evidence: rejections, lookups,
    ratio now and before, the onset, the engines."""
    findings = []
    for router, signals in snap.engine.items():
        rejected_series = signals.get("router_hints_rejected")
        if rejected_series is None or len(rejected_series) < 2:
            continue
        rise = _first_increase(rejected_series)
        if rise is None:
            continue
        before_rise, onset = rise
        rejected = rejected_series.increase(before_rise)  # the onset's own jump included
        if rejected < cfg.kv_index_min_rejections:
            continue
        engines = _fronted(snap, router)
        recent = max(onset, snap.ago_ms(cfg.kv_index_window_s))
        now, queried = _hit_ratio(snap, engines, recent, None)
        before, _ = _hit_ratio(snap, engines, 0, onset)
        if now is None or before is None or before < cfg.kv_index_min_baseline:
            continue
        if now > before * (1 - cfg.kv_index_drop):
            continue
        evidence = {
            "hints_rejected": rejected,
            "lookups": lookups.increase(recent)
            if (lookups := signals.get("router_prefix_lookups")) is not None
            else 0.0,
            "hit_ratio": round(now, 4),
            "hit_ratio_before": round(before, 4),
            "prompt_tokens_queried": queried,
            "onset_ts_ms": onset,
            "engines": engines,
            "window_s": cfg.kv_index_window_s,
        }
        findings.append(
            Finding.on_instance(
                snap, "kv_index_stale", router, "ticket", "hints_rejected", evidence
            )
        )
    return findings


def _behind_since(desired: Series, ready: Series) -> int | None:
    """Timestamp (ms) from which desired > ready at every shared scrape up to the last one;
    ``None`` when the last shared scrape is not behind."""
    shared, at_desired, at_ready = np.intersect1d(desired.ts_ms, ready.ts_ms, return_indices=True)
    if not len(shared):
        return None
    behind = desired.values[at_desired] > ready.values[at_ready]
    if not behind[-1]:
        return None
    caught_up = np.flatnonzero(~behind)
    first = int(caught_up[-1]) + 1 if len(caught_up) else 0
    return int(shared[first])


def _queue(snap: Snapshot, engines: list[str], component: str) -> Series | None:
    """The queue in front of the pool: the gateways' queues, else the engines' waiting,
    summed (from the time every contributing series has a value)."""
    pool = snap.pools.get(component, "")
    gateways = [
        s
        for i, sig in snap.gateways.items()
        if (s := sig.get("gateway_queue")) is not None and (not pool or snap.pools.get(i) == pool)
    ]
    parts = gateways or [s for i in engines if (s := snap.series(i, "waiting")) is not None]
    if not parts:
        return None
    # targets are scraped milliseconds apart: each part's latest value at every scrape time
    grid = np.unique(np.concatenate([p.ts_ms for p in parts]))
    grid = grid[grid >= max(int(p.ts_ms[0]) for p in parts)]
    total = np.zeros(len(grid))
    for part in parts:
        total += part.values[np.searchsorted(part.ts_ms, grid, side="right") - 1]
    return Series(grid, total)


def _lag(
    snap: Snapshot, cfg: InfraThresholds, scaler: AutoscalerSeries, scraped_ms: int
) -> dict[str, Any] | None:
    """How long ``scaler``'s desired replicas have been above its workload's ready ones,
    when at least ``autoscaler_lag_for_s`` (else ``None``). An HPA or workload missing from
    the target's last scrape (``scraped_ms``) was deleted or renamed: not judged."""
    if min(int(scaler.desired.ts_ms[-1]), int(scaler.ready.ts_ms[-1])) < scraped_ms:
        return None
    since = _behind_since(scaler.desired, scaler.ready)
    if since is None:
        return None  # caught up
    behind_s = (snap.now_ms - since) / 1000
    if behind_s < cfg.autoscaler_lag_for_s:
        return None
    return {
        "autoscaler": scaler.name,
        "deployment": scaler.deployment,
        "paired_by": scaler.paired_by,
        "desired": scaler.desired.last(),
        "ready": scaler.ready.last(),
        "current": _last(scaler.current),
        "max_replicas": _last(scaler.max_replicas),
        "deployment_spec_replicas": _last(scaler.spec_replicas),
        "behind_s": round(behind_s, 1),
        # Behind at every scrape we hold (a lag longer than the lookback): at least that long.
        "behind_s_is_at_least": since <= int(scaler.desired.ts_ms[0]),
        "since_ts_ms": since,
    }


def _last(series: Series | None) -> float | None:
    return None if series is None or not len(series) else series.last()


def detect_autoscaler_lag(snap: Snapshot, cfg: InfraThresholds) -> list[Finding]:
    """Per HPA of a kube-state-metrics target (``cfg.autoscalers`` when given, else all):
    its desired replicas above the ready replicas of the deployment it scales at every
    scrape for ≥ ``autoscaler_lag_for_s`` while the queue in front of the target's pool
    (gateway queue, else engines' waiting) grew by ≥ ``autoscaler_min_queue_growth``
    (basis ``queue_growth``, page). HPAs are never summed: an unrelated workload's
    replicas cannot hide or fake a lag.

    One finding per target, on the target: evidence names the HPA (``namespace/name``)
    that lags longest, its deployment and how they were paired, desired, ready, current,
    max replicas, how long behind, the queue at the start, now and at most; any other
    lagging HPA of the target is listed in ``also_lagging``."""
    findings = []
    chosen = set(cfg.autoscalers)
    for target, scalers in sorted(snap.autoscalers.items()):
        if not scalers.paired:
            continue
        scraped_ms = max(int(s.desired.ts_ms[-1]) for s in scalers.paired.values())
        lagging = [
            lag
            for name, scaler in sorted(scalers.paired.items())
            if (not chosen or name in chosen)
            and (lag := _lag(snap, cfg, scaler, scraped_ms)) is not None
        ]
        queue = _queue(snap, _fronted(snap, target), target) if lagging else None
        if queue is None:
            continue
        queued = [lag for lag in lagging if _queue_grew(queue, lag, cfg)]
        if not queued:
            continue
        queued.sort(key=lambda lag: -lag["behind_s"])
        evidence = {**queued[0], "lag_for_s": cfg.autoscaler_lag_for_s}
        if len(queued) > 1:
            keep = ("autoscaler", "deployment", "desired", "ready", "behind_s")
            evidence["also_lagging"] = [{k: lag[k] for k in keep} for lag in queued[1:]]
        findings.append(
            Finding.on_instance(snap, "autoscaler_lag", target, "page", "queue_growth", evidence)
        )
    return findings


def _queue_grew(queue: Series, lag: dict[str, Any], cfg: InfraThresholds) -> bool:
    """Whether the queue grew by ``autoscaler_min_queue_growth`` while ``lag`` held; adds
    the queue at its start, now and at most to ``lag``."""
    during = queue.since(lag.pop("since_ts_ms"))
    if len(during) < 2 or during.values.max() - during.values[0] < cfg.autoscaler_min_queue_growth:
        return False
    lag.update(
        queue_at_start=float(during.values[0]),
        queue_now=during.last(),
        queue_max=float(during.values.max()),
    )
    return True
