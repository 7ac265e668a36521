"""The continuous-batching engine model: a scheduler over a KV block pool.

Pure logic with an injected clock (seconds, the pod's wall clock): :meth:`EngineModel.plan_step`
decides the next batch (admission, preemption by recompute when KV runs out) and its
duration from the fitted service-time profile; the pod's scheduler task sleeps that long
and calls :meth:`EngineModel.finish_step`, which emits one token per running request
(the first token for requests whose prefill ran) through each request's ``emit`` callback
and tells the dialect observer what happened. Faults are read from a :class:`FaultBoard`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from simulator.config import EngineConfig
from simulator.faults import FaultBoard
from simulator.perf import PROFILES

__all__ = ["EngineModel", "EngineObserver", "SimRequest", "StepPlan"]

#: ``emit(tokens, finish_reason)``: tokens produced this step; finish_reason set on the last call.
Emit = Callable[[int, str | None], None]


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine; times are the pod clock's seconds."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    target_tokens: int
    arrival_s: float
    emit: Emit
    streaming: bool = True
    generated: int = 0
    blocks: int = 0
    to_prefill: int = 0
    preemptions: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    finish_reason: str | None = None
    cut_after: int | None = None
    error_before_first_token: bool = False
    corrupted: bool = False
    prefix_cached: bool = True  # the prompt's shared prefix was in the pod's prefix cache

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class EngineObserver(Protocol):
    """What a metrics dialect hears from the engine (all times in seconds)."""

    def on_scheduled(self, req: SimRequest, queue_s: float) -> None: ...
    def on_first_token(self, req: SimRequest, ttft_s: float) -> None: ...
    def on_tokens(self, req: SimRequest, tokens: int, itl_s: float | None) -> None: ...
    def on_step(self, prefill_tokens: int, decode_tokens: int, duration_s: float) -> None: ...
    def on_preempt(self, req: SimRequest) -> None: ...
    def on_finish(self, req: SimRequest) -> None: ...


@dataclass
class StepPlan:
    """One engine step: who prefills, who decodes, and how long it takes."""

    prefill: list[SimRequest]
    decode: list[SimRequest]
    prefill_tokens: int
    duration_s: float
    started_s: float
    extra: dict[str, float] = field(default_factory=dict)
    #: Chunked prefill: prompt tokens each prefilling request gets this step.
    chunks: dict[str, int] = field(default_factory=dict)


class EngineModel:
    """Continuous batching over ``num_gpu_blocks`` KV blocks of ``block_size`` tokens.

    ``speed`` divides every modelled service time (tests run fast); ``clock`` returns the
    current time in seconds (used for leaks and gauges between steps).
    """

    def __init__(
        self,
        config: EngineConfig,
        observer: EngineObserver,
        faults: FaultBoard,
        clock: Callable[[], float],
        *,
        speed: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.observer = observer
        self.faults = faults
        self.clock = clock
        self.speed = speed
        self.perf = PROFILES[config.profile]
        self.rng = random.Random(seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.used_blocks = 0
        self.iterations = 0
        self.busy_s = 0.0
        self.stalled_since: float | None = None
        # A hung engine loop (NCCL hang) cannot process aborts: they wait for it to recover,
        # so the request stays "running" and keeps its KV — as in a real hang.
        self._pending_aborts: list[SimRequest] = []
        self.tokens_generated = 0
        self.preemptions = 0

    # ---- requests -------------------------------------------------------------------
    @property
    def max_len(self) -> int:
        """Longest prompt + output one request may reach: max_model_len, capped by the pool."""
        return min(self.config.max_model_len, self.total_blocks * self.config.block_size - 1)

    def new_request(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int | None,
        emit: Emit,
        *,
        ignore_eos: bool = False,
        streaming: bool = True,
    ) -> SimRequest:
        """A request with its output length decided (natural stop or ``max_tokens``)."""
        prompt_tokens = max(1, prompt_tokens)
        room = max(1, self.max_len - prompt_tokens)
        cap = min(max_tokens, room) if max_tokens else room
        natural = max(1, int(self.rng.expovariate(1.0 / self.config.mean_output_tokens)) + 1)
        target = cap if ignore_eos else min(cap, natural)
        return SimRequest(
            request_id, prompt_tokens, cap, target, self.clock(), emit, streaming=streaming
        )

    def add(self, req: SimRequest) -> None:
        """Queue ``req`` for admission."""
        req.to_prefill = req.prompt_tokens
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """The client went away: drop ``req`` from the engine (finish_reason ``abort``)."""
        if req.done:
            return
        if self.stalled():
            self._pending_aborts.append(req)
            return
        if req in self.running:
            self.running.remove(req)
            self._free(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, "abort", self.clock(), emit=False)

    # ---- KV pool ----------------------------------------------------------------------
    @property
    def total_blocks(self) -> int:
        return self.config.num_gpu_blocks

    def unavailable_blocks(self, now_s: float | None = None) -> int:
        """Blocks taken away by faults (leak, cascade reservation)."""
        now_s = self.clock() if now_s is None else now_s
        taken = 0.0
        leak = self.faults.get("kv_leak")
        if leak is not None:
            since = self.faults.since("kv_leak")
            since = now_s if since is None else since
            grown = leak.blocks_per_s * max(0.0, now_s - since) * self.speed
            taken += min(leak.max_fraction * self.total_blocks, grown)
        cascade = self.faults.get("preemption_cascade")
        if cascade is not None:
            taken += cascade.reserve_fraction * self.total_blocks
        return min(self.total_blocks, int(taken))

    def free_blocks(self, now_s: float | None = None) -> int:
        return max(0, self.total_blocks - self.used_blocks - self.unavailable_blocks(now_s))

    def kv_usage(self, now_s: float | None = None) -> float:
        """Fraction 0–1 of the pool in use (requests plus blocks lost to faults)."""
        return 1.0 - self.free_blocks(now_s) / self.total_blocks

    def largest_free_run(self, now_s: float | None = None) -> int:
        frag = self.faults.get("fragmentation")
        free = self.free_blocks(now_s)
        return min(free, frag.largest_free_run) if frag is not None else free

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _free(self, req: SimRequest) -> None:
        self.used_blocks -= req.blocks
        req.blocks = 0

    # ---- scheduling -------------------------------------------------------------------
    def stalled(self) -> bool:
        """True while a hang fault keeps the engine from stepping."""
        xid = self.faults.get("xid")
        return (
            "stall" in self.faults or "wedge" in self.faults or (xid is not None and xid.code == 79)
        )

    def _unschedule_all(self) -> None:
        """A wedged scheduler: its batch falls back to the waiting queue (KV freed, nothing
        counted as a preemption) and is never scheduled again while the fault holds."""
        for req in reversed(self.running):
            self.running.remove(req)
            self._free(req)
            req.to_prefill = req.prompt_tokens + req.generated
            self.waiting.appendleft(req)

    def plan_step(self) -> StepPlan | None:
        """The next step, or None when there is nothing to do (idle or hung)."""
        now = self.clock()
        if self.stalled():
            if self.stalled_since is None:
                self.stalled_since = now
            if "wedge" in self.faults:
                self._unschedule_all()
            return None
        self.stalled_since = None
        pending, self._pending_aborts = self._pending_aborts, []
        for req in pending:
            self.abort(req)
        self._ensure_decode_room(now)
        admitted = self._admit(now)
        if not self.config.chunked_prefill:
            decode = [r for r in self.running if r not in admitted]
            if not admitted and not decode:
                return None
            tokens = sum(r.to_prefill for r in admitted)
            duration = self._duration_s(tokens, len(decode))
            return StepPlan(admitted, decode, tokens, duration, now)
        return self._chunked_plan(now)

    def _chunked_plan(self, now: float) -> StepPlan | None:
        """Chunked prefill: every decoding request steps, and prefilling requests share a
        budget of ``prefill_chunk_tokens`` prompt tokens (oldest first) in the same pass."""
        budget = self.config.prefill_chunk_tokens
        prefill: list[SimRequest] = []
        decode: list[SimRequest] = []
        chunks: dict[str, int] = {}
        for req in self.running:
            if req.to_prefill <= 0:
                decode.append(req)
            elif budget > 0:
                chunk = min(req.to_prefill, budget)
                budget -= chunk
                chunks[req.request_id] = chunk
                prefill.append(req)
        if not prefill and not decode:
            return None
        tokens = sum(chunks.values())
        duration = self._duration_s(tokens, len(decode), fused=True)
        return StepPlan(prefill, decode, tokens, duration, now, chunks=chunks)

    def _duration_s(self, prefill_tokens: int, batch: int, *, fused: bool = False) -> float:
        """One step's time. Unfused, a prefill pass and a decode pass add up. Fused (chunked
        prefill), one pass reads the weights once for both, so it lasts as long as the slower
        of the two (the roofline: decode is bound by memory reads, prefill by compute). With
        the fitted llama2-70b/h100 profiles a 512-token chunk makes a step of ~57–62 ms
        against ~30–31 ms for decode alone, as Splitwise measured for a 512-token prompt."""
        prefill_ms = self.perf.prefill_ms(prefill_tokens)
        decode_ms = self.perf.decode_ms(batch)
        slow_prefill = self.faults.get("slow_prefill")
        if slow_prefill is not None:
            prefill_ms *= slow_prefill.factor
        slow_decode = self.faults.get("slow_decode")
        if slow_decode is not None:
            decode_ms *= slow_decode.factor * self._contended_step()
        jitter = self.faults.get("itl_jitter")
        extra_ms = self.rng.expovariate(1.0 / jitter.mean_ms) if jitter and jitter.mean_ms else 0.0
        work_ms = max(prefill_ms, decode_ms) if fused else prefill_ms + decode_ms
        return (work_ms + extra_ms) / 1000.0 / self.speed

    def _contended_step(self) -> float:
        """One step's share of a slowdown, mean 1: ``0.75 + Exp(mean 0.25)``.

        A GPU slowed by contention (another process time-sliced onto it, MPS neighbours)
        or by thermal/power throttling is not slow evenly: clocks and time slices change
        from step to step. So ``slow_decode`` stretches each step by ``factor`` times this
        draw: on average by ``factor`` (TPOT), and irregularly (the spread of the gaps
        grows with the factor, so ITL jitter breaks too). Never below 0.75× the factor.
        """
        return 0.75 + self.rng.expovariate(4.0)

    def _ensure_decode_room(self, now: float) -> None:
        """Give every running request room for its next token; preempt (LIFO) when short."""
        forced = self.faults.get("preemption_cascade") or self.faults.get("fragmentation")
        if forced is not None and self.running and self.rng.random() < forced.preempt_probability:
            self._preempt(self.running[-1])
        for req in list(self.running):
            if req not in self.running:
                continue
            need = self._blocks_for(req.prompt_tokens + req.generated + 1) - req.blocks
            while need > 0 and self.free_blocks(now) < need and self.running:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if req in self.running and need > 0:
                req.blocks += need
                self.used_blocks += need

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self._free(req)
        req.preemptions += 1
        req.to_prefill = req.prompt_tokens + req.generated
        self.preemptions += 1
        self.waiting.appendleft(req)
        self.observer.on_preempt(req)

    def _admit(self, now: float) -> list[SimRequest]:
        """Admit waiting requests, oldest first, each into the largest free run of blocks.

        A request that does not fit the free blocks stops admission there (first come,
        first served, as vLLM's scheduler: nothing overtakes a head the pool has no room
        for). One that fits the free blocks but not the largest run is held back by
        fragmentation alone: it keeps its place and the requests behind it that fit a run
        are admitted past it, so the running batch keeps working while it waits."""
        admitted: list[SimRequest] = []
        if not self.waiting:
            return admitted
        budget = self.config.max_num_batched_tokens
        run, free = self.largest_free_run(now), self.free_blocks(now)
        index = 0
        while index < len(self.waiting) and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[index]
            need = self._blocks_for(req.to_prefill + 1)
            if need > run:
                if need > free:
                    break
                index += 1
                continue
            if not self.config.chunked_prefill and req.to_prefill > budget and admitted:
                break
            del self.waiting[index]
            budget -= req.to_prefill
            req.blocks = need
            self.used_blocks += need
            self.running.append(req)
            admitted.append(req)
            if req.scheduled_s is None:
                req.scheduled_s = now
                self.observer.on_scheduled(req, now - req.arrival_s)
            run, free = self.largest_free_run(now), self.free_blocks(now)
        return admitted

    # ---- step completion --------------------------------------------------------------
    def finish_step(self, plan: StepPlan) -> None:
        """Emit this step's tokens, finish requests, and report the step."""
        now = self.clock()
        self.iterations += 1
        self.busy_s += now - plan.started_s
        produced = 0
        nan = self.faults.get("nan_burst")
        for req in plan.prefill:
            if req.done or req not in self.running:
                continue
            req.to_prefill -= plan.chunks.get(req.request_id, req.to_prefill)
            if req.to_prefill > 0:
                continue  # more chunks to go: no token yet
            if req.generated == 0 and self._roll("prefill_failure"):
                req.error_before_first_token = True
                self._retire(req, "error", now)
                continue
            produced += self._token(req, now, nan)
        for req in plan.decode:
            if req.done or req not in self.running:
                continue
            produced += self._token(req, now, nan)
        self.tokens_generated += produced
        self.observer.on_step(plan.prefill_tokens, produced, now - plan.started_s)

    def _roll(self, fault: str) -> bool:
        params = self.faults.get(fault)
        return params is not None and self.rng.random() < params.fraction

    def _token(self, req: SimRequest, now: float, nan: object | None) -> int:
        first = req.first_token_s is None
        itl = None if first or req.last_token_s is None else now - req.last_token_s
        req.generated += 1
        req.last_token_s = now
        if first:
            req.first_token_s = now
            self.observer.on_first_token(req, now - req.arrival_s)
            cut = self.faults.get("failure_after_first_token")
            if cut is not None and self.rng.random() < cut.fraction:
                req.cut_after = cut.after_tokens
        self.observer.on_tokens(req, 1, itl)
        if nan is not None and self._roll("nan_burst"):
            req.corrupted = True
            reason: str | None = "error"
        elif req.cut_after is not None and req.generated >= req.cut_after:
            reason = "error"
        elif req.generated >= req.target_tokens:
            reason = "length" if req.generated >= req.max_tokens else "stop"
        else:
            reason = None
        if reason is None:
            req.emit(1, None)
        else:
            self._retire(req, reason, now, tokens=1)
        return 1

    def _retire(self, req: SimRequest, reason: str, now: float, tokens: int = 0) -> None:
        self.running.remove(req)
        self._free(req)
        req.emit(tokens, reason)
        self._finish(req, reason, now, emit=False)

    def _finish(self, req: SimRequest, reason: str, now: float, *, emit: bool) -> None:
        req.finish_reason = reason
        req.finished_s = now
        if emit:
            req.emit(0, reason)
        self.observer.on_finish(req)
