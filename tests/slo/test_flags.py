"""The L0–L3 state machine: enter fast, leave after hysteresis and dwell, never flap."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo.flags import FlagBoard, FlagPolicy, FlagState, step, strict_level, transitions_table

POLICY = FlagPolicy(dwell_s=60)
S = 1000


@pytest.mark.parametrize(
    ("free", "level"),
    [(0.5, 0), (0.099, 1), (0.049, 2), (0.009, 3), (0.10, 0), (0.0, 3)],
    ids=["plenty", "below 10 %", "below 5 %", "below 1 %", "exactly 10 % is fine", "full"],
)
def test_each_level_is_entered_on_the_first_observation(free: float, level: int) -> None:
    board = FlagBoard(POLICY)
    board.observe(0, "pool", "p", "p", 0.5)
    transition = board.observe(15 * S, "pool", "p", "p", free)
    assert board.level("pool", "p") == level
    assert (transition is None) == (level == 0)
    if transition:
        assert transition.to_level == level and transition.reason == f"kv_free_below_l{level}"
        assert transition.evidence["thresholds"]["l1_free"] == 0.10


def test_oom_risk_forces_l3_and_pins_it() -> None:
    board = FlagBoard(POLICY)
    t = board.observe(0, "instance", "i", "p", 0.5, oom_risk=True, evidence={"xid": 79})
    assert t is not None and t.to_level == 3 and t.reason == "oom_risk" and t.evidence["xid"] == 79
    for second in range(1, 600, 15):
        assert board.observe(second * S, "instance", "i", "p", 0.5, oom_risk=True) is None
    assert board.level("instance", "i") == 3


def test_leaving_needs_the_margin_and_the_dwell_time() -> None:
    board = FlagBoard(POLICY)
    board.observe(0, "pool", "p", "p", 0.04)  # L2
    # 0.06 clears 5 % but not 5 % + 2 %: stays L2 however long
    for second in range(15, 400, 15):
        assert board.observe(second * S, "pool", "p", "p", 0.06) is None
    # 0.08 clears L2's margin (but not L1's): L1 only after 60 s of calm
    assert board.observe(400 * S, "pool", "p", "p", 0.08) is None
    assert board.observe(445 * S, "pool", "p", "p", 0.08) is None
    t = board.observe(460 * S, "pool", "p", "p", 0.08)
    assert t is not None and (t.from_level, t.to_level, t.reason) == (
        2,
        1,
        "recovered_dwell_elapsed",
    )


def test_a_dip_during_the_calm_restarts_the_dwell() -> None:
    board = FlagBoard(POLICY)
    board.observe(0, "pool", "p", "p", 0.08)  # L1
    board.observe(100 * S, "pool", "p", "p", 0.5)
    board.observe(140 * S, "pool", "p", "p", 0.11)  # back inside the margin
    assert board.observe(165 * S, "pool", "p", "p", 0.5) is None
    assert board.observe(220 * S, "pool", "p", "p", 0.5) is None
    assert board.observe(225 * S, "pool", "p", "p", 0.5) is not None


def test_missing_data_changes_nothing() -> None:
    state = FlagState(2, 0, None)
    assert step(POLICY, state, 10_000 * S, None) == (state, None)


@given(st.lists(st.tuples(st.integers(1, 120), st.floats(0, 1), st.booleans()), max_size=80))
def test_properties_of_any_observation_sequence(
    observations: list[tuple[int, float, bool]],
) -> None:
    board = FlagBoard(POLICY)
    ts = 0
    last_change = None
    level = 0
    for gap_s, free, oom in observations:
        ts += gap_s * S
        transition = board.observe(ts, "pool", "p", "p", free, oom_risk=oom)
        # enter fast: never below what the ratio calls for
        assert board.level("pool", "p") >= strict_level(POLICY, free, oom)
        if transition is not None:
            assert transition.from_level == level and transition.to_level != level
            if transition.to_level < level:  # leave slowly: the previous level lasted ≥ dwell
                assert last_change is None or ts - last_change >= POLICY.dwell_s * S
                assert not oom
            level, last_change = transition.to_level, ts
        assert board.level("pool", "p") == level


@given(st.floats(0.02, 0.9), st.lists(st.floats(-0.0199, 0.0199), min_size=1, max_size=100))
def test_noise_smaller_than_the_margin_causes_at_most_one_transition_each_way(
    centre: float, noise: list[float]
) -> None:
    board = FlagBoard(POLICY)
    changes = [
        t
        for i, n in enumerate(noise)
        if (t := board.observe(i * 15 * S, "pool", "p", "p", min(1.0, max(0.0, centre + n))))
        is not None
    ]
    ups = [t for t in changes if t.to_level > t.from_level]
    downs = [t for t in changes if t.to_level < t.from_level]
    assert len(downs) <= len(ups) <= 3
    assert all(
        later.ts_ms - earlier.ts_ms >= POLICY.dwell_s * S
        for earlier, later in itertools.pairwise(changes)
        if later.to_level < later.from_level
    )


def test_policy_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="l3_free < l2_free < l1_free"):
        FlagPolicy(l1_free=0.05, l2_free=0.10)


def test_transitions_become_flag_transition_rows() -> None:
    board = FlagBoard(POLICY)
    t = board.observe(5, "instance", "10.0.0.1:8000", "llama", 0.004, evidence={"kv_usage": 0.996})
    assert t is not None
    table = transitions_table([t])
    row = table.to_pylist()[0]
    assert (
        row["to_level"] == 3
        and row["scope"] == "instance"
        and '"kv_usage": 0.996' in row["evidence_json"]
    )
