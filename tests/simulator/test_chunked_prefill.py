"""Chunked prefill: prompts are prefilled in 512-token chunks that share a step
with the running decodes, so a healthy engine at the demo's load meets the seeds' ITL-jitter
SLO (per request p99 gap − median gap ≤ 30 ms, requests with ≥ 10 token chunks) and a
preemption cascade breaks it. Runs the engine model on an injected clock (no sleeping).
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest

from collectors.tap.measure import JITTER_MIN_TOKEN_CHUNKS, ItlSummary
from simulator.config import EngineConfig
from simulator.engine import EngineModel
from simulator.faults import FaultBoard
from simulator.perf import PROFILES
from simulator.traces import poisson_arrivals

#: The demo's load: 8 req/s over 4 pods; the demo's prompt and output lengths.
DEMO_RATE_PER_POD = 2.0
JITTER_SLO_S = 0.03  # slo/slo.example.yaml: itl-jitter
OBJECTIVE = 0.99


class _Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def token_times(
    seconds: float, *, fault: tuple[str, dict[str, Any]] | None = None, **engine: Any
) -> list[list[float]]:
    """Token emission times per request of a Poisson run on an injected clock."""
    now = [0.0]
    faults = FaultBoard()
    if fault is not None:
        faults.set(fault[0], fault[1], 0.0)
    model = EngineModel(EngineConfig(**engine), _Quiet(), faults, lambda: now[0], seed=1)
    arrivals = list(poisson_arrivals(DEMO_RATE_PER_POD, seconds, seed=1))
    times: list[list[float]] = []
    next_arrival = 0
    while True:
        while next_arrival < len(arrivals) and arrivals[next_arrival].offset_s <= now[0]:
            arrival = arrivals[next_arrival]
            stamps: list[float] = []
            times.append(stamps)

            def emit(tokens: int, reason: str | None, stamps: list[float] = stamps) -> None:
                if tokens:
                    stamps.append(now[0])

            model.add(
                model.new_request(
                    str(next_arrival),
                    arrival.prompt_tokens,
                    arrival.output_tokens,
                    emit,
                    ignore_eos=True,
                )
            )
            next_arrival += 1
        plan = model.plan_step()
        if plan is None:
            if next_arrival >= len(arrivals):
                return times
            now[0] = arrivals[next_arrival].offset_s
            continue
        now[0] += plan.duration_s
        model.finish_step(plan)


def jitter_sli(times: list[list[float]]) -> float:
    """Good / total of the jitter SLI, with the tap's own per-request definition."""
    jitters = [
        ItlSummary.of([b - a for a, b in itertools.pairwise(stamps)]).jitter_s
        for stamps in times
        if len(stamps) >= JITTER_MIN_TOKEN_CHUNKS
    ]
    events = [j for j in jitters if j is not None]
    assert len(events) > 200
    return sum(j <= JITTER_SLO_S for j in events) / len(events)


def test_a_healthy_engine_at_the_demo_load_meets_the_jitter_slo() -> None:
    assert jitter_sli(token_times(300)) >= OBJECTIVE


def test_whole_prompt_prefill_breaks_it_which_is_why_chunks_exist() -> None:
    assert jitter_sli(token_times(300, chunked_prefill=False)) < 0.5


def test_a_preemption_cascade_breaks_the_jitter_slo() -> None:
    assert jitter_sli(token_times(300, fault=("preemption_cascade", {}))) < 0.9


@pytest.mark.parametrize("factor", [1.5, 2.0, 5.0])
def test_a_slow_decode_breaks_the_jitter_slo_not_only_tpot(factor: float) -> None:
    # A contended or throttled GPU is slow unevenly: the gaps spread, not only grow.
    healthy_tpot = _median_gap(token_times(120))
    times = token_times(120, fault=("slow_decode", {"factor": factor}))
    assert _median_gap(times) > 0.8 * factor * healthy_tpot  # TPOT grows by about the factor
    assert jitter_sli(times) < 0.5


def test_an_itl_jitter_fault_obviously_breaks_the_jitter_slo() -> None:
    assert jitter_sli(token_times(120, fault=("itl_jitter", {"mean_ms": 50}))) < 0.1


def _median_gap(times: list[list[float]]) -> float:
    return statistics.median(b - a for stamps in times for a, b in itertools.pairwise(stamps))


@pytest.mark.parametrize("profile", ["llama2-70b/h100/tp8", "llama2-70b/h100/tp4"])
def test_a_long_prompt_is_prefilled_in_chunks_while_decodes_keep_stepping(profile: str) -> None:
    now = [0.0]
    model = EngineModel(EngineConfig(profile=profile), _Quiet(), FaultBoard(), lambda: now[0])
    decoded: list[float] = []
    first_long: list[float] = []

    def on_decode(tokens: int, reason: str | None) -> None:
        decoded.extend([now[0]] * tokens)

    def on_long(tokens: int, reason: str | None) -> None:
        if tokens and not first_long:
            first_long.append(now[0])

    model.add(model.new_request("short", 10, 200, on_decode, ignore_eos=True))
    model.add(model.new_request("long", 2000, 5, on_long, ignore_eos=True))
    steps = []
    while len(decoded) < 20:
        plan = model.plan_step()
        assert plan is not None
        steps.append(plan)
        now[0] += plan.duration_s
        model.finish_step(plan)
    chunked = [plan.prefill_tokens for plan in steps if plan.prefill_tokens]
    assert chunked[:2] == [10 + 502, 512] and sum(chunked) == 2010  # 512 tokens a step at most
    assert first_long, "the long prompt got its first token after its last chunk"
    perf = PROFILES[profile]
    longest = max(plan.duration_s for plan in steps)
    assert longest == pytest.approx(max(perf.prefill_ms(512), perf.decode_ms(1)) / 1000)
