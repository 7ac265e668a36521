"""The pool an instance is compared with: a pool's engine instances, and which of them serve.

Every pool-relative detector — hot instance (its shares and Gini), slow prefill, slow decode
and ITL jitter (the Mann–Whitney baseline), and the over-the-pool rule of prefill failure
and interrupted streams — compares an instance with the **serving** instances of its pool,
from :func:`pool_baselines` alone. A pool whose pods mostly fail answers with almost no
tokens and only from its lightly loaded pods, so its few healthy pods would otherwise stand
out as hot and jittery against a baseline that is not a fleet at work.

An instance is **not serving** in a snapshot when either holds (the first reason is kept):

- **its own finding says it cannot serve now**: ``target_down``, ``worker_not_ready``,
  ``model_load_failure``, ``stall``, or an XID that takes its GPU out (``takes_gpu_out``,
  e.g. 79 fallen off the bus) — computed by those detectors themselves, so this module
  never restates their rules. A stalled or lost GPU holds its streams open and writes no
  record, which no outcome count can see; a target behind a router that stops sending to it
  writes none either;
- **most of its answered attempts failed**: over the second half of the lookback (the
  window the failure detectors count), fewer than ``serving_min_share`` (50 %) of its tap
  attempts that the client did not cancel were *served* (outcome ``ok`` and no
  ``finish_reason=error``), with at least ``failure_min_count`` (5) failed. This covers
  prefill failures, interrupted streams, NaN bursts, the 503s of a worker not ready (before
  ``not_ready_for_s``) and a crashed pod's refused connections, each as soon as they fail.

Client cancels are neither served nor failed: a pod whose clients hang up (ghosts) still
serves. A crash that came back is judged by what it does now, not by ``restart_hold_s``.
A pool with fewer than ``pool_min_serving`` (2) serving instances gives **no pool verdict**
(an instance needs at least one serving peer); the instances left out are in every pool
finding's evidence (``left_out``: instance → reason). Hot instance and the latency shifts
neither judge a non-serving instance (its own findings report it) nor count it; the failure
detectors still judge it (a failing pod is what they report), against its serving peers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from slo._engine_detectors import detect_stall
from slo._health_detectors import (
    detect_model_load_failure,
    detect_not_ready,
    detect_target_down,
    detect_xid,
)
from slo.findings import Detector, DetectorConfig
from slo.snapshot import Snapshot

__all__ = ["SERVING_FAILURE", "PoolBaseline", "by_pool", "not_serving", "pool_baselines"]

#: Signals only an engine exports: a gateway, router, autoscaler or P/D connector target
#: in ``snap.engine`` without them is not a member of its pool.
_ENGINE_SIGNALS = ("running", "waiting", "generation_tokens", "kv_usage")

#: Detectors whose finding on an instance means it cannot serve now (xid: only when the
#: code takes the GPU out, see :func:`not_serving`).
_CANNOT_SERVE: tuple[Detector, ...] = (
    detect_target_down,
    detect_not_ready,
    detect_model_load_failure,
    detect_stall,
    detect_xid,
)

#: The reason of an instance left out because most of its answered attempts failed.
SERVING_FAILURE = "failing_requests"


def by_pool(snap: Snapshot) -> dict[str, list[str]]:
    """Engine instances per pool: those taps saw, and scraped targets with engine signals."""
    engines = {
        i for i, signals in snap.engine.items() if any(s in signals for s in _ENGINE_SIGNALS)
    }
    pools: dict[str, list[str]] = defaultdict(list)
    for instance in sorted(set(snap.requests) | engines):
        pools[snap.pools.get(instance, "")].append(instance)
    return pools


def not_serving(snap: Snapshot, cfg: DetectorConfig) -> dict[str, str]:
    """Instances that are visibly not serving in ``snap``, each with why (a signal name, or
    :data:`SERVING_FAILURE`); see the module docstring for the rule."""
    reasons: dict[str, str] = {}
    for detector in _CANNOT_SERVE:
        for finding in detector(snap, cfg):
            if finding.signal.startswith("xid_") and not finding.evidence["takes_gpu_out"]:
                continue
            reasons.setdefault(finding.scope_id, finding.signal)
    for instance, stats in sorted(snap.failures.items()):
        answered = stats.attempts - stats.client_cancelled
        failed = answered - stats.served
        if failed >= cfg.failure_min_count and stats.served < cfg.serving_min_share * answered:
            reasons.setdefault(instance, SERVING_FAILURE)
    return reasons


@dataclass(frozen=True)
class PoolBaseline:
    """One pool's engine instances split into those that serve and those left out."""

    serving: list[str]  # sorted
    left_out: dict[str, str] = field(default_factory=dict)  # instance → reason


def pool_baselines(snap: Snapshot, cfg: DetectorConfig) -> dict[str, PoolBaseline]:
    """Per pool (:func:`by_pool`), its serving instances and the ones left out, with why.

    Worked out once per snapshot and config (six detectors ask, and the rule runs five
    detectors of its own): kept in ``snap.derived``."""
    cached = snap.derived.get("pool_baselines")
    if isinstance(cached, tuple) and cached[0] is cfg:
        return cached[1]
    baselines = _pool_baselines(snap, cfg)
    snap.derived["pool_baselines"] = (cfg, baselines)
    return baselines


def _pool_baselines(snap: Snapshot, cfg: DetectorConfig) -> dict[str, PoolBaseline]:
    reasons = not_serving(snap, cfg)
    baselines = {}
    for pool, members in by_pool(snap).items():
        left_out = {i: reasons[i] for i in members if i in reasons}
        baselines[pool] = PoolBaseline([i for i in members if i not in reasons], left_out)
    return baselines
