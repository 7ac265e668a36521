"""Detectors that read one instance's engine, GPU and tap series (DESIGN §3).

Stall, ghost requests, preemption cascade, fragmentation, queue growth and OOM risk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from slo.signals.findings import CommonThresholds, Finding, covers, gpu_of
from slo.signals.snapshot import Series, Snapshot

__all__ = [
    "EngineThresholds",
    "detect_fragmentation",
    "detect_ghosts",
    "detect_oom_risk",
    "detect_preemption_cascade",
    "detect_queue_growth",
    "detect_stall",
    "stall_suspects",
]


class EngineThresholds(CommonThresholds):
    """Thresholds of the engine detectors: stall, ghost requests, preemption cascade,
    fragmentation, queue growth, OOM risk (seconds, fractions, counts).
    """

    stall_for_s: float = Field(
        default=60,
        gt=0,
        description="work held (running > 0, or waiting with nothing running) with flat "
        "tokens this long is a stall",
    )
    stall_hold_s: float = Field(
        default=300,
        ge=0,
        description="after a stall clears, the symptoms it explains stay folded this long "
        "(their windows still hold stalled samples; fragmentation_for_s is the longest)",
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
    fragmentation_min_growth: float = Field(
        default=3.0,
        gt=0,
        description="waiting requests added over the window (admission signature)",
    )
    queue_for_s: float = Field(default=120, gt=0)
    queue_min_waiting: float = Field(default=5, ge=0)
    queue_growth_per_min: float = Field(default=3, gt=0)
    oom_kv_usage: float = Field(default=0.99, gt=0, le=1)
    oom_fb_used: float = Field(
        default=0.98, gt=0, le=1, description="frame-buffer used share (FB is ~90 % pre-allocated)"
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


def _stall_basis(
    snap: Snapshot, instance: str, running: Series, start: int, cfg: EngineThresholds
) -> tuple[str | None, dict[str, Any]]:
    """Why tokens count as stopped (``None``: they did not), and the first evidence."""
    tokens = snap.series(instance, "generation_tokens")
    unchanged = snap.series(instance, "gauges_unchanged_s")
    gauges = (running, snap.series(instance, "waiting"), snap.series(instance, "kv_usage"))
    frozen = all(s is None or np.ptp(s.since(start).values) == 0 for s in gauges)
    tokens_flat = None
    if tokens is not None and covers(tokens, start):
        tokens_flat = tokens.increase(start) == 0
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


def _nothing_in_flight(snap: Snapshot, instance: str, start: int, end: int | None = None) -> bool:
    """The tap in front of ``instance`` held no stream over the window (``start`` to
    ``end``, default now): whatever the engine's gauges say is running or waiting is a stale
    gauge left from the last load (SGLang stops refreshing them when the scheduler idles),
    not work."""
    in_flight = snap.series(instance, "tap_in_flight")
    if in_flight is None:
        return False
    recent = in_flight.since(start)
    if end is not None:
        recent = Series(recent.ts_ms[recent.ts_ms <= end], recent.values[recent.ts_ms <= end])
    return len(recent) >= 2 and float(recent.values.max()) == 0


def _asleep(snap: Snapshot, instance: str, at_ms: int | None = None) -> bool:
    """Sleep mode offloaded the weights (now, or at ``at_ms``): an engine that schedules
    nothing by design."""
    awake = snap.series(instance, "engine_awake")
    if awake is None or len(awake) == 0:
        return False
    return float(_at(awake, np.array([at_ms if at_ms is not None else snap.now_ms]))[0]) == 0


def _at(series: Series | None, ts_ms: np.ndarray) -> np.ndarray:
    """A gauge's value at each of ``ts_ms``: its latest sample at or before (0 before any)."""
    if series is None or len(series) == 0:
        return np.zeros(len(ts_ms))
    index = np.searchsorted(series.ts_ms, ts_ms, side="right") - 1
    return np.where(index >= 0, series.values[np.clip(index, 0, None)], 0.0)


def _held_still_runs(snap: Snapshot, instance: str) -> list[tuple[int, int]]:
    """Spans ``(first_ms, last_ms)`` over which the engine held work (running or waiting > 0
    at every scrape) while its token counter did not move, from the scrape before the first
    still one to the last; oldest first. Empty without a token counter."""
    tokens = snap.series(instance, "generation_tokens")
    if tokens is None or len(tokens) < 2:
        return []
    ts = tokens.ts_ms
    held = (_at(snap.series(instance, "running"), ts) > 0) | (
        _at(snap.series(instance, "waiting"), ts) > 0
    )
    still = np.concatenate(([False], np.diff(tokens.values) == 0)) & held
    runs = []
    for first, last in _true_spans(still):
        runs.append((int(ts[first - 1]), int(ts[last])))
    return runs


def _true_spans(flags: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` index of each run of consecutive true values."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1, strict=True))


def stall_suspects(snap: Snapshot, cfg: EngineThresholds) -> dict[str, str]:
    """Instances where the engine held work while its token counter stood still, recently
    enough that a stall explains their symptoms, each with how:

    - ``pending``: up to the last scrape, for less than ``stall_for_s`` so far (the stall a
      later cycle confirms if it lasts; a symptom seen now would be raised before its cause);
    - ``open``: up to the last scrape, for ``stall_for_s`` or more (what :func:`detect_stall`
      reports, or would but for the kind changing inside its window);
    - ``cleared``: for ``stall_for_s`` or more, ending at most ``stall_hold_s`` ago (the
      symptoms' windows still hold its samples).

    Not where :func:`detect_stall`'s guards hold over the span (the tap held no stream: a
    stale gauge; sleep mode). Read from the token counter: an engine without one stalls
    only on frozen gauges, and a frozen queue grows no symptom.
    """
    out = {}
    hold_from = snap.ago_ms(cfg.stall_hold_s)
    stall_ms = cfg.stall_for_s * 1000
    for instance in snap.engine:
        runs = _held_still_runs(snap, instance)
        if not runs:
            continue
        newest = int(snap.engine[instance]["generation_tokens"].ts_ms[-1])
        for first, last in reversed(runs):
            if last < hold_from:
                break
            lasted = last - first >= stall_ms
            if last == newest:
                state = "open" if lasted else "pending"
            elif lasted:
                state = "cleared"
            else:
                continue  # a pause shorter than a stall, over: nothing to explain
            if _asleep(snap, instance, last) or _nothing_in_flight(snap, instance, first, last):
                continue
            out[instance] = state
            break
    return out


def _wedge_basis(
    snap: Snapshot, instance: str, running: Series, start: int
) -> tuple[str | None, dict[str, Any]]:
    """Work waiting, nothing running, no tokens over the window: an engine that accepts
    requests and never schedules them (``None``: not that)."""
    full = snap.series(instance, "waiting")
    tokens = snap.series(instance, "generation_tokens")
    if full is None or not covers(full, start) or float(running.values.max()) > 0:
        return None, {}
    waiting = full.since(start)
    if len(waiting) < 2 or float(waiting.values.min()) <= 0 or waiting.last() < waiting.values[0]:
        return None, {}
    if tokens is None or not covers(tokens, start) or tokens.increase(start) != 0:
        return None, {}
    kv = snap.series(instance, "kv_usage")
    evidence: dict[str, Any] = {
        "running_max": 0.0,
        "waiting_first": float(waiting.values[0]),
        "waiting_last": waiting.last(),
        "kv_usage_max": None if kv is None else float(kv.since(start).values.max(initial=0)),
    }
    return "waiting_nothing_running", evidence


def _health_evidence(snap: Snapshot, instance: str, start: int) -> dict[str, Any]:
    """What the readiness probe answered over the window: a wedged engine keeps answering
    ``/health`` 200, so a liveness probe never restarts it."""
    health = snap.health.get(instance)
    if health is None:
        return {}
    statuses = [
        status
        for ts, status in zip(health.ts_ms.tolist(), health.ready_status, strict=True)
        if ts >= start and status is not None
    ]
    if not statuses:
        return {}
    return {"health_status_last": statuses[-1], "health_ok_while_stalled": statuses[-1] == 200}


def detect_stall(snap: Snapshot, cfg: EngineThresholds) -> list[Finding]:
    """An engine that holds work and produces no token for ≥ ``stall_for_s``, two kinds
    (``evidence["kind"]``):

    - ``running_tokens_flat``: running > 0 and generation tokens flat (frozen scheduler
      gauges count as flat);
    - ``waiting_nothing_running``: running 0 throughout, waiting > 0 and not draining,
      tokens flat — the engine accepts requests and never schedules them.

    Neither is raised while the tap in front of the instance held no stream over the window
    (a stale gauge after load) or while sleep mode holds the engine. The evidence says
    whether ``/health`` kept answering 200 and what the tap's streams saw.
    """
    findings = []
    start = snap.ago_ms(cfg.stall_for_s)
    for instance in snap.engine:
        full = snap.series(instance, "running")
        if full is None or not covers(full, start):
            continue
        running = full.since(start)
        if len(running) < 2 or _asleep(snap, instance) or _nothing_in_flight(snap, instance, start):
            continue
        if running.values.min() > 0:
            basis, evidence = _stall_basis(snap, instance, running, start, cfg)
            evidence = {"kind": "running_tokens_flat", **evidence}
        else:
            basis, evidence = _wedge_basis(snap, instance, running, start)
            evidence = {"kind": basis, "stall_for_s": cfg.stall_for_s, **evidence}
        if basis is None:
            continue
        evidence.update(_health_evidence(snap, instance, start))
        gpu = gpu_of(snap, cfg, instance)
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
        findings.append(Finding.on_instance(snap, "stall", instance, "page", basis, evidence))
    return findings


def _running_over_tap(running: Series, in_flight: Series, match_ms: int) -> np.ndarray:
    """Engine ``running`` minus tap in-flight at each engine sample that has tap samples at
    most ``match_ms`` before *and* after it. Scrapes and tap gauges are never simultaneous,
    so the tap side is the larger of its two neighbours: a stream that opened or closed in
    between is given to the tap, and only an excess that both neighbours leave is counted."""
    tap_ts, tap_values = in_flight.ts_ms, in_flight.values
    if len(tap_ts) == 0 or len(running) == 0:
        return np.empty(0)
    last = len(tap_ts) - 1
    before = np.searchsorted(tap_ts, running.ts_ms, side="right") - 1
    after = np.searchsorted(tap_ts, running.ts_ms, side="left")
    ok = (before >= 0) & (after <= last)
    before, after = np.clip(before, 0, last), np.clip(after, 0, last)
    ok &= (running.ts_ms - tap_ts[before] <= match_ms) & (tap_ts[after] - running.ts_ms <= match_ms)
    bound = np.maximum(tap_values[before], tap_values[after])
    return (running.values - bound)[ok]


def _disconnects_and_aborts(
    snap: Snapshot, instance: str, start_ms: int
) -> tuple[float, float] | None:
    """(tap disconnects, engine aborts) over the span both were observed since ``start_ms``;
    disconnects from streams the engine had already finished are not counted."""
    disconnects = snap.series(instance, "tap_disconnects")
    running = snap.series(instance, "running")
    if disconnects is None or running is None or len(disconnects) < 2:
        return None
    lo = max(start_ms, int(disconnects.ts_ms[0]), int(running.ts_ms[0]))
    hi = min(int(disconnects.ts_ms[-1]), int(running.ts_ms[-1]))
    if hi <= lo:
        return None
    # interpolated: the tap and the engine are scraped at different moments
    aborts = sum(
        s.increase(lo, hi, interpolate=True)
        for name in ("requests_finished:abort", "requests_aborted")
        if (s := snap.series(instance, name)) is not None
    )
    finished = snap.finished_cancels_ms.get(instance, np.empty(0, np.int64))
    after_the_end = int(((finished >= lo) & (finished <= hi)).sum())
    return max(disconnects.increase(lo, hi, interpolate=True) - after_the_end, 0.0), aborts


def detect_ghosts(snap: Snapshot, cfg: EngineThresholds) -> list[Finding]:
    """Requests the engine keeps after the tap let them go (the client left), two ways:

    - live: over ``ghost_window_s``, engine ``running`` stays above the tap's in-flight
      (matched within ``ghost_match_s``, ≥ 3 samples ≥ ``ghost_grace_s`` apart in all) by
      ``ghost_min`` on average, *and* the engine aborted fewer than
      1 − ``ghost_unmatched_share`` of the tap's disconnects over the same span;
    - drain mode: the tap kept reading after a disconnect and tokens still came.
    """
    findings = []
    start = snap.ago_ms(cfg.ghost_window_s)
    for instance in snap.engine:
        evidence: dict[str, Any] = {}
        count = 0
        running, in_flight = (
            snap.series(instance, "running"),
            snap.series(instance, "tap_in_flight"),
        )
        if running is not None and in_flight is not None:
            recent = running.since(start)
            excess = _running_over_tap(recent, in_flight, int(cfg.ghost_match_s * 1000))
            spread = np.ptp(recent.ts_ms) if len(recent) else 0
            seen = _disconnects_and_aborts(snap, instance, start)
            if len(excess) >= 3 and spread >= cfg.ghost_grace_s * 1000 and seen is not None:
                disconnects, aborts = seen
                unmatched = disconnects - aborts
                evidence.update(
                    running_over_tap_in_flight=float(excess.mean()),
                    matched_samples=len(excess),
                    tap_disconnects=disconnects,
                    engine_aborts=aborts,
                )
                if excess.mean() >= cfg.ghost_min and unmatched >= max(
                    cfg.ghost_min, cfg.ghost_unmatched_share * disconnects
                ):
                    count = max(round(float(excess.mean())), 1)
        stats = snap.requests.get(instance)
        if stats and stats.tokens_after_disconnect > 0:
            evidence["tokens_after_disconnect"] = stats.tokens_after_disconnect
            count = max(count, stats.late_upstream_close, 1)
        if count >= cfg.ghost_min:
            evidence["ghosts"] = count
            findings.append(
                Finding.on_instance(
                    snap,
                    "ghost_requests",
                    instance,
                    "ticket",
                    "tap_vs_engine",
                    evidence,
                )
            )
    return findings


def detect_preemption_cascade(snap: Snapshot, cfg: EngineThresholds) -> list[Finding]:
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
                Finding.on_instance(
                    snap,
                    "preemption_cascade",
                    instance,
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


def detect_fragmentation(snap: Snapshot, cfg: EngineThresholds) -> list[Finding]:
    """From block stats when present, else the admission signature (waiting grows with room)."""
    findings = []
    start = snap.ago_ms(cfg.fragmentation_for_s)
    for instance in snap.engine:
        free, run = (
            snap.series(instance, "kv_free_blocks"),
            snap.series(instance, "kv_largest_free_run"),
        )
        if covers(free, start) and run is not None and free is not None:
            f, r = free.since(start), run.since(start)
            common, fi, ri = np.intersect1d(f.ts_ms, r.ts_ms, return_indices=True)
            ratio = 1 - r.values[ri] / np.maximum(f.values[fi], 1)
            if len(common) >= 2 and ratio.min() > cfg.fragmentation_ratio:
                findings.append(
                    Finding.on_instance(
                        snap,
                        "fragmentation",
                        instance,
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
        if not covers(waiting, start) or kv is None or waiting is None:
            continue
        w, k = waiting.since(start).values, kv.since(start).values
        preempted = pre.increase(start) if pre is not None else 0.0
        room = float(1 - k.max()) if len(k) else 0.0
        # admission stalls: the queue only grows (never drains) while KV has room
        growing = (
            len(w) >= 3
            and bool(np.all(np.diff(w) >= 0))
            and w[-1] - w[0] >= cfg.fragmentation_min_growth
        )
        if growing and w.min() > 0 and room >= cfg.fragmentation_room:
            findings.append(
                Finding.on_instance(
                    snap,
                    "fragmentation",
                    instance,
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


def detect_queue_growth(snap: Snapshot, cfg: EngineThresholds) -> list[Finding]:
    """Waiting requests rising steadily for ``queue_for_s``."""
    findings = []
    start = snap.ago_ms(cfg.queue_for_s)
    for instance in snap.engine:
        waiting = snap.series(instance, "waiting")
        if not covers(waiting, start) or waiting is None:
            continue
        w = waiting.since(start)
        if len(w) < 3:
            continue
        slope_per_min = float(np.polyfit((w.ts_ms - w.ts_ms[0]) / 60_000, w.values, 1)[0])
        if slope_per_min >= cfg.queue_growth_per_min and w.last() >= cfg.queue_min_waiting:
            findings.append(
                Finding.on_instance(
                    snap,
                    "queue_growth",
                    instance,
                    "ticket",
                    "engine_gauges",
                    {"waiting_per_min": slope_per_min, "waiting": w.last()},
                )
            )
    return findings


def detect_oom_risk(snap: Snapshot, cfg: EngineThresholds) -> list[Finding]:
    """Memory pressure only: KV nearly full or the frame buffer nearly full. An XID is no
    memory pressure; it is its own finding (``slo.signals.xid``)."""
    findings = []
    for instance in sorted(set(snap.engine) | set(cfg.gpu_pods.values())):
        evidence: dict[str, Any] = {}
        kv = snap.series(instance, "kv_usage")
        if kv is not None and len(kv) and kv.last() >= cfg.oom_kv_usage:
            evidence["kv_usage"] = kv.last()
        gpu = gpu_of(snap, cfg, instance)
        if "fb_used_mib" in gpu and "fb_free_mib" in gpu:
            used, free = gpu["fb_used_mib"].last(), gpu["fb_free_mib"].last()
            if used + free > 0 and used / (used + free) >= cfg.oom_fb_used:
                evidence["fb_used_share"] = used / (used + free)
        if evidence:
            basis = "+".join(k for k in ("kv_usage", "fb_used_share") if k in evidence)
            findings.append(
                Finding.on_instance(
                    snap,
                    "oom_risk",
                    instance,
                    "page",
                    basis,
                    evidence,
                )
            )
    return findings
