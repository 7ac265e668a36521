"""One pod's capacity at a token mix: measured on the engine model in virtual time, checked
against what a rate below and above it really does (queue bounded or growing)."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from simulator.capacity import capacity_rps, measure_capacity, measure_rps, sustainable_capacity
from simulator.config import EngineConfig

ENGINE = EngineConfig()
PROMPT, OUTPUT = 512.0, 128.0  # the drill's Poisson workload


@pytest.fixture(scope="module")
def measured() -> float:
    return measure_capacity(ENGINE, PROMPT, OUTPUT).rps


def test_the_closed_form_is_an_upper_bound_near_the_measured_capacity(measured: float) -> None:
    bound = capacity_rps(ENGINE, PROMPT, OUTPUT)
    assert bound.bound == "kv_blocks"  # 2,048 blocks × 16 tokens hold ~51 such requests
    assert measured <= bound.rps <= 1.25 * measured


def test_seventy_percent_of_capacity_is_served_with_an_empty_queue(measured: float) -> None:
    run = measure_rps(ENGINE, 0.7 * measured, 400, prompt_tokens=PROMPT, output_tokens=OUTPUT)
    assert run.steady_rps == pytest.approx(run.offered_rps, rel=0.06)
    assert run.waiting_at_end <= 5


def test_above_capacity_the_queue_grows_and_throughput_stays_at_capacity(
    measured: float,
) -> None:
    run = measure_rps(ENGINE, 1.2 * measured, 400, prompt_tokens=PROMPT, output_tokens=OUTPUT)
    # ±10 %: ~1,600 exponential output lengths per half-run move the mean by a few percent
    assert run.steady_rps == pytest.approx(measured, rel=0.1)
    assert run.waiting_at_end > 0.1 * run.offered_rps * run.seconds


def test_seventy_percent_of_the_saturated_rate_runs_the_kv_pool_out(measured: float) -> None:
    # A KV-bound engine reaches its saturated throughput only with a full KV pool: at 70 %
    # of it, Poisson bursts take the free ratio below the L1 (10 %) and L2 (5 %) lines.
    run = measure_rps(ENGINE, 0.7 * measured, 900, prompt_tokens=PROMPT, output_tokens=OUTPUT)
    assert run.degraded() and run.scrapes_below > 0 and run.min_kv_free < 0.05


def test_the_sustainable_rate_does_not_degrade_and_a_little_more_does() -> None:
    sustainable = sustainable_capacity(ENGINE, PROMPT, OUTPUT, seconds=600, seeds=(0,))
    assert 0.25 < sustainable.share_of_saturated < 0.8
    at = measure_rps(ENGINE, sustainable.rps, 600, prompt_tokens=PROMPT, output_tokens=OUTPUT)
    assert not at.degraded() and at.min_kv_free >= 0.10
    above = 1.1 * sustainable.rps
    run = measure_rps(ENGINE, above, 600, prompt_tokens=PROMPT, output_tokens=OUTPUT)
    assert run.degraded()
    assert "never preempted" in sustainable.describe()


def test_a_bigger_kv_pool_raises_the_capacity() -> None:
    small = capacity_rps(EngineConfig(num_gpu_blocks=1024), PROMPT, OUTPUT)
    large = capacity_rps(EngineConfig(num_gpu_blocks=8192), PROMPT, OUTPUT)
    assert large.bound == "max_num_seqs" and small.rps < large.rps


def test_a_workload_without_tokens_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be > 0"):
        capacity_rps(ENGINE, 0, OUTPUT)
