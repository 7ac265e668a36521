"""The pool an instance is compared with: a pool's engine instances, and which of them serve.

Every pool-relative detector — hot instance (its shares and Gini), slow prefill, slow decode
and ITL jitter (the Mann–Whitney baseline), and the over-the-pool rule of prefill failure
and interrupted streams — compares an instance with the **serving** instances of its pool,
from :func:`pool_baselines` alone. A pool whose pods mostly fail answers with almost no
tokens and only from its lightly loaded pods, so its few healthy pods would otherwise stand
out as hot and jittery against a baseline that is not a fleet at work.

An instance is **not serving** in a snapshot when either holds (the reason given is the
signal of its finding when it has one, else ``failing_requests``):

- **most of its answered attempts failed on the pod**: over the second half of the lookback
  (the window the failure detectors count), fewer than ``serving_min_share`` (50 %) of its
  answered tap attempts were *served* (outcome ``ok`` and no ``finish_reason=error``), with
  at least ``failure_min_count`` (5) *failed*. Failed counts only answers that show the pod
  itself failing (``FailureStats.pod_failed``, one SQL rule in :mod:`slo.signals._failures`): 5xx
  (the 503s of a worker not ready too), errors before the first token but 4xx (a stream that
  ended or errored first, a reset, a refused connection), streams cut after it,
  ``finish_reason=error`` (NaN bursts), connect timeouts. A 429 (a full queue, or the tap's
  own L2 refusal, which never reached the pod), a deadline passed, a first-token or read
  timeout, a 4xx and a client cancel are neither served nor failed: that is what an
  overloaded, slow or ghost-ridden pod produces, and hot instance and the latency shifts
  must still judge it;
- **its own finding says it cannot serve now**: ``target_down``, ``worker_not_ready``,
  ``model_load_failure``, ``stall``, or an XID that takes its GPU out (``takes_gpu_out``,
  e.g. 79 fallen off the bus) — computed by those detectors themselves, so this module
  never restates their rules; one that raises is logged and skipped (it costs only the
  instances it would have left out). A stalled or lost GPU holds its streams open and writes
  no record, which no outcome count can see; a target behind a router that stops sending to
  it writes none either. But a pod whose tap records show it **serving now** (served ≥
  ``serving_min_share`` of at least ``failure_min_count`` answered) stays in whatever these
  say — a failed /metrics scrape of an overloaded pod, an XID minutes ago on a GPU since
  replaced — except a ``stall``: the engine's own token counter standing still now
  outweighs records that may predate it.

A crash that came back is judged by what it does now, not by ``restart_hold_s``.
A pool with fewer than ``pool_min_serving`` (2) serving instances gives **no pool verdict**
(an instance needs at least one serving peer); the instances left out are in every pool
finding's evidence (``left_out``: instance → reason, a copy). Hot instance and the latency
shifts neither judge a non-serving instance (its own findings report it) nor count it; the
failure detectors still judge it (a failing pod is what they report), against its serving
peers.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pydantic import Field

from slo.signals._failures import FailureStats
from slo.signals.engine import EngineThresholds, detect_stall
from slo.signals.findings import CommonThresholds, Finding
from slo.signals.health import (
    HealthThresholds,
    detect_model_load_failure,
    detect_not_ready,
    detect_target_down,
    detect_xid,
)
from slo.signals.snapshot import Snapshot

__all__ = [
    "SERVING_FAILURE",
    "PoolBaseline",
    "ServingThresholds",
    "by_pool",
    "not_serving",
    "pool_baselines",
]


class ServingThresholds(CommonThresholds):
    """Which instances of a pool serve, and how many a pool needs for a pool-relative verdict.

    ``failure_min_count`` is the failure detectors' too: the least evidence either judges on.
    """

    serving_min_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="share of an instance's answered attempts (client cancels aside) that must"
        " be served (ok, no finish_reason=error) for it to count in its pool's baseline",
    )
    pool_min_serving: int = Field(
        default=2,
        ge=2,
        description="serving instances a pool needs for any pool-relative verdict (hot "
        "instance, latency shift, failure share over the pool)",
    )
    failure_min_count: int = Field(
        default=5, ge=1, description="failed attempts an instance needs before it is judged"
    )


class PoolThresholds(ServingThresholds, EngineThresholds, HealthThresholds):
    """What a pool baseline reads: the serving rule's thresholds and those of the detectors it
    asks whether an instance can serve now (stall, target health). The pool-relative families'
    thresholds extend it; it declares none of its own."""


log = logging.getLogger(__name__)

#: Signals only an engine exports: a gateway, router, autoscaler or P/D connector target
#: in ``snap.engine`` without them is not a member of its pool.
_ENGINE_SIGNALS = ("running", "waiting", "generation_tokens", "kv_usage")

#: Detectors whose finding on an instance means it cannot serve now (xid: only when the
#: code takes the GPU out, see :func:`not_serving`).
_CANNOT_SERVE: tuple[Callable[[Snapshot, PoolThresholds], list[Finding]], ...] = (
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


def _serves(stats: FailureStats, cfg: PoolThresholds) -> bool | None:
    """Whether the tap's recent attempts show the instance serving (True), mostly failing
    (False), or too few answered either way (None)."""
    answered = stats.served + stats.pod_failed
    if answered < cfg.failure_min_count:
        return None
    if stats.served >= cfg.serving_min_share * answered:
        return True
    return False if stats.pod_failed >= cfg.failure_min_count else None


def _cannot_serve(snap: Snapshot, cfg: PoolThresholds) -> dict[str, list[str]]:
    """Instances that findings of :data:`_CANNOT_SERVE` say cannot serve, each with those
    signals in order. A detector that raises costs only its own reasons (``detect_all``'s
    promise, which runs it again and logs it too): logged with context and skipped."""
    signals: dict[str, list[str]] = defaultdict(list)
    for detector in _CANNOT_SERVE:
        try:
            found = [
                (f.scope_id, f.signal)
                for f in detector(snap, cfg)
                if not f.signal.startswith("xid_") or f.evidence["takes_gpu_out"]
            ]
        except Exception:
            log.exception(
                "serving rule: %s failed at %d; the instances it would leave out stay in",
                getattr(detector, "__name__", detector),
                snap.now_ms,
            )
            continue
        for instance, signal in found:
            signals[instance].append(signal)
    return signals


def not_serving(snap: Snapshot, cfg: PoolThresholds) -> dict[str, str]:
    """Instances that are visibly not serving in ``snap``, each with why (a signal name, or
    :data:`SERVING_FAILURE`); see the module docstring for the rule."""
    serves = {i: _serves(stats, cfg) for i, stats in snap.failures.items()}
    reasons = {
        instance: signals[0]
        for instance, signals in _cannot_serve(snap, cfg).items()
        # records show it serving: a stall (its token counter standing still now) still wins
        if not serves.get(instance) or "stall" in signals
    }
    for instance, serving in sorted(serves.items()):
        if serving is False:
            reasons.setdefault(instance, SERVING_FAILURE)
    return reasons


@dataclass(frozen=True)
class PoolBaseline:
    """One pool's engine instances split into those that serve and those left out; shared
    by every detector of a snapshot (``Snapshot.derived``), so read-only."""

    serving: tuple[str, ...]  # sorted
    left_out: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({})
    )  # instance → reason


def pool_baselines(snap: Snapshot, cfg: PoolThresholds) -> dict[str, PoolBaseline]:
    """Per pool (:func:`by_pool`), its serving instances and the ones left out, with why.

    Worked out once per snapshot and config (six detectors ask, and the rule runs five
    detectors of its own): kept in ``snap.derived``."""
    cached = snap.derived.get("pool_baselines")
    if isinstance(cached, tuple) and cached[0] is cfg:
        return cached[1]
    baselines = _pool_baselines(snap, cfg)
    snap.derived["pool_baselines"] = (cfg, baselines)
    return baselines


def _pool_baselines(snap: Snapshot, cfg: PoolThresholds) -> dict[str, PoolBaseline]:
    reasons = not_serving(snap, cfg)
    baselines = {}
    for pool, members in by_pool(snap).items():
        left_out = MappingProxyType({i: reasons[i] for i in members if i in reasons})
        baselines[pool] = PoolBaseline(tuple(i for i in members if i not in reasons), left_out)
    return baselines
