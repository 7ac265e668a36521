"""A counter's increase over a window, the one way every detector computes it.

Checked against a reference written the obvious way (a loop over the samples with
Prometheus' reset rule: a value below the one before is a restart from 0, so the new value
is all increase).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slo.signals.snapshot import Series

Samples = list[tuple[int, float]]


def inside(ts_ms: int, start_ms: int | None, end_ms: int | None) -> bool:
    return (start_ms is None or ts_ms >= start_ms) and (end_ms is None or ts_ms <= end_ms)


def reference_increase(samples: Samples, start_ms: int | None, end_ms: int | None) -> float:
    """Sum of the steps between consecutive samples inside [start_ms, end_ms]."""
    total, previous = 0.0, None
    for ts, value in samples:
        if not inside(ts, start_ms, end_ms):
            continue
        if previous is not None:
            total += value if value < previous else value - previous
        previous = value
    return total


def as_series(samples: Samples) -> Series:
    return Series(np.array([ts for ts, _ in samples], np.int64), np.array([v for _, v in samples]))


@st.composite
def counters(draw: st.DrawFn) -> Samples:
    """A counter scraped at increasing times, rising by steps and sometimes reset."""
    gaps = draw(st.lists(st.integers(1, 30_000), max_size=40))
    times = list(itertools.accumulate(gaps, initial=draw(st.integers(0, 10**6))))
    value, samples = draw(st.floats(0, 1e6)), []
    for ts in times:
        samples.append((ts, value))
        if draw(st.booleans()) and draw(st.integers(0, 9)) == 0:
            value = draw(st.floats(0, value))  # a restart: the counter starts again lower
        else:
            value += draw(st.one_of(st.just(0.0), st.floats(0, 1e4)))
    return samples


windows = st.tuples(
    st.one_of(st.none(), st.integers(0, 2 * 10**6)), st.one_of(st.none(), st.integers(0, 2 * 10**6))
)


@given(counters(), windows)
def test_the_increase_over_a_window_is_the_reference_one(
    samples: Samples, window: tuple[int | None, int | None]
) -> None:
    start_ms, end_ms = window
    got = as_series(samples).increase(start_ms, end_ms)
    assert got == pytest.approx(reference_increase(samples, start_ms, end_ms), rel=1e-9, abs=1e-6)
    assert got >= 0


@given(counters(), st.data())
def test_increases_over_adjacent_windows_add_up(samples: Samples, data: st.DataObject) -> None:
    if not samples:
        return
    a, b, c = sorted(data.draw(st.lists(st.sampled_from(samples), min_size=3, max_size=3)))
    series = as_series(samples)
    whole = series.increase(a[0], c[0])
    assert series.increase(a[0], b[0]) + series.increase(b[0], c[0]) == pytest.approx(
        whole, rel=1e-9, abs=1e-6
    )


@given(counters(), st.data())
def test_interpolated_increase_between_two_scrapes_is_the_increase_between_them(
    samples: Samples, data: st.DataObject
) -> None:
    if len(samples) < 2:
        return
    first, last = sorted(data.draw(st.lists(st.sampled_from(samples), min_size=2, max_size=2)))
    series = as_series(samples)
    got = series.increase(first[0], last[0], interpolate=True)
    assert got == pytest.approx(series.increase(first[0], last[0]), rel=1e-9, abs=1e-6)


def test_interpolated_increase_takes_the_share_of_a_step_its_window_covers() -> None:
    series = as_series([(0, 0.0), (10_000, 10.0), (20_000, 30.0), (30_000, 5.0)])
    assert series.increase(5_000, 15_000, interpolate=True) == pytest.approx(5.0 + 10.0)
    assert series.increase(25_000, 30_000, interpolate=True) == pytest.approx(2.5)  # a reset
    assert series.increase(-5_000, 40_000, interpolate=True) == pytest.approx(35.0)


@given(counters(), windows)
def test_a_counter_created_in_the_window_counts_its_first_value_as_increase(
    samples: Samples, window: tuple[int | None, int | None]
) -> None:
    start_ms, end_ms = window
    got = as_series(samples).increase(start_ms, end_ms, from_zero=True)
    created_inside = bool(samples) and inside(samples[0][0], start_ms, end_ms)
    expected = reference_increase(samples, start_ms, end_ms)
    expected += samples[0][1] if created_inside else 0.0
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-6)


def test_the_examples_an_sre_would_check_by_hand() -> None:
    series = as_series([(0, 5.0), (1_000, 8.0), (2_000, 2.0), (3_000, 4.0)])
    assert series.increase() == 3.0 + 2.0 + 2.0  # the drop to 2 is a restart: +2, not −6
    assert series.increase(1_000, 2_000) == 2.0
    assert series.increase(4_000) == 0.0  # no sample in the window
    assert series.increase(0, 0) == 0.0  # one sample: no increase seen
    assert series.increase(0, 0, from_zero=True) == 5.0  # …unless it was created there
    assert series.increase(1_000, from_zero=True) == 2.0 + 2.0  # created before the window
