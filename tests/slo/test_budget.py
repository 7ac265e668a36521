"""Property tests for the error-budget maths (count-based, never NaN)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from slo.budget import WindowCounts, budget_remaining, burn_rate, error_ratio, pair_alerting

objectives = st.floats(min_value=0.5, max_value=0.99999)


@st.composite
def counts(draw: st.DrawFn) -> WindowCounts:
    total = draw(st.integers(0, 10**9))
    return WindowCounts(total, draw(st.integers(0, total)))


@given(counts(), objectives)
def test_burn_rate_is_error_ratio_over_the_budget(c: WindowCounts, objective: float) -> None:
    rate = burn_rate(c, objective)
    ratio = error_ratio(c)
    assert not math.isnan(rate)
    if ratio is None:
        assert rate == 0.0 and c.total == 0
    else:
        assert math.isclose(rate, ratio / (1 - objective), rel_tol=1e-12)


@given(counts(), objectives, st.integers(1, 10**6))
def test_budget_never_increases_when_bad_events_are_added(
    c: WindowCounts, objective: float, extra: int
) -> None:
    worse = c + WindowCounts(extra, extra)
    assert budget_remaining(worse, objective) <= budget_remaining(c, objective) + 1e-12


@given(objectives)
def test_empty_windows_give_no_nan(objective: float) -> None:
    empty = WindowCounts()
    assert error_ratio(empty) is None
    assert burn_rate(empty, objective) == 0.0
    assert budget_remaining(empty, objective) == 1.0
    assert not pair_alerting(empty, empty, objective, 14.4)


@given(counts(), counts(), counts())
def test_window_merges_are_associative_and_commutative(
    a: WindowCounts, b: WindowCounts, c: WindowCounts
) -> None:
    assert (a + b) + c == a + (b + c)
    assert a + b == b + a
    assert a + WindowCounts() == a


@given(st.lists(counts(), min_size=1, max_size=20), objectives)
def test_long_window_ratio_is_ratio_of_sums_not_mean_of_ratios(
    parts: list[WindowCounts], objective: float
) -> None:
    merged = sum(parts, WindowCounts())
    total = sum(p.total for p in parts)
    bad = sum(p.bad for p in parts)
    assert merged == WindowCounts(total, bad)
    if total:
        assert math.isclose(
            burn_rate(merged, objective), bad / total / (1 - objective), rel_tol=1e-12
        )


def test_min_events_guard_holds_back_a_low_traffic_page() -> None:
    # 10 requests per hour, one failure in the last five minutes: a 1000× burn on 99.99 %.
    long, short = WindowCounts(10, 1), WindowCounts(1, 1)
    assert pair_alerting(short, long, 0.999, 14.4)
    assert not pair_alerting(short, long, 0.999, 14.4, min_events=100)
