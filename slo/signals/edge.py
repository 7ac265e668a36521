"""Detectors of the failures *in front of* the taps: the entry point, the gateway, its router.

They read the prober's records (``Snapshot.probes``: synthetic requests through the entry
point, ``source='probe'``) and the gateway router's scrape (``Snapshot.gateways``: the
Inference Extension EPP's names, collector dialect ``epp``). The taps sit behind the
gateway, beside the pods, so a gateway that refuses connections or a router that answers
503 leaves them with nothing to see: these are the only witnesses.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from pydantic import Field

from slo.signals.findings import CommonThresholds, Finding
from slo.signals.snapshot import Series, Snapshot

__all__ = [
    "EdgeThresholds",
    "detect_entry_unavailable",
    "detect_gateway_queue_full",
    "detect_no_eligible_endpoint",
    "detect_router_unavailable",
]


class EdgeThresholds(CommonThresholds):
    """Thresholds of the entry point and gateway detectors (seconds, fractions, counts)."""

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


def _taps_behind(snap: Snapshot, pool: str) -> dict[str, int]:
    """What the taps of ``pool`` saw over the lookback (evidence that they saw nothing wrong)."""
    stats = [s for inst, s in snap.requests.items() if snap.pools.get(inst, "") == pool]
    return {
        "tap_records": sum(s.records for s in stats),
        "tap_unavailable": sum(s.unavailable for s in stats),
        "tap_finish_errors": sum(s.finish_errors for s in stats),
    }


def detect_entry_unavailable(snap: Snapshot, cfg: EdgeThresholds) -> list[Finding]:
    """At least ``entry_min_failures`` probes, and ``entry_failure_share`` of them, failed at
    the entry point in the last ``entry_window_s``. Evidence: error kinds with counts, the
    last successful probe, and what the taps of the pool saw meanwhile."""
    findings = []
    since = snap.ago_ms(cfg.entry_window_s)
    for entry, probes in sorted(snap.probes.items()):
        recent = probes.ts_ms >= since
        total = int(recent.sum())
        failed = total - int(probes.ok[recent].sum())
        if failed < cfg.entry_min_failures or failed / total < cfg.entry_failure_share:
            continue
        kinds = Counter(
            k or "none"
            for k, r, ok in zip(probes.error_kind, recent, probes.ok, strict=True)
            if r and not ok
        )
        ok_ts = probes.ts_ms[probes.ok]
        taps = _taps_behind(snap, snap.pools.get(entry, ""))
        quiet = taps["tap_unavailable"] == 0 and taps["tap_finish_errors"] == 0
        evidence: dict[str, Any] = {
            "probes": total,
            "failed": failed,
            "error_kinds": dict(sorted(kinds.items())),
            "last_success_ts_ms": int(ok_ts[-1]) if len(ok_ts) else None,
            "window_s": cfg.entry_window_s,
            **taps,
        }
        basis = "probe_failed_taps_quiet" if quiet else "probe_failed"
        findings.append(
            Finding.on_instance(snap, "entry_unavailable", entry, "page", basis, evidence)
        )
    return findings


def _refusals(
    signals: dict[str, Series], prefix: str, suffix: str, since_ms: int
) -> dict[str, float]:
    """Increase per split signal ``prefix…suffix`` since ``since_ms`` (non-zero ones); a
    series born after the gateway's first scrape in the lookback started from 0 (client
    libraries create a labelled child on first use)."""
    first = min((int(s.ts_ms[0]) for s in signals.values() if len(s)), default=0)
    out = {}
    for sig, series in signals.items():
        if sig.startswith(prefix) and sig.endswith(suffix):
            grown = series.increase(since_ms, from_zero=int(series.ts_ms[0]) > first)
            if grown > 0:
                out[sig] = grown
    return out


def detect_router_unavailable(snap: Snapshot, cfg: EdgeThresholds) -> list[Finding]:
    """The gateway reports its router down (``router_up`` 0) or answered at least
    ``gateway_min_refusals`` ``router_unavailable`` in the window. Evidence: the policy in
    force as observed — ``fail_close`` (503s), ``reject`` (429s), ``fail_open`` (requests
    still routed, blind) — and the counts."""
    findings = []
    since = snap.ago_ms(cfg.gateway_window_s)
    for gateway, signals in sorted(snap.gateways.items()):
        up = signals.get("router_up")
        down = up is not None and len(up) > 0 and up.last() == 0
        refused = _refusals(signals, "gateway_answers:", ":router_unavailable", since)
        blind = _refusals(signals, "gateway_decisions:fail_open", "", since)
        if not down and sum(refused.values()) < cfg.gateway_min_refusals:
            continue
        by_code = {sig.split(":")[1]: n for sig, n in refused.items()}
        policy = (
            "fail_close"
            if "503" in by_code
            else "reject"
            if "429" in by_code
            else "fail_open"
            if blind
            else "unknown"
        )
        down_since = None
        if down and up is not None:
            ups = np.flatnonzero(up.values != 0)
            down_since = int(up.ts_ms[ups[-1] + 1] if len(ups) else up.ts_ms[0])
        evidence = {
            "router_up": None if up is None else up.last(),
            "down_since_ts_ms": down_since,
            "policy": policy,
            "refused_by_code": by_code,
            "fail_open_routed": sum(blind.values()),
            "window_s": cfg.gateway_window_s,
        }
        basis = "router_up_gauge" if down else "router_unavailable_answers"
        severity = "ticket" if policy == "fail_open" else "page"
        findings.append(
            Finding.on_instance(snap, "router_unavailable", gateway, severity, basis, evidence)
        )
    return findings


def _refusal_finding(
    snap: Snapshot,
    cfg: EdgeThresholds,
    signal: str,
    error_codes: tuple[str, ...],
    answer: str,
    gauge: str,
) -> list[Finding]:
    """One finding per gateway whose router refused ≥ ``gateway_min_refusals`` requests with
    one of the EPP ``error_codes`` (the names of both EPP generations; else, where the EPP
    counter is absent, gateway answers ``answer``)."""
    findings = []
    since = snap.ago_ms(cfg.gateway_window_s)
    for gateway, signals in sorted(snap.gateways.items()):
        epp = {
            sig: n
            for code in error_codes
            for sig, n in _refusals(signals, f"gateway_request_errors:{code}", "", since).items()
        }
        refused = epp or _refusals(signals, "gateway_answers:", f":{answer}", since)
        count = sum(refused.values())
        if count < cfg.gateway_min_refusals:
            continue
        level = signals.get(gauge)
        evidence = {
            "refused": count,
            "error_code": ",".join(sorted({s.split(":")[1] for s in epp})) or error_codes[0],
            gauge: None if level is None else level.last(),
            f"{gauge}_max": None
            if level is None
            else float(level.since(since).values.max(initial=0)),
            "window_s": cfg.gateway_window_s,
        }
        basis = "epp_error_code" if epp else "gateway_answers"
        findings.append(Finding.on_instance(snap, signal, gateway, "page", basis, evidence))
    return findings


def detect_no_eligible_endpoint(snap: Snapshot, cfg: EdgeThresholds) -> list[Finding]:
    """The router found no ready endpoint (EPP ``ServiceUnavailable``, 503); evidence: the
    refusals in the window and the pool's ready pods."""
    return _refusal_finding(
        snap,
        cfg,
        "no_eligible_endpoint",
        ("ServiceUnavailable",),
        "no_eligible_endpoint",
        "pool_ready_pods",
    )


def detect_gateway_queue_full(snap: Snapshot, cfg: EdgeThresholds) -> list[Finding]:
    """The gateway shed requests for a full queue (EPP ``ResourceExhausted``, before
    llm-d-router ``InferencePoolResourceExhausted``; 429); evidence: the refusals in the
    window and the queue depth (now and max)."""
    return _refusal_finding(
        snap,
        cfg,
        "gateway_queue_full",
        ("InferencePoolResourceExhausted", "ResourceExhausted"),
        "queue_full",
        "gateway_queue",
    )
