"""Per-upstream in-flight streams and client disconnects: the tap's ghost evidence.

The SLO engine reconciles these with the engine's own running count and abort counter
(DESIGN §3, ghost evidence a and b), so they are published as ``ENGINE_SAMPLES`` rows
with dialect ``tap`` and the canonical signals ``tap_in_flight`` / ``tap_disconnects``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

__all__ = ["DISCONNECTS_METRIC", "IN_FLIGHT_METRIC", "InFlightTracker"]

IN_FLIGHT_METRIC = "llmslo_tap_in_flight"
DISCONNECTS_METRIC = "llmslo_tap_disconnects_total"


class InFlightTracker:
    """Counts open upstream streams and cumulative client disconnects per instance."""

    def __init__(self, instances: list[str], addresses: dict[str, str] | None = None) -> None:
        #: instance → host:port, for the samples' ``address`` column.
        self.addresses = dict(addresses or {})
        self.in_flight: Counter[str] = Counter({instance: 0 for instance in instances})
        self.disconnects: Counter[str] = Counter({instance: 0 for instance in instances})
        self.pools: dict[str, str] = {}

    def opened(self, instance: str, pool: str | None) -> None:
        self.in_flight[instance] += 1
        if pool:
            self.pools[instance] = pool

    def closed(self, instance: str) -> None:
        self.in_flight[instance] -= 1

    def disconnected(self, instance: str) -> None:
        self.disconnects[instance] += 1

    def samples(self, ts_ms: int, tap_id: str) -> list[dict[str, Any]]:
        """``ENGINE_SAMPLES`` rows (plain values) for every known instance at ``ts_ms``."""
        labels = json.dumps({"tap_id": tap_id}, sort_keys=True)
        rows = []
        for instance in sorted(self.in_flight):
            pool = self.pools.get(instance)
            for metric, signal, kind, value in (
                (IN_FLIGHT_METRIC, "tap_in_flight", "gauge", self.in_flight[instance]),
                (DISCONNECTS_METRIC, "tap_disconnects", "counter", self.disconnects[instance]),
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
