"""The Kayenta-style judge on in-memory samples (pure logic, so no store needed here)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.cohorts import LATENCY_METRICS, RATE_METRICS, CohortSamples
from api.judge import DEFAULT_METRICS, JudgeConfig, MetricConfig, SloGateInput, judge


def side(
    n: int, *, seed: int, ttft_factor: float = 1.0, bad: dict[str, int] | None = None
) -> CohortSamples:
    """``n`` healthy requests with lognormal latencies; ``bad`` sets events of rate metrics."""
    rng = np.random.default_rng(seed)
    latency = {
        name: rng.lognormal(-1.0, 0.3, n) * (ttft_factor if name == "ttft_s" else 1.0)
        for name in LATENCY_METRICS
    }
    rates = {name: (n if name == "availability" else 0, n) for name in RATE_METRICS}
    for name, events in (bad or {}).items():
        rates[name] = (n - events, n) if name == "availability" else (events, n)
    return CohortSamples(n, latency, rates)


def by_name(verdict):
    return {m.name: m for m in verdict.metrics}


def test_a_canary_with_ttft_30_percent_slower_fails_with_ttft_high() -> None:
    verdict = judge(side(1000, seed=2, ttft_factor=1.3), side(1000, seed=1), JudgeConfig())
    assert verdict.verdict == "fail"
    assert by_name(verdict)["ttft_s"].classification == "High"
    assert by_name(verdict)["ttft_s"].ratio == pytest.approx(1.3, rel=0.05)
    assert "ttft_s High" in verdict.reason
    others = [m.classification for m in verdict.metrics if m.name != "ttft_s"]
    assert set(others) == {"Pass"}


def test_a_canary_drawn_from_the_same_distribution_passes() -> None:
    verdict = judge(side(1000, seed=2), side(1000, seed=1), JudgeConfig())
    assert verdict.verdict == "pass"
    assert verdict.score == 100.0
    assert all(m.classification == "Pass" for m in verdict.metrics)


def test_a_faster_canary_is_low_on_ttft_but_not_failed_by_default() -> None:
    config = JudgeConfig()
    verdict = judge(side(1000, seed=2, ttft_factor=0.7), side(1000, seed=1), config)
    assert by_name(verdict)["ttft_s"].classification == "Pass"  # direction "increase"
    either = dict(DEFAULT_METRICS, ttft_s=MetricConfig(group="latency", direction="either"))
    verdict = judge(
        side(1000, seed=2, ttft_factor=0.7), side(1000, seed=1), JudgeConfig(metrics=either)
    )
    assert by_name(verdict)["ttft_s"].classification == "Low"


def test_ten_requests_give_nodata_metrics_and_an_inconclusive_verdict() -> None:
    verdict = judge(side(10, seed=2), side(10, seed=1), JudgeConfig())
    assert verdict.verdict == "inconclusive"
    assert verdict.reason.startswith("insufficient_data")
    assert {m.classification for m in verdict.metrics} == {"Nodata"}
    # Even with the request floor lowered, half the metrics without data stay inconclusive.
    verdict = judge(side(10, seed=2), side(10, seed=1), JudgeConfig(min_requests=1))
    assert verdict.verdict == "inconclusive"
    assert verdict.score == 0.0


def test_a_failing_critical_metric_forces_score_zero_and_fail() -> None:
    canary = side(2000, seed=2, bad={"interruption_rate": 60})  # 3 % cut streams vs 0.1 %
    verdict = judge(canary, side(2000, seed=1, bad={"interruption_rate": 2}), JudgeConfig())
    assert by_name(verdict)["interruption_rate"].classification == "High"
    assert by_name(verdict)["interruption_rate"].critical
    assert verdict.score == 0.0
    assert verdict.verdict == "fail"
    assert "critical metric not Pass: interruption_rate" in verdict.reason


def test_the_same_bad_rate_on_a_non_critical_metric_only_lowers_the_score() -> None:
    metrics = dict(
        DEFAULT_METRICS,
        interruption_rate=MetricConfig(group="errors", min_samples=100, allowed_increase=1.25),
    )
    canary = side(2000, seed=2, bad={"interruption_rate": 60})
    verdict = judge(
        canary, side(2000, seed=1, bad={"interruption_rate": 2}), JudgeConfig(metrics=metrics)
    )
    assert 0.0 < verdict.score < 100.0
    assert verdict.score == pytest.approx(50 + 35 * 2 / 3 + 15, abs=0.01)


def test_availability_falling_is_low_and_critical() -> None:
    verdict = judge(side(2000, seed=2, bad={"availability": 80}), side(2000, seed=1), JudgeConfig())
    assert by_name(verdict)["availability"].classification == "Low"
    assert verdict.verdict == "fail" and verdict.score == 0.0


def test_the_slo_gate_fails_a_canary_burning_its_budget_whatever_the_score() -> None:
    burning = SloGateInput(burn_rates={"5m": 20.0, "1h": 3.0}, budget_remaining=0.4)
    verdict = judge(side(1000, seed=2), side(1000, seed=1), JudgeConfig(), burning)
    assert verdict.verdict == "fail"
    assert verdict.slo_gate.applied and not verdict.slo_gate.passed
    assert "burn rate 5m = 20 > 14.4" in verdict.reason
    calm = SloGateInput(burn_rates={"5m": 1.0}, budget_remaining=0.9)
    assert judge(side(1000, seed=2), side(1000, seed=1), JudgeConfig(), calm).verdict == "pass"


def test_the_config_refuses_unknown_metrics_and_inverted_thresholds() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        JudgeConfig(metrics={"ttfx": MetricConfig(group="latency")})
    with pytest.raises(ValueError, match="marginal_score"):
        JudgeConfig(pass_score=80, marginal_score=90)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), factor=st.floats(0.5, 2.0))
def test_the_same_samples_always_give_the_same_verdict(seed: int, factor: float) -> None:
    verdicts = [
        judge(side(300, seed=seed, ttft_factor=factor), side(300, seed=seed + 1), JudgeConfig())
        for _ in range(2)
    ]
    assert verdicts[0] == verdicts[1]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), small=st.floats(1.0, 1.6), extra=st.floats(0.0, 0.6))
def test_a_slower_canary_never_scores_better(seed: int, small: float, extra: float) -> None:
    baseline = side(300, seed=seed + 1)
    mild = judge(side(300, seed=seed, ttft_factor=small), baseline, JudgeConfig())
    worse = judge(side(300, seed=seed, ttft_factor=small + extra), baseline, JudgeConfig())
    assert worse.score <= mild.score
    if by_name(mild)["ttft_s"].classification == "High":
        assert by_name(worse)["ttft_s"].classification == "High"


@settings(max_examples=25, deadline=None)
@given(events=st.integers(0, 200), extra=st.integers(0, 200))
def test_more_bad_events_on_the_canary_never_score_better(events: int, extra: int) -> None:
    baseline = side(2000, seed=1, bad={"error_before_first_token_rate": 4})
    fewer = judge(
        side(2000, seed=2, bad={"error_before_first_token_rate": events}), baseline, JudgeConfig()
    )
    more = judge(
        side(2000, seed=2, bad={"error_before_first_token_rate": events + extra}),
        baseline,
        JudgeConfig(),
    )
    assert more.score <= fewer.score
    rank = {"pass": 0, "inconclusive": 1, "fail": 2}
    assert rank[more.verdict] >= rank[fewer.verdict]


def test_a_stalled_canary_cutting_streams_fails_though_its_latency_metrics_have_no_data() -> None:
    """A stalled pod completes too few requests for its latency metrics (Nodata) and its
    engines answer too few prefix-cache queries: 5 of 10 metrics without data. Its cut
    streams are counted, and a critical metric judged High fails it (Kayenta's first
    override), rather than the ≥ 50 % Nodata rule pausing the rollout."""
    canary = side(400, seed=2, bad={"interruption_rate": 120})
    canary = CohortSamples(
        canary.requests,
        {name: values[:20] for name, values in canary.latency.items()},
        canary.rates,
        prefix_cache=(0, 10),
    )
    baseline = side(400, seed=1, bad={"interruption_rate": 2})
    baseline = CohortSamples(
        baseline.requests, baseline.latency, baseline.rates, prefix_cache=(5_000, 10_000)
    )
    verdict = judge(canary, baseline, JudgeConfig())
    classes = {m.name: m.classification for m in verdict.metrics}
    assert sum(c == "Nodata" for c in classes.values()) * 2 >= len(classes)
    assert classes["interruption_rate"] == "High"
    assert (verdict.verdict, verdict.score) == ("fail", 0.0)
    assert verdict.reason.startswith("critical metric not Pass: interruption_rate")
