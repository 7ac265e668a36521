"""The latency-shift test of a whole pool at once (``slo.signals._shift``) finds what the
instance-by-instance computation it replaced found: the same instances, bases and numbers,
on generated pools (ties, tiny pools, unknown, constant and negative prompt lengths)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import mannwhitneyu

from slo.signals._order import LeftOut, RangeSelect
from slo.signals._shift import Shift, ShiftTest, shifted
from slo.signals.detectors import DetectorConfig
from slo.signals.latency import detect_slow_prefill
from tests.slo.signals.test_pool_baseline import pod, pool

Samples = dict[str, np.ndarray]
Lengths = dict[str, np.ndarray | None]

# --- the computation before: one instance at a time against the concatenated rest -------


def _by_prompt_length(
    mine: np.ndarray, mine_prompts: np.ndarray, pool: np.ndarray, pool_prompts: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    if (mine_prompts < 0).any() or (pool_prompts < 0).any() or np.ptp(pool_prompts) == 0:
        return None
    edges = np.quantile(pool_prompts, np.linspace(0, 1, 11)[1:-1])
    bins = np.searchsorted(edges, pool_prompts)
    points = [
        (np.median(pool_prompts[bins == b]), np.median(pool[bins == b])) for b in np.unique(bins)
    ]
    xs, ys = np.array(points).T
    slope, intercept = np.polyfit(xs, ys, 1) if len(xs) > 1 else (0.0, float(ys[0]))
    if slope < 0:
        slope, intercept = 0.0, float(np.median(pool))
    floor = 0.1 * float(np.median(pool))
    if floor <= 0:
        return None

    def expected(prompts: np.ndarray) -> np.ndarray:
        return np.maximum(intercept + slope * prompts, floor)

    return mine / expected(mine_prompts), pool / expected(pool_prompts)


def _scaled(
    instance: str, samples: Samples, lengths: Lengths
) -> tuple[np.ndarray, np.ndarray] | None:
    known = {i: p for i, p in lengths.items() if p is not None and len(p) == len(samples[i])}
    if not known or len(known) != len(samples):
        return None
    others = [i for i in samples if i != instance]
    return _by_prompt_length(
        samples[instance],
        known[instance],
        np.concatenate([samples[i] for i in others]),
        np.concatenate([known[i] for i in others]),
    )


def reference(
    samples: Samples, lengths: Lengths | None, test: ShiftTest
) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for instance, mine in samples.items():
        rest = [v for other, v in samples.items() if other != instance]
        if len(mine) < test.min_samples or not rest:
            continue
        pool = np.concatenate(rest)
        if len(pool) < test.min_samples:
            continue
        raw_medians = float(np.median(mine)), float(np.median(pool))
        if raw_medians[0] - raw_medians[1] < test.min_shift_s:
            continue
        scaled = _scaled(instance, samples, lengths or {})
        basis = "mann_whitney" if scaled is None else "mann_whitney_by_prompt_length"
        if scaled is not None:
            mine, pool = scaled
        mine_median, pool_median = float(np.median(mine)), float(np.median(pool))
        if pool_median <= 0 or mine_median / pool_median < test.median_ratio:
            continue
        result = mannwhitneyu(mine, pool, alternative="greater")
        if result.pvalue >= test.p_value:
            continue
        found.append(
            (
                instance,
                basis,
                {
                    "median_s": raw_medians[0],
                    "pool_median_s": raw_medians[1],
                    "median_ratio": mine_median / pool_median,
                    "prob_superiority": float(result.statistic) / (len(mine) * len(pool)),
                    "p_value": float(result.pvalue),
                    "n": len(mine),
                    "pool_n": len(pool),
                },
            )
        )
    return found


# --- generated pools -----------------------------------------------------------------------


def generated_pool(
    seed: int, prompts: str, ties: bool, big: bool
) -> tuple[Samples, Lengths | None]:
    """Instance → values and instance → prompt lengths (or None) of one pool; some instances
    slower than the rest, sizes from 0 up."""
    rng = np.random.default_rng(seed)
    count = int(rng.integers(2, 30 if big else 8))
    samples: Samples = {}
    lengths: Lengths = {}
    for i in range(count):
        size = int(rng.integers(0, 400 if big else 45))
        if prompts == "constant":
            tokens = np.full(size, 128.0)
        elif ties:
            tokens = rng.integers(1, 12, size).astype(float) * 100
        else:
            tokens = rng.integers(1, 5000, size).astype(float)
        slow = float(rng.choice([1.0, 1.0, 1.0, 1.4, 2.0, 3.5]))
        if ties:
            values = rng.integers(1, 9, size) / 10 * slow
        else:
            values = (0.05 + 0.0002 * tokens) * rng.lognormal(0, 0.3, size) * slow
        if rng.random() < 0.05 and size:
            values[0] = 0.0
        samples[f"10.0.0.{i}:8000"] = values
        if prompts == "unknown":
            lengths[f"10.0.0.{i}:8000"] = np.full(size, -1.0)
        elif prompts == "one_unknown" and i == 0:
            lengths[f"10.0.0.{i}:8000"] = None
        elif prompts == "mismatched" and i == 1:
            lengths[f"10.0.0.{i}:8000"] = tokens[:-1]
        else:
            lengths[f"10.0.0.{i}:8000"] = tokens
    return samples, None if prompts == "none" else lengths


def _same(new: list[Shift], old: list[tuple[str, str, dict[str, Any]]]) -> None:
    assert [(s.instance, s.basis) for s in new] == [(i, b) for i, b, _ in old]
    for shift, (_, _, evidence) in zip(new, old, strict=True):
        for name, value in evidence.items():
            assert math.isclose(getattr(shift, name), value, rel_tol=1e-9, abs_tol=1e-300), name


TESTS = st.builds(
    ShiftTest,
    st.sampled_from([5, 8, 9, 20]),
    st.sampled_from([1e-3, 0.05, 0.6]),
    st.sampled_from([1.01, 1.2, 1.5]),
    st.sampled_from([0.0, 0.01]),
)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    prompts=st.sampled_from(["none", "known", "unknown", "one_unknown", "mismatched", "constant"]),
    ties=st.booleans(),
    test=TESTS,
)
def test_a_small_pool_finds_what_the_instance_by_instance_test_found(
    seed: int, prompts: str, ties: bool, test: ShiftTest
) -> None:
    samples, lengths = generated_pool(seed, prompts, ties, big=False)
    _same(shifted(samples, lengths, test), reference(samples, lengths, test))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    prompts=st.sampled_from(["none", "known"]),
    ties=st.booleans(),
    test=TESTS,
)
def test_a_large_pool_finds_what_the_instance_by_instance_test_found(
    seed: int, prompts: str, ties: bool, test: ShiftTest
) -> None:
    samples, lengths = generated_pool(seed, prompts, ties, big=True)
    _same(shifted(samples, lengths, test), reference(samples, lengths, test))


def test_a_value_that_is_not_a_number_is_left_out() -> None:
    """Fails before: one NaN TTFT made every instance of its pool slow (a NaN median passes
    every comparison), each finding's evidence NaN; the value is now left out and only the
    slow pod is found."""
    snap = pool(healthy=3, failing=0)
    rng = np.random.default_rng(3)
    for i in range(3):
        snap.latency[pod(i)]["ttft_s"] = rng.lognormal(0, 0.1, 60) * (3.0 if i == 0 else 1.0)
        snap.latency[pod(i)]["ttft_prompt_tokens"] = np.full(60, -1.0)
    snap.latency[pod(2)]["ttft_s"][5] = np.nan
    found = detect_slow_prefill(snap, DetectorConfig())
    assert [(f.scope_id, f.evidence["pool_n"]) for f in found] == [(pod(0), 119)]


# --- the order statistics ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 7.25]), min_size=2, max_size=40)
    | st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_order_statistics_of_the_rest_are_numpys(values: list[float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    array = np.array(values)
    owner = rng.integers(0, 4, len(array))
    left_out = LeftOut(array, owner, 4)
    deciles = np.linspace(0, 1, 11)[1:-1]
    for who in range(4):
        rest = array[owner != who]
        if not len(rest):
            continue
        w = np.array([who])
        assert left_out.median(w)[0] == np.median(rest)
        assert (left_out.quantiles(w, deciles)[0] == np.quantile(rest, deciles)).all()
    select = RangeSelect(array)
    lo, hi = sorted(rng.integers(0, len(array) + 1, 2))
    if hi > lo:
        out = np.unique(rng.integers(lo, hi, int(rng.integers(0, hi - lo))))
        kept = np.sort(array[np.setdiff1d(np.arange(lo, hi), out)])
        for k in range(len(kept)):
            got = select.kth(np.array([lo]), np.array([hi]), np.array([k]), out, np.zeros_like(out))
            assert got[0] == kept[k]


@pytest.mark.parametrize("prompts", ["known", "none"], ids=["at equal prompt length", "raw"])
def test_a_fleet_sized_pool_finds_the_slow_instances(prompts: str) -> None:
    """512 instances × 300 requests, every 97th slow: the slow ones, and no other."""
    rng = np.random.default_rng(11)
    samples, lengths = {}, {}
    for i in range(512):
        tokens = rng.integers(50, 4000, 300).astype(float)
        slow = 3.0 if i % 97 == 5 else 1.0
        samples[f"i{i}"] = (0.2 + tokens / 5000) * rng.lognormal(0, 0.4, 300) * slow
        lengths[f"i{i}"] = tokens
    test = ShiftTest(20, 1e-3, 1.5)
    found = shifted(samples, lengths if prompts == "known" else None, test)
    assert [s.instance for s in found] == [f"i{i}" for i in range(512) if i % 97 == 5]
