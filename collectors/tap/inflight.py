"""Per-upstream in-flight streams and client disconnects: the tap's ghost evidence.

The SLO engine reconciles these with the engine's own running count and abort counter
(DESIGN §3, ghost evidence a and b), so they are published as ``ENGINE_SAMPLES`` rows
with dialect ``tap`` and the canonical signals ``tap_in_flight`` / ``tap_disconnects``.
Beside them go the tap's own health (``tap_loop_lag``, ``tap_gc_pause``,
``tap_cpu_throttled``) and ``tap_uncertain_requests``, so a burn the tap's lateness caused
can be told from one the engine caused.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["DISCONNECTS_METRIC", "IN_FLIGHT_METRIC", "UNCERTAIN_METRIC", "InFlightTracker"]

IN_FLIGHT_METRIC = "llmslo_tap_in_flight"
DISCONNECTS_METRIC = "llmslo_tap_disconnects_total"
UNCERTAIN_METRIC = "llmslo_tap_uncertain_requests_total"

#: (metric, signal, kind, value): one of the tap's own health figures, per sample row.
HealthSample = tuple[str, str, str, float]


class InFlightTracker:
    """Counts open upstream streams and cumulative client disconnects per instance."""

    def __init__(self, instances: list[str], addresses: dict[str, str] | None = None) -> None:
        #: instance → host:port, for the samples' ``address`` column.
        self.addresses = dict(addresses or {})
        self.in_flight: Counter[str] = Counter({instance: 0 for instance in instances})
        self.disconnects: Counter[str] = Counter({instance: 0 for instance in instances})
        self.uncertain: Counter[str] = Counter({instance: 0 for instance in instances})
        self.pools: dict[str, str] = {}

    def opened(self, instance: str, pool: str | None) -> None:
        self.in_flight[instance] += 1
        if pool:
            self.pools[instance] = pool

    def closed(self, instance: str) -> None:
        self.in_flight[instance] -= 1

    def disconnected(self, instance: str) -> None:
        self.disconnects[instance] += 1

    def uncertain_gaps(self, instance: str) -> None:
        self.uncertain[instance] += 1

    def samples(
        self, ts_ms: int, tap_id: str, health: Sequence[HealthSample] = ()
    ) -> list[dict[str, Any]]:
        """``ENGINE_SAMPLES`` rows (plain values) for every known instance at ``ts_ms``;
        ``health`` (the tap's own figures) is repeated on each instance's rows."""
        labels = json.dumps({"tap_id": tap_id}, sort_keys=True)
        rows = []
        for instance in sorted(self.in_flight):
            pool = self.pools.get(instance)
            for metric, signal, kind, value in (
                (IN_FLIGHT_METRIC, "tap_in_flight", "gauge", self.in_flight[instance]),
                (DISCONNECTS_METRIC, "tap_disconnects", "counter", self.disconnects[instance]),
                (UNCERTAIN_METRIC, "tap_uncertain_requests", "counter", self.uncertain[instance]),
                *health,
            ):
                rows.append(
                    {
                        "ts_ms": ts_ms,
                        "instance": instance,
                        "pool": pool,
                        "dialect": "tap",
                        "model": pool,
                        "engine": "",
                        "metric": metric,
                        "signal": signal,
                        "kind": kind,
                        "le": None,
                        "labels_json": labels,
                        "value": float(value),
                        "address": self.addresses.get(instance),
                    }
                )
        return rows
