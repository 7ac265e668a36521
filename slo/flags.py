"""Degradation flags L0–L3 per pool and per instance: a pure state machine with injected time.

Levels come from the KV free ratio (DESIGN §3): L1 below 10 % (disable speculative
decoding), L2 below 5 % (reject prompts > 16K tokens), L3 below 1 % or on OOM risk (switch
to the small-model replica). **Enter fast**: a worse level is taken on the first
observation. **Leave slowly**: a better level is taken only when the ratio clears the
threshold *plus* ``hysteresis`` continuously for ``dwell_s`` and the current level has been
held for ``dwell_s``; OOM risk (or a lost GPU) pins L3. A missing observation changes
nothing, but a scope whose target is down or whose data went stale is set to
:data:`UNKNOWN` (−1) by :meth:`FlagBoard.mark_unknown`, never left at its last level; its
next observation sets the level it calls for at once (reason ``observed_again``).

:meth:`FlagBoard.observe` returns the :class:`FlagTransition` (with its evidence) or
``None``; writers publish transitions (Kafka ``flags`` topic) and store them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, Field, model_validator

from pipeline.config import STRICT
from pipeline.schema import FLAG_TRANSITIONS

__all__ = [
    "UNKNOWN",
    "FlagBoard",
    "FlagPolicy",
    "FlagState",
    "FlagTransition",
    "step",
    "strict_level",
    "transition_rows",
    "transitions_table",
]


#: The level of a scope nobody can observe (target down, crashed, data stale).
UNKNOWN = -1


class FlagPolicy(BaseModel):
    """Thresholds on the KV free ratio (fractions), the hysteresis margin and the dwell time."""

    model_config = STRICT

    l1_free: float = Field(default=0.10, gt=0, lt=1)
    l2_free: float = Field(default=0.05, gt=0, lt=1)
    l3_free: float = Field(default=0.01, gt=0, lt=1)
    hysteresis: float = Field(
        default=0.02, ge=0, lt=1, description="ratio margin above a threshold needed to leave it"
    )
    dwell_s: float = Field(
        default=120.0,
        ge=0,
        description="seconds a level is held and the recovery lasts before leaving",
    )

    @model_validator(mode="after")
    def _ordered(self) -> FlagPolicy:
        if not self.l3_free < self.l2_free < self.l1_free:
            raise ValueError("thresholds must satisfy l3_free < l2_free < l1_free")
        return self


def strict_level(
    policy: FlagPolicy, kv_free: float, oom_risk: bool = False, margin: float = 0.0
) -> int:
    """The level the ratio calls for (with ``margin`` added to every threshold)."""
    if oom_risk or kv_free < policy.l3_free + margin:
        return 3
    if kv_free < policy.l2_free + margin:
        return 2
    if kv_free < policy.l1_free + margin:
        return 1
    return 0


@dataclass(frozen=True)
class FlagState:
    """Where one scope is: its level, since when, and since when it has looked better."""

    level: int = 0
    since_ts_ms: int = 0
    calm_since_ts_ms: int | None = None


@dataclass(frozen=True)
class FlagTransition:
    """One level change of one scope, with the evidence that drove it."""

    ts_ms: int
    scope: str  # pool | instance
    scope_id: str
    pool: str | None
    from_level: int
    to_level: int
    kv_free_ratio: float | None
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


def step(
    policy: FlagPolicy,
    state: FlagState,
    ts_ms: int,
    kv_free: float | None,
    oom_risk: bool = False,
    pin_reason: str = "oom_risk",
) -> tuple[FlagState, tuple[int, str] | None]:
    """Advance one scope; returns the new state and ``(new_level, reason)`` on a change.

    ``oom_risk`` pins L3 with ``pin_reason`` (``oom_risk``, ``xid_gpu_lost``).
    """
    if kv_free is None and not oom_risk:
        return state, None
    free = 1.0 if kv_free is None else kv_free
    wanted = strict_level(policy, free, oom_risk)
    if state.level == UNKNOWN:
        return FlagState(wanted, ts_ms, None), (wanted, "observed_again")
    if wanted > state.level:
        reason = (
            pin_reason
            if oom_risk and strict_level(policy, free) < 3
            else f"kv_free_below_l{wanted}"
        )
        return FlagState(wanted, ts_ms, None), (wanted, reason)
    relaxed = strict_level(policy, free, oom_risk, margin=policy.hysteresis)
    if relaxed >= state.level:
        return replace(state, calm_since_ts_ms=None), None
    calm_since = state.calm_since_ts_ms if state.calm_since_ts_ms is not None else ts_ms
    dwell_ms = policy.dwell_s * 1000
    if ts_ms - calm_since >= dwell_ms and ts_ms - state.since_ts_ms >= dwell_ms:
        return FlagState(relaxed, ts_ms, None), (relaxed, "recovered_dwell_elapsed")
    return replace(state, calm_since_ts_ms=calm_since), None


class FlagBoard:
    """The states of every pool and instance; seeded from stored levels after a restart."""

    def __init__(
        self, policy: FlagPolicy, initial: Mapping[tuple[str, str], FlagState] | None = None
    ) -> None:
        self.policy = policy
        self.states: dict[tuple[str, str], FlagState] = dict(initial or {})

    def level(self, scope: str, scope_id: str) -> int:
        return self.states.get((scope, scope_id), FlagState()).level

    def observe(
        self,
        ts_ms: int,
        scope: str,
        scope_id: str,
        pool: str | None,
        kv_free: float | None,
        oom_risk: bool = False,
        evidence: Mapping[str, Any] | None = None,
        pin_reason: str = "oom_risk",
    ) -> FlagTransition | None:
        """Feed one observation; returns the transition it caused, if any."""
        key = (scope, scope_id)
        before = self.states.get(key, FlagState(since_ts_ms=ts_ms))
        after, change = step(self.policy, before, ts_ms, kv_free, oom_risk, pin_reason)
        self.states[key] = after
        if change is None:
            return None
        thresholds = {
            "l1_free": self.policy.l1_free,
            "l2_free": self.policy.l2_free,
            "l3_free": self.policy.l3_free,
            "hysteresis": self.policy.hysteresis,
            "dwell_s": self.policy.dwell_s,
        }
        full = {"thresholds": thresholds, "oom_risk": oom_risk, **(evidence or {})}
        return FlagTransition(
            ts_ms, scope, scope_id, pool, before.level, change[0], kv_free, change[1], full
        )

    def mark_unknown(
        self,
        ts_ms: int,
        scope: str,
        scope_id: str,
        pool: str | None,
        reason: str,
        evidence: Mapping[str, Any] | None = None,
    ) -> FlagTransition | None:
        """Set a scope nobody can observe to :data:`UNKNOWN`; the transition, or ``None``
        when it already was unknown. ``reason``: ``target_down``, ``kv_stale`` (an instance),
        ``no_instance_observed`` (a pool whose every instance is unknown)."""
        key = (scope, scope_id)
        before = self.states.get(key, FlagState(since_ts_ms=ts_ms))
        if before.level == UNKNOWN:
            return None
        self.states[key] = FlagState(UNKNOWN, ts_ms, None)
        return FlagTransition(
            ts_ms, scope, scope_id, pool, before.level, UNKNOWN, None, reason, dict(evidence or {})
        )


def transition_rows(transitions: list[FlagTransition]) -> list[dict[str, Any]]:
    """FLAG_TRANSITIONS rows as plain dicts (what is published, as JSON)."""
    return [
        {
            "ts_ms": int(t.ts_ms),
            "scope": t.scope,
            "scope_id": t.scope_id,
            "pool": t.pool,
            "from_level": int(t.from_level),
            "to_level": int(t.to_level),
            "kv_free_ratio": None if t.kv_free_ratio is None else float(t.kv_free_ratio),
            "reason": t.reason,
            "evidence_json": json.dumps(t.evidence, sort_keys=True, default=str),
        }
        for t in transitions
    ]


def transitions_table(transitions: list[FlagTransition]) -> pa.Table:
    """FLAG_TRANSITIONS rows (storage schema) for storing."""
    return pa.Table.from_pylist(transition_rows(transitions), schema=FLAG_TRANSITIONS.storage_arrow)
