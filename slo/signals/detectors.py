"""Failure-signature detectors (DESIGN §3): each reads a :class:`Snapshot`, returns findings.

Every finding names its signal, scope (instance or pool), severity, the *basis* it rests
on and the evidence (numbers and thresholds) so an on-call engineer can check it.
Detectors are data in :data:`DETECTORS`: adding a signal is writing one function and one
row there (see ``slo/README.md``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from slo.signals._serving import by_pool
from slo.signals.config import DetectorConfig
from slo.signals.edge import (
    detect_entry_unavailable,
    detect_gateway_queue_full,
    detect_no_eligible_endpoint,
    detect_router_unavailable,
)
from slo.signals.engine import (
    detect_fragmentation,
    detect_ghosts,
    detect_oom_risk,
    detect_preemption_cascade,
    detect_queue_growth,
    detect_stall,
)
from slo.signals.failure import detect_prefill_failure, detect_stream_interrupted
from slo.signals.findings import Detector, Finding, gini
from slo.signals.health import (
    detect_model_load_failure,
    detect_not_ready,
    detect_restart,
    detect_target_down,
    detect_xid,
)
from slo.signals.infra import (
    detect_autoscaler_lag,
    detect_kv_index_stale,
    detect_kv_transfer_timeout,
)
from slo.signals.latency import detect_itl_jitter, detect_slow_decode, detect_slow_prefill
from slo.signals.snapshot import Snapshot
from slo.signals.traffic import (
    detect_hot_instance,
    detect_hot_rank,
    detect_numeric_anomaly,
    detect_retry_storm,
)

__all__ = ["DETECTORS", "DetectorConfig", "Finding", "detect_all", "gini", "pool_findings"]

log = logging.getLogger(__name__)


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
    "target_down": detect_target_down,
    "crash": detect_restart,
    "worker_not_ready": detect_not_ready,
    "model_load_failure": detect_model_load_failure,
    "xid": detect_xid,  # one finding per class: xid_memory_error, xid_fallen_off_bus, …
    "slow_prefill": detect_slow_prefill,
    "slow_decode": detect_slow_decode,
    "hot_rank": detect_hot_rank,
    "entry_unavailable": detect_entry_unavailable,
    "router_unavailable": detect_router_unavailable,
    "no_eligible_endpoint": detect_no_eligible_endpoint,
    "gateway_queue_full": detect_gateway_queue_full,
    "kv_transfer_timeout": detect_kv_transfer_timeout,
    "kv_index_stale": detect_kv_index_stale,
    "autoscaler_lag": detect_autoscaler_lag,
    "prefill_failure": detect_prefill_failure,
    "stream_interrupted": detect_stream_interrupted,
    "itl_jitter": detect_itl_jitter,
}


#: Signals that compare an instance with its pool: most of a pool cannot hold them at once.
_NOT_POOLED = ("hot_instance", "slow_prefill", "slow_decode", "itl_jitter")


def pool_findings(snap: Snapshot, findings: list[Finding], cfg: DetectorConfig) -> list[Finding]:
    """A per-instance signal held by more than ``pool_share`` of a pool's instances, on the pool."""
    sizes = {pool: len(instances) for pool, instances in by_pool(snap).items()}
    hit: dict[tuple[str, str], list[str]] = defaultdict(list)
    for f in findings:
        if f.scope == "instance" and f.signal not in _NOT_POOLED:
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


def detect_all(
    snap: Snapshot, cfg: DetectorConfig, on_error: Callable[[str], None] | None = None
) -> list[Finding]:
    """Run every detector, then the pool roll-up; sorted by (signal, scope, scope id).

    A detector that raises on odd data is logged and skipped (``on_error(name)`` is told),
    so one broken detector never costs the cycle the others' findings, flags and alerts.
    """
    findings: list[Finding] = []
    for name, detector in DETECTORS.items():
        try:
            findings += detector(snap, cfg)
        except Exception:
            log.exception("detector %s failed at %d; its findings are skipped", name, snap.now_ms)
            if on_error is not None:
                on_error(name)
    findings += pool_findings(snap, findings, cfg)
    return sorted(findings, key=lambda f: f.key)
