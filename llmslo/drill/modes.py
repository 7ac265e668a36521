"""The drill matrix as data: every failure mode, how it is injected, what counts as detection.

A :class:`DrillMode` names the simulator fault set on one pod (or the traffic shape that
produces the failure), and ``expected``: the finding signals (``slo_findings.signal``) or
``flag`` (an instance degradation flag rising above L0) that count as detecting it. The
expected signals come from the signal catalog (:mod:`slo.signals.catalog`): a row lists the
drill modes that should raise it. The table states what *should* see each mode, the drill
reports what did.

To add a mode: one row in :data:`MODES`, and its name in the ``drills`` of the catalog rows
that detect it. Modes with their own load shape or tap options
(``own_fleet``) get a fleet of their own; the others share one fleet, one pod each.
Modes with ``needs_gateway`` get a fleet with a gateway and router in front of its pods and
a prober through it; a fault of :data:`simulator.gateway.GATEWAY_FAULTS` is set on the
gateway (the mode's instance is then the gateway's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.gateway import GATEWAY_FAULTS
from slo.signals.catalog import FLAG, NOTICES, SIGNALS

__all__ = ["FAST_HOLD_S", "FLAG", "MODES", "DrillMode", "expected_signals", "matches"]


@dataclass(frozen=True)
class DrillMode:
    """One row of the failure matrix.

    ``fault``/``params``: the simulator fault set on the target pod(s) (``None``: the
    failure comes from the load alone). ``load``: extra :class:`simulator.load.LoadConfig`
    fields for its fleet's whole run (e.g. ``{"cancel_after_s": 2.0}``). ``extra_rate_per_s``: Poisson
    requests per second sent to the target pod alone while the mode is injected (a hot
    instance); ``extra_load``: more :class:`simulator.load.LoadConfig` fields for those
    requests alone. ``tap``: extra :class:`collectors.tap.config.TapConfig` fields. ``pool_scoped``: the failure is a pool's (every pod
    faulted; pool findings count). ``needs_gateway``: the fleet starts a gateway (with
    ``gateway``: :class:`simulator.config.GatewayConfig` fields) and a prober through it.
    ``front_end``: the fault is set on a front end (a P/D pair,
    a locality router, an autoscaler) in a fleet of its own (:mod:`llmslo.drill.fronts`); the
    finding is expected on that front end.
    """

    name: str
    fault: str | None
    expected: frozenset[str]
    params: Mapping[str, Any] = field(default_factory=dict)
    load: Mapping[str, Any] = field(default_factory=dict)
    tap: Mapping[str, Any] = field(default_factory=dict)
    pool_scoped: bool = False
    extra_rate_per_s: float = 0.0
    extra_load: Mapping[str, Any] = field(default_factory=dict)
    needs_gateway: bool = False
    gateway: Mapping[str, Any] = field(default_factory=dict)

    front_end: str | None = (
        None  # llmslo.drill.fronts.FRONT_END_FLEETS: the fault is the front end's
    )
    hold_s: float | None = None  # the fault's hold when shorter than the profile's hold_s

    @property
    def own_fleet(self) -> bool:
        """Whether the mode changes the fleet's load, its taps or its entry point, so it
        cannot share a fleet. Extra load alone (``extra_rate_per_s`` without a front end)
        shares: it enters through the target pod's own tap, so no other pod sees it."""
        return bool(
            self.load or self.tap or self.pool_scoped or self.needs_gateway or self.front_end
        )

    def hold(self, profile_hold_s: float) -> float:
        """Seconds the fault is held: the profile's ``hold_s``, or the mode's own when that
        is shorter (a profile compressed below it wins)."""
        return profile_hold_s if self.hold_s is None else min(self.hold_s, profile_hold_s)

    @property
    def on_gateway(self) -> bool:
        """Whether the fault is the gateway's (set on the gateway, scored on its instance)."""
        return self.needs_gateway and self.fault in GATEWAY_FAULTS


def expected_signals(mode: str) -> frozenset[str]:
    """The signals (and :data:`FLAG`) that detect ``mode``: the catalog rows that name it."""
    signals = {name for name, row in SIGNALS.items() if mode in row.drills}
    return frozenset(signals | ({FLAG} if mode in NOTICES[FLAG].drills else set()))


#: The hold of modes detected within seconds in every full matrix so far (gateway and router
#: down ≤ 12.6 s, retry storm 3.1 s, KV-transfer timeout 3.8 s, stale KV index 4.7 s): more
#: than twice the slowest, and longer than the 20-s entry/gateway windows.
FAST_HOLD_S = 30.0


def _mode(name: str, fault: str | None, **kwargs: Any) -> DrillMode:
    return DrillMode(name, fault, expected_signals(name), **kwargs)


MODES: dict[str, DrillMode] = {
    m.name: m
    for m in (
        _mode("stall", "stall"),
        # The engine takes requests and never schedules them: running 0, waiting grows,
        # tokens flat, /health 200 (the stall family's second kind).
        _mode("wedge_waiting", "wedge"),
        # Climbs through L1 (free < 10 %), L2 (< 5 %) and L3 (< 1 %) in about 35 s.
        _mode(
            "kv_leak",
            "kv_leak",
            params={"blocks_per_s": 60, "max_fraction": 0.995},
        ),
        _mode("fragmentation", "fragmentation"),
        _mode("preemption_cascade", "preemption_cascade"),
        # Ghosts need clients that go away: from injection, the pod gets two pods' shares more
        # of requests whose clients cancel after 1 s (before, nobody cancels: in a fleet whose
        # every client hangs up, the availability SLO burns from the start, rightly).
        _mode(
            "ghost",
            "ghost",
            extra_rate_per_s=3.0,
            extra_load={"cancel_after_s": 1.0},
        ),
        # Three times a pod's share on top, on one pod, from injection to removal.
        _mode("hot_instance", None, extra_rate_per_s=4.5),
        _mode("slow_prefill", "slow_prefill", params={"factor": 5}),
        _mode("slow_decode", "slow_decode", params={"factor": 5}),
        _mode("itl_jitter", "itl_jitter", params={"mean_ms": 60}),
        _mode("nan_burst", "nan_burst", params={"fraction": 0.3}),
        _mode("not_ready", "not_ready"),
        _mode("crash", "crash"),
        _mode("xid", "xid", params={"code": 79}),
        # The gateway (the tap) retries failed first attempts: 3 attempts per request.
        _mode(
            "retry_storm",
            "prefill_failure",
            params={"fraction": 0.6},
            tap={"max_attempts": 3},
            pool_scoped=True,
            hold_s=FAST_HOLD_S,
        ),
        _mode("prefill_failure", "prefill_failure", params={"fraction": 0.5}),
        _mode(
            "failure_after_first_token",
            "failure_after_first_token",
            params={"fraction": 0.5, "after_tokens": 3},
        ),
        _mode(
            "model_load_failure",
            "model_load_failure",
        ),
        # In front of the taps: only the prober (and the gateway's own scrape) can see these.
        _mode("gateway_down", "gateway_down", needs_gateway=True, hold_s=FAST_HOLD_S),
        # fail_close: the router's outage is visible (503 router_unavailable) instead of
        # silently routing blind (fail_open) or shedding as if overloaded (reject, 429).
        _mode(
            "router_down",
            "router_down",
            needs_gateway=True,
            gateway={"router_down_policy": "fail_close"},
            hold_s=FAST_HOLD_S,
        ),
        # The same outage behind llm-d-router's EPP (both name generations at once) and
        # behind NVIDIA Dynamo's frontend: the router's names change, the finding does not.
        _mode(
            "router_down_llm_d",
            "router_down",
            needs_gateway=True,
            gateway={"router_down_policy": "fail_close", "router_names": "llm-d-router"},
            hold_s=FAST_HOLD_S,
        ),
        _mode(
            "router_down_dynamo",
            "router_down",
            needs_gateway=True,
            gateway={"router_down_policy": "fail_close", "router_names": "dynamo"},
            hold_s=FAST_HOLD_S,
        ),
        _mode(
            "gateway_down_dynamo",
            "gateway_down",
            needs_gateway=True,
            gateway={"router_names": "dynamo"},
            hold_s=FAST_HOLD_S,
        ),
        # Front ends (llmslo/drill/fronts.py). Half the transfers hang 2 s and fail, a third of
        # those leak their blocks.
        _mode(
            "kv_transfer_timeout",
            "kv_transfer_timeout",
            params={"fraction": 0.5, "timeout_s": 2.0, "cleanup_fail_fraction": 0.3},
            front_end="pd",
            hold_s=FAST_HOLD_S,
        ),
        # Conversations of four turns through a prefix-locality router.
        _mode(
            "stale_kv_index",
            "stale_kv_index",
            load={"conversation_turns": 4},
            front_end="locality",
            hold_s=FAST_HOLD_S,
        ),
        # A load ramp (+3 req/s) arrives with the fault: each scale-out takes 60 s longer.
        _mode(
            "autoscaler_lag",
            "autoscaler_lag",
            params={"lag_s": 60},
            extra_rate_per_s=3.0,
            front_end="autoscaler",
        ),
    )
}


def matches(expected: frozenset[str], signal: str) -> bool:
    """Whether ``signal`` is one of ``expected`` (a trailing ``*`` matches a prefix)."""
    return any(signal.startswith(e[:-1]) if e.endswith("*") else signal == e for e in expected)
