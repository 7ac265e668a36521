"""The taps' verdicts on requests' own targets beside the router's violation counter, per
pool and type, over one window, on a real DuckDB file."""

from __future__ import annotations

import json

from pipeline.store import Store
from pipeline.units import MINUTE_MS
from slo.own_targets import ViolationComparison, compare_violations
from tests.slo.factories import T0_MS, engine_sample, insert, request

POOL = "llama-3-8b"


def _router(ts_ms: int, kind: str, value: float) -> dict:
    return engine_sample(
        ts_ms,
        "gateway_slo_violations",
        value,
        instance="epp:9090",
        dialect="epp",
        metric="llm_d_epp_request_slo_violation_total",
        kind="counter",
        engine="",
        labels_json=json.dumps({"target_model_name": POOL, "type": kind}, sort_keys=True),
    )


def test_tap_and_router_violations_are_set_side_by_side_per_pool_and_type(
    store: Store,
) -> None:
    start, end = T0_MS, T0_MS + 10 * MINUTE_MS
    insert(
        store,
        requests=[
            request(start + 1, slo_ttft_s=0.5, ttft_s=0.4, slo_met=True),
            request(start + 2, slo_ttft_s=0.5, ttft_s=0.9, slo_tpot_s=0.05, slo_met=False),
            request(start + 3, slo_tpot_s=0.01, tpot_s=0.03, slo_met=False),
            request(start + 4, ttft_s=9.0),  # no targets: neither side counts it
            request(end + 1, slo_ttft_s=0.1, ttft_s=9.0, slo_met=False),  # after the window
            request(start + 5, slo_ttft_s=0.1, ttft_s=9.0, source="probe"),  # not a user's
        ],
        engine=[
            _router(start - MINUTE_MS, "ttft", 10),  # before the window: the baseline
            _router(start + MINUTE_MS, "ttft", 12),
            _router(start + 2 * MINUTE_MS, "ttft", 1),  # the router restarted
            _router(start - MINUTE_MS, "tpot", 4),
            _router(start + MINUTE_MS, "tpot", 4),
            _router(end + MINUTE_MS, "tpot", 9),  # after the window
        ],
    )
    assert compare_violations(store.con, start, end) == [
        ViolationComparison(POOL, "tpot", 2, 1, 0.0),
        ViolationComparison(POOL, "ttft", 2, 1, 3.0),
    ]


def test_a_pool_without_a_router_counter_says_so(store: Store) -> None:
    insert(store, requests=[request(T0_MS, slo_ttft_s=0.5, ttft_s=0.9, slo_met=False)])
    (only,) = compare_violations(store.con, T0_MS, T0_MS + MINUTE_MS)
    assert only == ViolationComparison(POOL, "ttft", 1, 1, None)
