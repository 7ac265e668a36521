"""A faulted SLO history for the path B tests: one TTFT SLO, requests every 10 s in a real
DuckDB file, 2 h healthy then 10 min at TTFT 5 s (every window pair of the 30-day catalog
burns; 35 more healthy minutes clear the pages, the tickets stay)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alerts.pusher import AlertPusher
from pipeline.store import Store
from pipeline.units import MINUTE_MS
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.slo.factories import T0_MS, insert, request

SPEC = {
    "version": "llmslo/v1",
    "service": "chat",
    "labels": {"team": "serving"},
    "slos": [
        {
            "name": "ttft",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0, "source": "tap"},
            "group_by": ["pool"],
        }
    ],
}
MODEL = build_model(parse_spec(SPEC))
POOL = "llama-3-8b"


def requests_between(start_ms: int, end_ms: int, ttft_s: float) -> list[dict[str, Any]]:
    """One ok request every 10 s in ``[start_ms, end_ms)`` with this TTFT (seconds)."""
    return [request(ts, ttft_s=ttft_s) for ts in range(start_ms, end_ms, 10_000)]


def store_with_fault(path: Path) -> Store:
    """A new DuckDB file holding the healthy 2 h and the 10-minute fault ending at T0 + 10 min."""
    store = Store(path)
    insert(
        store,
        requests_between(T0_MS - 120 * MINUTE_MS, T0_MS, 0.3)
        + requests_between(T0_MS, T0_MS + 10 * MINUTE_MS, 5.0),
    )
    return store


def firing_windows(pusher: AlertPusher) -> set[tuple[str, str]]:
    """(severity, window) of every alert the pusher holds as firing."""
    return {(a.labels["severity"], a.labels["window"]) for a in pusher.state.firing}
