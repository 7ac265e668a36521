"""The degradation decision (pure): levels per scope, L1–L3 actions, staleness, the estimate."""

from __future__ import annotations

import pytest

from collectors.tap.degradation import (
    DegradationConfig,
    Degrader,
    FlagFollower,
    FlagSnapshot,
    estimate_prompt_tokens,
)

POOL, ME, OTHER = "llama", "10.0.0.1:8000", "10.0.0.2:8000"
LONG = 16_384 * 4 + 4  # body bytes just over the 16K-token default
SHORT = 2_000


def degrader(levels: dict[tuple[str, str], int], heard_s: float | None = 0.0, **cfg: object):
    snapshot = FlagSnapshot(levels, heard_s)
    return Degrader(DegradationConfig.model_validate(cfg), lambda: snapshot, lambda: 1.0)


@pytest.mark.parametrize(
    ("levels", "body", "max_tokens", "expected"),
    [
        ({}, LONG, 9999, (0, None, False, False)),
        ({("instance", ME): 1}, LONG, 9999, (1, "degradation_header", False, False)),
        ({("pool", POOL): 2}, SHORT, 100, (2, "degradation_header", False, False)),
        ({("pool", POOL): 2}, LONG, 100, (2, "rejected_long_prompt", True, False)),
        ({("instance", ME): 2}, SHORT, 4097, (2, "rejected_max_tokens", True, False)),
        ({("instance", ME): 3}, LONG, None, (3, "rejected_long_prompt", True, False)),
        ({("instance", ME): 3}, SHORT, None, (3, "degradation_header", False, False)),
        ({("instance", OTHER): 3, ("pool", "other-pool"): 3}, LONG, None, (0, None, False, False)),
    ],
    ids=[
        "no flags: nothing",
        "L1 on my instance: header only, long prompts pass",
        "L2 on my pool: a short prompt passes with the header",
        "L2: a long prompt is rejected",
        "L2: max_tokens over the cap is rejected",
        "L3 without a fallback acts as L2: long prompt rejected",
        "L3 without a fallback acts as L2: short prompt passes",
        "levels of other instances and pools do not apply",
    ],
)
def test_actions_by_level(levels, body, max_tokens, expected) -> None:
    e = degrader(levels).enforce(POOL, [ME], body, max_tokens)
    assert (e.level, e.action, e.reject, e.fallback) == expected


def test_l3_with_a_fallback_routes_there() -> None:
    d = degrader({("pool", POOL): 3}, fallback_upstream="http://10.0.0.9:8000/")
    e = d.enforce(POOL, [ME], LONG, 99_999)
    assert (e.level, e.action, e.fallback, e.reject) == (3, "fallback_upstream", True, False)


@pytest.mark.parametrize("heard_s", [None, 1.0 - 60.5], ids=["never heard", "heard 60.5 s ago"])
def test_stale_flags_fail_open(heard_s: float | None) -> None:
    e = degrader({("pool", POOL): 2}, heard_s=heard_s).enforce(POOL, [ME], LONG, 99_999)
    assert (e.level, e.action, e.reject) == (None, "fail_open", False)


def test_follower_keeps_the_latest_transition_per_scope() -> None:
    class Never:
        def poll(self, timeout_s: float) -> list:
            return []

        def close(self) -> None:
            pass

    follower = FlagFollower(Never())
    follower.apply(
        [
            {"scope": "instance", "scope_id": ME, "ts_ms": 2, "to_level": 2},
            {"scope": "instance", "scope_id": ME, "ts_ms": 1, "to_level": 3},  # older, late
            {"scope": "pool", "scope_id": POOL, "ts_ms": 5, "to_level": 1},
        ],
        heard_s=7.0,
    )
    snap = follower.current()
    assert snap.levels == {("instance", ME): 2, ("pool", POOL): 1} and snap.heard_s == 7.0
    assert snap.level(POOL, [ME], now_s=8.0, staleness_s=60) == 2


def test_prompt_estimate_from_body_bytes() -> None:
    assert estimate_prompt_tokens(65_536, 4.0) == 16_384
    assert estimate_prompt_tokens(65_537, 4.0) == 16_385


def test_fallback_must_be_a_url() -> None:
    with pytest.raises(ValueError, match="fallback_upstream"):
        DegradationConfig(fallback_upstream="10.0.0.9:8000")
