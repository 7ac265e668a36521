"""Detectors of a target's life: down, crashed/restarted, not ready, model-load failure, XIDs.

They read the collector's ``target_health`` rows (every scrape's outcome and the slower
readiness probe), the engine counters (a drop is a restart) and the tap's 503s.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from pydantic import Field

from slo.signals.findings import CommonThresholds, Finding
from slo.signals.snapshot import Snapshot, TargetHealthSeries
from slo.signals.xid import XID_CLASSES, classify_xid

__all__ = [
    "HealthThresholds",
    "detect_model_load_failure",
    "detect_not_ready",
    "detect_restart",
    "detect_target_down",
    "detect_xid",
]


class HealthThresholds(CommonThresholds):
    """Thresholds of a target's life: down, crashed/restarted, not ready (seconds, counts)."""

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


#: Engine counters whose drop marks a new process (summed over ranks by the snapshot).
_RESTART_COUNTERS = ("generation_tokens", "preemptions", "requests_aborted")


def _down_run(health: TargetHealthSeries) -> int:
    """How many scrapes at the end of the series failed in a row."""
    up_positions = np.flatnonzero(health.up)
    return len(health) - (int(up_positions[-1]) + 1 if len(up_positions) else 0)


def detect_target_down(snap: Snapshot, cfg: HealthThresholds) -> list[Finding]:
    """Every scrape for ≥ ``down_for_s`` (and ≥ ``down_min_scrapes``) failed; evidence: since
    when, the last error kind and when the target was last up."""
    findings = []
    for instance, health in sorted(snap.health.items()):
        run = _down_run(health)
        if run < cfg.down_min_scrapes:
            continue
        first_failed = int(health.ts_ms[len(health) - run])
        down_for_s = (snap.now_ms - first_failed) / 1000
        if down_for_s < cfg.down_for_s:
            continue
        last_up = int(health.ts_ms[len(health) - run - 1]) if run < len(health) else None
        evidence = {
            "down_since_ts_ms": first_failed,
            "down_for_s": down_for_s,
            "failed_scrapes": run,
            "error_kind": health.error_kind[-1],
            "last_up_ts_ms": last_up,
        }
        findings.append(
            Finding.on_instance(snap, "target_down", instance, "page", "scrape_failed", evidence)
        )
    return findings


def _restart_evidence(
    snap: Snapshot, instance: str, since_ms: int, cfg: HealthThresholds
) -> tuple[list[str], dict[str, Any]]:
    """Why ``instance`` counts as restarted after ``since_ms`` (empty: it did not)."""
    basis: list[str] = []
    evidence: dict[str, Any] = {}
    health = snap.health.get(instance)
    if health is not None and len(health):
        recent = health.ts_ms >= since_ms
        pairs = zip(health.ts_ms, health.process_start_s, strict=True)
        starts = [(int(t), s) for t, s in pairs if s]
        for (_, before), (ts, after) in itertools.pairwise(starts):
            if after != before and ts >= since_ms:
                basis.append("process_start_changed")
                evidence.update(process_start_before_s=before, process_start_after_s=after)
                evidence["restart_ts_ms"] = ts
        if int(health.counter_resets[recent].sum()):
            basis.append("counter_reset")
            evidence["counter_resets"] = int(health.counter_resets[recent].sum())
        up = health.up
        came_back = np.flatnonzero(~up[:-1] & up[1:]) + 1
        came_back = came_back[health.ts_ms[came_back] >= since_ms]
        if len(came_back):
            back = int(came_back[-1])
            went_down = np.flatnonzero(up[:back])
            down_at = int(went_down[-1]) + 1 if len(went_down) else 0
            # a single failed scrape (a slow round) is a blip, not a restart
            if back - down_at >= cfg.down_min_scrapes:
                basis.append("down_then_up")
                evidence["back_ts_ms"] = int(health.ts_ms[back])
                evidence["down_for_s"] = (
                    int(health.ts_ms[back]) - int(health.ts_ms[down_at])
                ) / 1000
    if "counter_reset" not in basis:
        for name in _RESTART_COUNTERS:
            series = snap.series(instance, name)
            if series is None or len(series) < 2:
                continue
            drops = np.flatnonzero(np.diff(series.values) < 0) + 1
            drops = drops[series.ts_ms[drops] >= since_ms]
            if len(drops):
                basis.append("counter_reset")
                evidence["counter_reset"] = {
                    "signal": name,
                    "ts_ms": int(series.ts_ms[drops[-1]]),
                    "before": float(series.values[drops[-1] - 1]),
                    "after": float(series.values[drops[-1]]),
                }
                break
    return basis, evidence


def detect_restart(snap: Snapshot, cfg: HealthThresholds) -> list[Finding]:
    """A crash / restart within ``restart_hold_s``: the process start time changed, counters
    reset, or the target was down and came back. A target still down is ``target_down``."""
    findings = []
    since_ms = snap.ago_ms(cfg.restart_hold_s)
    for instance in sorted(set(snap.engine) | set(snap.health)):
        health = snap.health.get(instance)
        if health is not None and len(health) and not health.up[-1]:
            continue
        basis, evidence = _restart_evidence(snap, instance, since_ms, cfg)
        if basis:
            findings.append(
                Finding.on_instance(snap, "crash", instance, "ticket", "+".join(basis), evidence)
            )
    return findings


def _not_ready_run(health: TargetHealthSeries) -> tuple[int, int] | None:
    """(first, last) index of the trailing probes that said not ready while the target was up."""
    probed = [i for i, r in enumerate(health.ready) if r is not None]
    if not probed or health.ready[probed[-1]] or not health.up[-1]:
        return None
    first = probed[-1]
    for i in reversed(probed):
        if health.ready[i] or not health.up[i]:
            break
        first = i
    return first, probed[-1]


def _not_ready_evidence(snap: Snapshot, instance: str, cfg: HealthThresholds) -> dict[str, Any]:
    """Evidence of an up-but-not-ready worker held ≥ ``not_ready_for_s`` ({} when not)."""
    health = snap.health.get(instance)
    evidence: dict[str, Any] = {}
    if health is not None:
        run = _not_ready_run(health)
        if run is not None:
            first, last = run
            since = int(health.ts_ms[first])
            evidence = {
                "not_ready_since_ts_ms": since,
                "not_ready_for_s": (snap.now_ms - since) / 1000,
                "ready_source": health.ready_source[last],
                "ready_status": health.ready_status[last],
                "models_listed": health.models[last],
                "never_ready_since_start": _never_ready_since_start(health),
            }
    gauge = snap.series(instance, "ready")
    if not evidence and gauge is not None and len(gauge) and gauge.last() == 0:
        ready_at = np.flatnonzero(gauge.values > 0)
        since = int(gauge.ts_ms[int(ready_at[-1]) + 1 if len(ready_at) else 0])
        evidence = {
            "not_ready_since_ts_ms": since,
            "not_ready_for_s": (snap.now_ms - since) / 1000,
            "ready_source": "gauge",
            "never_ready_since_start": False,
        }
    if not evidence or evidence["not_ready_for_s"] < cfg.not_ready_for_s:
        return {}
    stats = snap.requests.get(instance)
    evidence["tap_503"] = stats.unavailable if stats else 0
    return evidence


def _never_ready_since_start(health: TargetHealthSeries) -> bool:
    """The process (re)started within the series and no probe has said ready since."""
    started = None
    previous = None
    for i, start in enumerate(health.process_start_s):
        came_up = i > 0 and health.up[i] and not health.up[i - 1]
        if (start is not None and previous is not None and start != previous) or came_up:
            started = i
        previous = start if start is not None else previous
    if started is None:
        return False
    return not any(r for r in health.ready[started:] if r)


def _is_model_load_failure(evidence: dict[str, Any]) -> bool:
    """Up, not ready, and no model served: none listed, or never ready since it started."""
    return evidence.get("models_listed") == 0 or bool(evidence["never_ready_since_start"])


def detect_not_ready(snap: Snapshot, cfg: HealthThresholds) -> list[Finding]:
    """Up (metrics served) but its readiness probe or gauge says not ready for
    ≥ ``not_ready_for_s``, while it still lists its model (else: model-load failure)."""
    findings = []
    for instance in sorted(set(snap.health) | set(snap.engine)):
        evidence = _not_ready_evidence(snap, instance, cfg)
        if evidence and not _is_model_load_failure(evidence):
            basis = str(evidence["ready_source"])
            findings.append(
                Finding.on_instance(snap, "worker_not_ready", instance, "page", basis, evidence)
            )
    return findings


def detect_model_load_failure(snap: Snapshot, cfg: HealthThresholds) -> list[Finding]:
    """Up but never ready in the lookback, or ``/v1/models`` lists no model; 503s at the tap
    are evidence."""
    findings = []
    for instance in sorted(set(snap.health) | set(snap.engine)):
        evidence = _not_ready_evidence(snap, instance, cfg)
        if evidence and _is_model_load_failure(evidence):
            basis = "no_model_listed" if evidence.get("models_listed") == 0 else "never_ready"
            findings.append(
                Finding.on_instance(snap, "model_load_failure", instance, "page", basis, evidence)
            )
    return findings


def detect_xid(snap: Snapshot, cfg: HealthThresholds) -> list[Finding]:
    """One finding per XID class seen on an instance's GPUs in the lookback (``xid_memory_error``,
    ``xid_fallen_off_bus``, ``xid_interconnect``, ``xid_application_fault``, ``xid_other``),
    severity the worst of its codes; ``takes_gpu_out`` when a code means the GPU is lost."""
    findings = []
    for instance in sorted(set(snap.engine) | set(cfg.gpu_pods.values())):
        pods = [p for p, i in cfg.gpu_pods.items() if i == instance] + [instance]
        codes = sorted({x for p in pods for x in snap.xids.get(p, [])})
        by_class: dict[str, list[int]] = {}
        for code in codes:
            by_class.setdefault(classify_xid(code).xid_class, []).append(code)
        for name, members in sorted(by_class.items()):
            rows = [classify_xid(c) for c in members]
            severity = "page" if any(r.severity == "page" for r in rows) else "ticket"
            evidence = {
                "xid": members,
                "names": {str(r.code): r.name for r in rows},
                "takes_gpu_out": any(r.takes_gpu_out for r in rows),
                "class": name,
            }
            signal = XID_CLASSES[name].signal
            findings.append(
                Finding.on_instance(snap, signal, instance, severity, "dcgm_xid", evidence)
            )
    return findings
