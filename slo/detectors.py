"""Failure-signature detectors (DESIGN §3): each reads a :class:`Snapshot`, returns findings.

Every finding names its signal, scope (instance or pool), severity, the *basis* it rests
on and the evidence (numbers and thresholds) so an on-call engineer can check it.
Detectors are data in :data:`DETECTORS`: adding a signal is writing one function and one
row there (see ``slo/README.md``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slo.snapshot import Series, Snapshot

__all__ = ["DETECTORS", "DetectorConfig", "Finding", "detect_all", "gini", "pool_findings"]


class DetectorConfig(BaseModel):
    """Thresholds of every detector (seconds, fractions, counts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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


Detector = Callable[[Snapshot, DetectorConfig], list[Finding]]


def gini(values: Sequence[float]) -> float:
    """Gini coefficient of non-negative shares: 0 = even, → 1 = all on one."""
    x = np.sort(np.asarray(values, dtype=float))
    if len(x) == 0 or x.sum() == 0:
        return 0.0
    n = len(x)
    return float((2 * np.arange(1, n + 1) - n - 1).dot(x) / (n * x.sum()))


def _gpu_of(snap: Snapshot, cfg: DetectorConfig, instance: str) -> dict[str, Series]:
    pods = [pod for pod, inst in cfg.gpu_pods.items() if inst == instance] + [instance]
    for pod in pods:
        if pod in snap.gpu:
            return snap.gpu[pod]
    return {}


def _covers(series: Series | None, start_ms: int) -> bool:
    return series is not None and len(series) >= 2 and int(series.ts_ms[0]) <= start_ms


def _stall_basis(
    snap: Snapshot, instance: str, running: Series, start: int, cfg: DetectorConfig
) -> tuple[str | None, dict[str, Any]]:
    """Why tokens count as stopped (``None``: they did not), and the first evidence."""
    tokens = snap.series(instance, "generation_tokens")
    unchanged = snap.series(instance, "gauges_unchanged_s")
    gauges = (running, snap.series(instance, "waiting"), snap.series(instance, "kv_usage"))
    frozen = all(s is None or np.ptp(s.since(start).values) == 0 for s in gauges)
    tokens_flat = None
    if tokens is not None and _covers(tokens, start):
        tokens_flat = tokens.since(start).increase() == 0
    unchanged_s = unchanged.last() if unchanged is not None and len(unchanged) else None
    if unchanged_s is not None and unchanged_s >= cfg.stall_for_s:
        # the collector's frozen-gauge clock (SGLang's hung scheduler); tokens must agree
        basis = "gauge_unchanged" if tokens_flat is not False else None
    elif tokens_flat is not None:
        basis = "generation_tokens_flat" if tokens_flat else None
    else:
        basis = "gauge_unchanged" if frozen else None
    evidence = {
        "running_min": float(running.values.min()),
        "stall_for_s": cfg.stall_for_s,
        "gauges_unchanged": frozen,
        "gauges_unchanged_s": unchanged_s,
    }
    return basis, evidence


def detect_stall(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """running > 0 and no generated token for ≥ stall_for (gauges frozen counts as flat)."""
    findings = []
    start = snap.now_ms - int(cfg.stall_for_s * 1000)
    for instance in snap.engine:
        full = snap.series(instance, "running")
        if full is None or not _covers(full, start):
            continue
        running = full.since(start)
        if len(running) < 2 or running.values.min() <= 0:
            continue
        basis, evidence = _stall_basis(snap, instance, running, start, cfg)
        if basis is None:
            continue
        gpu = _gpu_of(snap, cfg, instance)
        for name in ("engine_active", "gpu_util"):
            if name in gpu and len(gpu[name].since(start)):
                evidence[f"gpu_{name}_mean"] = float(gpu[name].since(start).values.mean())
        in_flight = snap.series(instance, "tap_in_flight")
        stats = snap.requests.get(instance)
        if in_flight is not None and len(in_flight.since(start)):
            last_token = stats.last_token_ts_ms if stats else None
            evidence["tap_in_flight"] = in_flight.last()
            evidence["tap_streams_silent"] = in_flight.last() > 0 and (
                last_token is None or last_token < start
            )
        findings.append(
            Finding(
                snap.now_ms,
                "stall",
                "instance",
                instance,
                snap.pools.get(instance, ""),
                "page",
                basis,
                evidence,
            )
        )
    return findings


def detect_ghosts(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """Engine keeps requests the tap has let go: running > tap in-flight, unmatched disconnects."""
    findings = []
    for instance in snap.engine:
        evidence: dict[str, Any] = {}
        count = 0
        running, in_flight = (
            snap.series(instance, "running"),
            snap.series(instance, "tap_in_flight"),
        )
        if running is not None and in_flight is not None:
            common, ri, ti = np.intersect1d(running.ts_ms, in_flight.ts_ms, return_indices=True)
            excess = running.values[ri] - in_flight.values[ti]
            # persistent: over at the last two common scrapes, at least ghost_grace apart
            if len(common) >= 2 and common[-1] - common[-2] >= cfg.ghost_grace_s * 1000:
                persistent = float(min(excess[-1], excess[-2]))
                if persistent >= cfg.ghost_min:
                    count = max(count, int(persistent))
                    evidence["running_over_tap_in_flight"] = persistent
        disconnects = snap.series(instance, "tap_disconnects")
        if disconnects is not None and len(disconnects) >= 2:
            aborts = sum(
                s.since(int(disconnects.ts_ms[0])).increase()
                for name in ("requests_finished:abort", "requests_aborted")
                if (s := snap.series(instance, name)) is not None
            )
            unmatched = disconnects.increase() - aborts
            evidence.update(tap_disconnects=disconnects.increase(), engine_aborts=aborts)
            if unmatched >= cfg.ghost_min and count:
                count = max(count, int(unmatched))
        stats = snap.requests.get(instance)
        if stats and stats.tokens_after_disconnect > 0:
            evidence["tokens_after_disconnect"] = stats.tokens_after_disconnect
            count = max(count, stats.late_upstream_close, 1)
        if count >= cfg.ghost_min:
            evidence["ghosts"] = count
            findings.append(
                Finding(
                    snap.now_ms,
                    "ghost_requests",
                    "instance",
                    instance,
                    snap.pools.get(instance, ""),
                    "ticket",
                    "tap_vs_engine",
                    evidence,
                )
            )
    return findings


def detect_preemption_cascade(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """Preemption rate over threshold while KV usage is high and waiting grows."""
    findings = []
    start = snap.now_ms - 120_000
    for instance in snap.engine:
        pre, kv, waiting = (
            snap.series(instance, s) for s in ("preemptions", "kv_usage", "waiting")
        )
        if pre is None or kv is None or waiting is None:
            continue
        recent = pre.since(start)
        if len(recent) < 2:
            continue
        minutes = (recent.ts_ms[-1] - recent.ts_ms[0]) / 60_000
        rate = recent.increase() / minutes if minutes > 0 else 0.0
        w = waiting.since(start).values
        kv_max = float(kv.since(start).values.max()) if len(kv.since(start)) else 0.0
        if (
            rate > cfg.preemptions_per_min
            and kv_max >= cfg.preemption_kv_usage
            and len(w) >= 2
            and w[-1] > w[0]
        ):
            findings.append(
                Finding(
                    snap.now_ms,
                    "preemption_cascade",
                    "instance",
                    instance,
                    snap.pools.get(instance, ""),
                    "ticket",
                    "engine_counters",
                    {
                        "preemptions_per_min": rate,
                        "kv_usage_max": kv_max,
                        "waiting_first": float(w[0]),
                        "waiting_last": float(w[-1]),
                    },
                )
            )
    return findings


def detect_fragmentation(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """From block stats when present, else the admission signature (waiting grows with room)."""
    findings = []
    start = snap.now_ms - int(cfg.fragmentation_for_s * 1000)
    for instance in snap.engine:
        free, run = (
            snap.series(instance, "kv_free_blocks"),
            snap.series(instance, "kv_largest_free_run"),
        )
        pool = snap.pools.get(instance, "")
        if _covers(free, start) and run is not None and free is not None:
            f, r = free.since(start), run.since(start)
            common, fi, ri = np.intersect1d(f.ts_ms, r.ts_ms, return_indices=True)
            ratio = 1 - r.values[ri] / np.maximum(f.values[fi], 1)
            if len(common) >= 2 and ratio.min() > cfg.fragmentation_ratio:
                findings.append(
                    Finding(
                        snap.now_ms,
                        "fragmentation",
                        "instance",
                        instance,
                        pool,
                        "ticket",
                        "block_stats",
                        {
                            "external_fragmentation_min": float(ratio.min()),
                            "threshold": cfg.fragmentation_ratio,
                            "for_s": cfg.fragmentation_for_s,
                        },
                    )
                )
            continue
        kv, waiting, pre = (
            snap.series(instance, s) for s in ("kv_usage", "waiting", "preemptions")
        )
        if not _covers(waiting, start) or kv is None or waiting is None:
            continue
        w, k = waiting.since(start).values, kv.since(start).values
        preempted = pre.since(start).increase() if pre is not None else 0.0
        room = float(1 - k.max()) if len(k) else 0.0
        # admission stalls: the queue only grows (never drains) while KV has room
        growing = (
            len(w) >= 3
            and bool(np.all(np.diff(w) >= 0))
            and w[-1] - w[0] >= cfg.fragmentation_min_growth
        )
        if growing and w.min() > 0 and room >= cfg.fragmentation_room:
            findings.append(
                Finding(
                    snap.now_ms,
                    "fragmentation",
                    "instance",
                    instance,
                    pool,
                    "ticket",
                    "admission_signature",
                    {
                        "waiting_first": float(w[0]),
                        "waiting_last": float(w[-1]),
                        "kv_free_ratio_min": room,
                        "preemptions": preempted,
                    },
                )
            )
    return findings


def _by_pool(snap: Snapshot) -> dict[str, list[str]]:
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
    for pool, instances in _by_pool(snap).items():
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
    for pool, instances in _by_pool(snap).items():
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
                Finding(
                    snap.now_ms,
                    "numeric_anomaly",
                    "instance",
                    instance,
                    snap.pools.get(instance, ""),
                    "page",
                    "error_counters",
                    evidence,
                )
            )
    return findings


def detect_queue_growth(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """Waiting requests rising steadily for ``queue_for_s``."""
    findings = []
    start = snap.now_ms - int(cfg.queue_for_s * 1000)
    for instance in snap.engine:
        waiting = snap.series(instance, "waiting")
        if not _covers(waiting, start) or waiting is None:
            continue
        w = waiting.since(start)
        if len(w) < 3:
            continue
        slope_per_min = float(np.polyfit((w.ts_ms - w.ts_ms[0]) / 60_000, w.values, 1)[0])
        if slope_per_min >= cfg.queue_growth_per_min and w.last() >= cfg.queue_min_waiting:
            findings.append(
                Finding(
                    snap.now_ms,
                    "queue_growth",
                    "instance",
                    instance,
                    snap.pools.get(instance, ""),
                    "ticket",
                    "engine_gauges",
                    {"waiting_per_min": slope_per_min, "waiting": w.last()},
                )
            )
    return findings


def detect_oom_risk(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """KV nearly full, frame buffer nearly full, or an XID error on the instance's GPUs."""
    findings = []
    for instance in sorted(set(snap.engine) | set(cfg.gpu_pods.values())):
        evidence: dict[str, Any] = {}
        kv = snap.series(instance, "kv_usage")
        if kv is not None and len(kv) and kv.last() >= cfg.oom_kv_usage:
            evidence["kv_usage"] = kv.last()
        gpu = _gpu_of(snap, cfg, instance)
        if "fb_used_mib" in gpu and "fb_free_mib" in gpu:
            used, free = gpu["fb_used_mib"].last(), gpu["fb_free_mib"].last()
            if used + free > 0 and used / (used + free) >= cfg.oom_fb_used:
                evidence["fb_used_share"] = used / (used + free)
        pods = [p for p, i in cfg.gpu_pods.items() if i == instance] + [instance]
        xids = sorted({x for p in pods for x in snap.xids.get(p, [])})
        if xids:
            evidence["xid"] = xids
        if evidence:
            basis = "+".join(k for k in ("kv_usage", "fb_used_share", "xid") if k in evidence)
            findings.append(
                Finding(
                    snap.now_ms,
                    "oom_risk",
                    "instance",
                    instance,
                    snap.pools.get(instance, ""),
                    "page",
                    basis,
                    evidence,
                )
            )
    return findings


#: Every detector, by signal name.
DETECTORS: dict[str, Detector] = {
    "stall": detect_stall,
    "ghost_requests": detect_ghosts,
    "preemption_cascade": detect_preemption_cascade,
    "fragmentation": detect_fragmentation,
    "hot_instance": detect_hot_instance,
    "retry_storm": detect_retry_storm,
    "numeric_anomaly": detect_numeric_anomaly,
    "queue_growth": detect_queue_growth,
    "oom_risk": detect_oom_risk,
}


def pool_findings(snap: Snapshot, findings: list[Finding], cfg: DetectorConfig) -> list[Finding]:
    """A per-instance signal held by more than ``pool_share`` of a pool's instances, on the pool."""
    sizes = {pool: len(instances) for pool, instances in _by_pool(snap).items()}
    hit: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in findings:
        if f.scope == "instance" and f.signal != "hot_instance":
            hit[(f.signal, f.pool)].append(f.scope_id)
    out = []
    for (signal, pool), instances in sorted(hit.items()):
        size = sizes.get(pool, 0)
        if size >= 2 and len(instances) / size > cfg.pool_share:
            severity = next(f.severity for f in findings if f.signal == signal)
            evidence = {
                "instances": sorted(instances),
                "pool_instances": size,
                "pool_share": cfg.pool_share,
            }
            out.append(
                Finding(snap.now_ms, signal, "pool", pool, pool, severity, "instances", evidence)
            )
    return out


def detect_all(snap: Snapshot, cfg: DetectorConfig) -> list[Finding]:
    """Run every detector, then the pool roll-up; sorted by (signal, scope, scope id)."""
    findings = [f for detector in DETECTORS.values() for f in detector(snap, cfg)]
    findings += pool_findings(snap, findings, cfg)
    return sorted(findings, key=lambda f: f.key)
