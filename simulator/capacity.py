"""How many requests per second one simulated engine sustains at a workload's token mix.

:func:`measure_capacity` is the figure the drill uses: the engine model (``simulator.engine``)
driven on a virtual clock, offered twice the closed-form bound below so its queue never
empties, and the requests it finishes per second over the second half of the run (the
first half fills the batch and the KV pool). Deterministic for a seed; CPU only.

Two answers that check each other:

* :func:`capacity_rps`, a closed form from the engine model (``simulator.engine``): in
  steady state the running batch holds ``B`` sequences, limited by ``max_num_seqs`` and by
  the KV pool (a decoding sequence holds its prompt plus the tokens generated so far; with
  exponential output lengths, as :func:`simulator.traces.poisson_arrivals` draws them, the
  time-weighted mean is ``prompt + output`` tokens). Each step emits one token per running
  sequence, so the pool finishes ``B / (output · step)`` requests per second; a step lasts
  as long as the decode of ``B`` sequences and the prefill of the prompts admitted meanwhile
  (the slower of the two with chunked prefill, their sum without). A second bound is the
  prefill budget itself: at most ``prefill_chunk_tokens`` prompt tokens per step.
* :func:`measure_rps`, the engine model driven on a virtual clock (no sleeping) with Poisson
  arrivals: what a rate really yields (completions per second, queue at the end). Tests
  hold the closed form to it.

A third figure is what a pod serves *without degrading*: :func:`sustainable_capacity`, the
highest Poisson rate at which the engine model, over a long virtual run, never preempts and
never shows its KV free ratio below a floor (the L1 flag line, 10 %) at any scrape. A
KV-bound engine reaches its saturated throughput only by running its KV pool full, so a
share of the saturated figure is not a healthy load: at 70 % of it the default pod dips
below 10 % free about once a minute and preempts (tests/simulator/test_capacity.py).

Service times come from the engine's fitted profile (``simulator.perf``), divided by nothing:
capacity is per pod at ``speed`` 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from simulator.config import EngineConfig
from simulator.engine import EngineModel
from simulator.faults import FaultBoard
from simulator.perf import PROFILES
from simulator.traces import poisson_arrivals

__all__ = [
    "Capacity",
    "Measured",
    "Sustainable",
    "capacity_rps",
    "measure_capacity",
    "measure_rps",
    "sustainable_capacity",
]


@dataclass(frozen=True)
class Capacity:
    """One pod's sustainable request rate and how it was reached."""

    rps: float  # requests per second one pod sustains
    bound_rps: float  # the closed form's figure (an upper bound: it ignores block rounding)
    batch: float  # running sequences in steady state
    step_ms: float  # one engine step at that batch
    bound: str  # what limits it: max_num_seqs | kv_blocks | prefill_budget
    prompt_tokens: float  # the workload's mean prompt length
    output_tokens: float  # the workload's mean output length

    def describe(self) -> str:
        """One line for reports: the figure and its method."""
        return (
            f"{self.rps:.2f} req/s per pod, measured on the engine model in virtual time "
            f"(saturated, steady state) at mean prompt {self.prompt_tokens:g} / output "
            f"{self.output_tokens:g} tokens; closed-form bound {self.bound_rps:.2f} req/s "
            f"({self.bound}-bound: batch {self.batch:.0f}, step {self.step_ms:.1f} ms)"
        )


def capacity_rps(engine: EngineConfig, prompt_tokens: float, output_tokens: float) -> Capacity:
    """Requests per second one pod with ``engine`` sustains at mean ``prompt_tokens`` in and
    ``output_tokens`` out (exponential lengths). Raises ConfigError on non-positive means."""
    if prompt_tokens <= 0 or output_tokens <= 0:
        raise ConfigError("capacity: mean prompt and output tokens must be > 0")
    perf = PROFILES[engine.profile]
    held_tokens = prompt_tokens + output_tokens
    kv_batch = engine.num_gpu_blocks * engine.block_size / held_tokens
    batch = min(float(engine.max_num_seqs), kv_batch)
    bound = "max_num_seqs" if batch == engine.max_num_seqs else "kv_blocks"
    chunk = engine.prefill_chunk_tokens if engine.chunked_prefill else math.inf

    def step_ms(prefill_tokens: float) -> float:
        prefill = perf.prefill_ms(math.ceil(prefill_tokens))
        decode = perf.decode_ms(math.ceil(batch))
        return max(prefill, decode) if engine.chunked_prefill else prefill + decode

    # Decode-bound: a step prefills the prompts of the requests that finished meanwhile.
    per_step_prompt = batch * prompt_tokens / output_tokens
    decode_step = step_ms(min(per_step_prompt, chunk))
    decode_rps = batch / (output_tokens * decode_step / 1000)
    decode = Capacity(
        decode_rps, decode_rps, batch, decode_step, bound, prompt_tokens, output_tokens
    )
    if per_step_prompt <= chunk:
        return decode
    prefill_step = step_ms(chunk)
    prefill_rps = chunk / (prompt_tokens * prefill_step / 1000)
    if prefill_rps < decode_rps:
        return Capacity(
            prefill_rps,
            prefill_rps,
            batch,
            prefill_step,
            "prefill_budget",
            prompt_tokens,
            output_tokens,
        )
    return decode


def measure_capacity(
    engine: EngineConfig,
    prompt_tokens: float,
    output_tokens: float,
    *,
    seconds: float = 300.0,
    seed: int = 0,
) -> Capacity:
    """One pod's capacity measured on the engine model (see the module docstring); the
    closed form gives the offered rate and stays in the result as ``bound_rps``."""
    bound = capacity_rps(engine, prompt_tokens, output_tokens)
    run = measure_rps(
        engine,
        2 * bound.rps,
        seconds,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        seed=seed,
    )
    return Capacity(
        run.steady_rps,
        bound.rps,
        bound.batch,
        bound.step_ms,
        bound.bound,
        prompt_tokens,
        output_tokens,
    )


@dataclass(frozen=True)
class Measured:
    """What a rate yielded on the engine model in virtual time."""

    offered_rps: float
    completed_rps: float  # requests finished per second over the run
    steady_rps: float  # requests finished per second over the second half
    waiting_at_end: int  # requests still queued for admission when arrivals stopped
    seconds: float
    preemptions: int = 0  # sequences evicted for KV room during the run
    min_kv_free: float = 1.0  # lowest KV free ratio at a scrape (every ``scrape_s``)
    scrapes_below: int = 0  # scrapes whose KV free ratio was below ``kv_free_floor``

    def degraded(self) -> bool:
        """Whether the pod preempted or a scrape saw its KV free ratio below the floor."""
        return self.preemptions > 0 or self.scrapes_below > 0


class _Silent:
    """An engine observer that hears nothing (no metrics dialect needed here)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def measure_rps(
    engine: EngineConfig,
    rate_per_s: float,
    seconds: float,
    *,
    prompt_tokens: float = 512.0,
    output_tokens: float = 128.0,
    seed: int = 0,
    scrape_s: float = 2.0,
    kv_free_floor: float = 0.10,
) -> Measured:
    """Drive the engine model with Poisson arrivals at ``rate_per_s`` for ``seconds`` of
    virtual time (the workload of :func:`poisson_arrivals`, ``ignore_eos`` like the load
    generator) and count what finished, what was preempted and the KV free ratio a scrape
    every ``scrape_s`` would have read; cost is CPU only (~1 s per 100 virtual seconds at
    ~8 req/s)."""
    now = [0.0]
    model = EngineModel(engine, _Silent(), FaultBoard(), lambda: now[0], seed=seed)
    arrivals = list(
        poisson_arrivals(
            rate_per_s,
            seconds,
            seed=seed,
            mean_prompt_tokens=prompt_tokens,
            mean_output_tokens=output_tokens,
        )
    )
    finished = [0, 0]  # whole run, second half

    def emit(tokens: int, reason: str | None) -> None:
        if reason is not None:
            finished[0] += 1
            finished[1] += now[0] >= seconds / 2

    index = 0
    next_scrape_s, scraped_free = 0.0, []
    while now[0] < seconds:
        while next_scrape_s <= now[0]:
            scraped_free.append(model.free_blocks() / model.total_blocks)
            next_scrape_s += scrape_s
        while index < len(arrivals) and arrivals[index].offset_s <= now[0]:
            arrival = arrivals[index]
            request = model.new_request(
                str(index), arrival.prompt_tokens, arrival.output_tokens, emit, ignore_eos=True
            )
            model.add(request)
            index += 1
        plan = model.plan_step()
        if plan is None:  # idle: jump to the next arrival
            now[0] = arrivals[index].offset_s if index < len(arrivals) else seconds
            continue
        now[0] += plan.duration_s
        model.finish_step(plan)
    return Measured(
        rate_per_s,
        finished[0] / seconds,
        finished[1] / (seconds / 2),
        len(model.waiting),
        seconds,
        preemptions=model.preemptions,
        min_kv_free=min(scraped_free, default=1.0),
        scrapes_below=sum(free < kv_free_floor for free in scraped_free),
    )


@dataclass(frozen=True)
class Sustainable:
    """The highest rate a pod serves without degrading, and how it was found."""

    rps: float  # requests per second per pod: no preemption, KV never below the floor
    saturated_rps: float  # the saturated throughput it is a share of
    kv_free_floor: float
    seconds: float  # virtual seconds per trial run
    seeds: tuple[int, ...]

    @property
    def share_of_saturated(self) -> float:
        return self.rps / self.saturated_rps

    def describe(self) -> str:
        """One line for reports: the figure and its method."""
        return (
            f"{self.rps:.2f} req/s per pod served without degrading "
            f"({self.share_of_saturated:.2f} of the saturated {self.saturated_rps:.2f}): the "
            f"highest Poisson rate at which the engine model, over {self.seconds:.0f} virtual "
            f"seconds for each of seeds {list(self.seeds)}, never preempted and never showed "
            f"a KV free ratio below {self.kv_free_floor:.0%} at a 2-s scrape"
        )


def sustainable_capacity(
    engine: EngineConfig,
    prompt_tokens: float,
    output_tokens: float,
    *,
    kv_free_floor: float = 0.10,
    seconds: float = 1800.0,
    seeds: tuple[int, ...] = (0, 1),
    resolution: float = 0.025,
    saturated: Capacity | None = None,
) -> Sustainable:
    """Bisect the rate (as a share of the saturated ``saturated``, measured here when not
    given, to ``resolution``) for the highest one at which no seed's run degrades
    (:meth:`Measured.degraded`). The defaults match the drill's healthy 30 minutes.
    Deterministic; ~20 s of CPU with the defaults."""
    saturated_rps = (saturated or measure_capacity(engine, prompt_tokens, output_tokens)).rps

    def degrades(share: float) -> bool:
        return any(
            measure_rps(
                engine,
                share * saturated_rps,
                seconds,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                seed=seed,
                kv_free_floor=kv_free_floor,
            ).degraded()
            for seed in seeds
        )

    low, high = 0.0, 1.0  # low never degrades (no load); at saturation the pool runs full
    while high - low > resolution:
        middle = (low + high) / 2
        low, high = (low, middle) if degrades(middle) else (middle, high)
    return Sustainable(low * saturated_rps, saturated_rps, kv_free_floor, seconds, seeds)
