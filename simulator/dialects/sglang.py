"""SGLang 0.5.x dialect: ``sglang:`` scheduler and tokenizer families.

Scheduler families carry ``model_name, engine_type, tp_rank, pp_rank``; tokenizer families
``model_name, engine_type`` (+ ``is_streaming`` on TTFT/TPOT/e2e/token totals). Token
totals are incremented at completion (not per step); ``realtime_tokens_total`` per step.
Scheduler gauges freeze while the scheduler hangs (stall fault), as in real SGLang.
Multiprocess exposition: no ``*_created`` series. Buckets: reference/engine-metrics.md §2.1.

With ``dp_size`` > 1 (DP attention) every scheduler family also carries ``dp_rank`` and each
rank reports its own series: the ranks share the one engine model and split its decode tokens,
running and queued requests evenly, or by the ``hot_rank`` fault's weights (hot ranks carry
``factor`` × the others' share, as in a real SGLang scrape where three ranks carried 4×),
read at each exposition (a new split applies from the next scrape on).
"""

from __future__ import annotations

from typing import Any

from pipeline.buckets import SGLANG_E2E_S, SGLANG_ITL_S, SGLANG_QUEUE_S, SGLANG_TTFT_S
from simulator.dialects._base import MetricsDialect, prefix_hit_tokens
from simulator.engine import EngineModel, SimRequest

__all__ = ["SglangDialect"]

TTFT_BUCKETS = SGLANG_TTFT_S
ITL_BUCKETS = SGLANG_ITL_S
E2E_BUCKETS = SGLANG_E2E_S
QUEUE_BUCKETS = SGLANG_QUEUE_S


class SglangDialect(MetricsDialect):
    """SGLang 0.5.23 names and labels."""

    name = "sglang"
    emit_created = False

    def __init__(self, model: str, max_model_len: int, dp_size: int = 1) -> None:
        super().__init__(model, max_model_len)
        sched = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        if dp_size > 1:
            sched["dp_rank"] = "0"
        tok = {"model_name": model, "engine_type": "unified"}
        self.dp_size = dp_size
        self.weights = [1.0] * dp_size  # share of tokens and requests of each rank
        self._carry = [0.0] * dp_size  # fractional decode tokens not yet counted per rank
        self._sched, self._tok = sched, tok
        self._prefix_queries = self._prefix_hits = 0  # prompt tokens since the last refresh
        sn, tn = list(sched), list(tok)
        g, c, h = self.gauge, self.counter, self.histogram

        def s(metric: Any) -> Any:
            return metric.labels(**sched)

        per_rank = {
            "running": g("sglang:num_running_reqs", "The number of running requests.", sn),
            "queue": g("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sn),
            "token_usage": g("sglang:token_usage", "The token usage.", sn),
            "gen_throughput": g(
                "sglang:gen_throughput", "The generation throughput (token/s).", sn
            ),
        }
        self.running = s(per_rank["running"])
        self.queue = s(per_rank["queue"])
        self.token_usage = s(per_rank["token_usage"])
        self.used_tokens = s(g("sglang:num_used_tokens", "The number of used tokens.", sn))
        self.available = s(
            g("sglang:kv_available_tokens", "The number of available KV tokens.", sn)
        )
        self.max_total = s(
            g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.", sn)
        )
        self.gen_throughput = s(per_rank["gen_throughput"])
        self.cache_hit_rate = s(g("sglang:cache_hit_rate", "The prefix cache hit rate.", sn))
        self.retracted_now = s(
            g("sglang:num_retracted_reqs", "The number of retracted requests.", sn)
        )
        self.retracted = s(
            c("sglang:num_retracted_requests", "Total number of retracted requests.", sn)
        )
        realtime = c(
            "sglang:realtime_tokens", "Tokens processed, updated each log interval.", [*sn, "mode"]
        )
        self.rt_prefill = realtime.labels(**sched, mode="prefill_compute")
        realtime.labels(**sched, mode="prefill_cache")
        self.rt_decode = realtime.labels(**sched, mode="decode")
        self._rank_children: list[dict[str, Any]] = []
        for rank in range(1, dp_size):
            labels = {**sched, "dp_rank": str(rank)}
            children: dict[str, Any] = {k: f.labels(**labels) for k, f in per_rank.items()}
            children["decode"] = realtime.labels(**labels, mode="decode")
            realtime.labels(**labels, mode="prefill_compute")
            realtime.labels(**labels, mode="prefill_cache")
            self._rank_children.append(children)
        self.queue_time = s(
            h(
                "sglang:queue_time_seconds",
                "Histogram of queueing time in seconds.",
                QUEUE_BUCKETS,
                sn,
            )
        )
        streaming = [*tn, "is_streaming"]
        self.prompt_tokens = c(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", streaming
        )
        self.generation_tokens = c(
            "sglang:generation_tokens", "Number of generation tokens processed.", streaming
        )
        self.requests = c("sglang:num_requests", "Number of requests processed.", streaming)
        self.aborted = c("sglang:num_aborted_requests", "Number of requests aborted.", tn).labels(
            **tok
        )
        self.ttft = h(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            streaming,
        )
        self.itl = h(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
            tn,
        ).labels(**tok)
        self.tpot = h(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token per request in seconds.",
            ITL_BUCKETS,
            streaming,
        )
        self.e2e = h(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            E2E_BUCKETS,
            streaming,
        )
        for flag in ("true", "false"):
            for family in (
                self.prompt_tokens,
                self.generation_tokens,
                self.requests,
                self.ttft,
                self.tpot,
                self.e2e,
            ):
                family.labels(**tok, is_streaming=flag)
        self._last_tokens = 0
        self._last_s: float | None = None

    def _flag(self, req: SimRequest) -> str:
        return "true" if req.streaming else "false"

    def on_scheduled(self, req: SimRequest, queue_s: float) -> None:
        self.queue_time.observe(queue_s)

    def on_first_token(self, req: SimRequest, ttft_s: float) -> None:
        self._prefix_queries += req.prompt_tokens
        self._prefix_hits += prefix_hit_tokens(req.prompt_tokens) if req.prefix_cached else 0
        self.ttft.labels(**self._tok, is_streaming=self._flag(req)).observe(ttft_s)

    def on_tokens(self, req: SimRequest, tokens: int, itl_s: float | None) -> None:
        if itl_s is not None:
            self.itl.observe(itl_s)

    def on_step(self, prefill_tokens: int, decode_tokens: int, duration_s: float) -> None:
        if prefill_tokens:
            self.rt_prefill.inc(prefill_tokens)
        if decode_tokens and self.dp_size == 1:
            self.rt_decode.inc(decode_tokens)
        elif decode_tokens:
            total = sum(self.weights)
            counters = [self.rt_decode, *(c["decode"] for c in self._rank_children)]
            for rank, counter in enumerate(counters):
                self._carry[rank] += decode_tokens * self.weights[rank] / total
                whole = int(self._carry[rank])
                if whole:
                    counter.inc(whole)
                    self._carry[rank] -= whole

    def on_preempt(self, req: SimRequest) -> None:
        self.retracted.inc()

    def on_finish(self, req: SimRequest) -> None:
        flag = self._flag(req)
        if req.finish_reason == "abort":
            self.aborted.inc()
        self.requests.labels(**self._tok, is_streaming=flag).inc()
        self.prompt_tokens.labels(**self._tok, is_streaming=flag).inc(req.prompt_tokens)
        self.generation_tokens.labels(**self._tok, is_streaming=flag).inc(req.generated)
        end = req.finished_s or req.arrival_s
        self.e2e.labels(**self._tok, is_streaming=flag).observe(end - req.arrival_s)
        if req.first_token_s is not None and req.generated > 1:
            tpot = (end - req.first_token_s) / (req.generated - 1)
            self.tpot.labels(**self._tok, is_streaming=flag).observe(tpot)

    def refresh(self, engine: EngineModel, now_s: float) -> None:
        if engine.stalled():
            return  # the scheduler process hangs: the tokenizer keeps serving the last values
        capacity = engine.total_blocks * engine.config.block_size
        used = round(engine.kv_usage(now_s) * capacity)
        self._refresh_ranks(engine, now_s)
        self.token_usage.set(engine.kv_usage(now_s))
        self.used_tokens.set(used)
        self.available.set(capacity - used)
        self.max_total.set(capacity)
        self.retracted_now.set(sum(1 for r in engine.waiting if r.preemptions))
        if self._last_s is not None and now_s > self._last_s:
            rate = (engine.tokens_generated - self._last_tokens) / (now_s - self._last_s)
            share = self.weights[0] / sum(self.weights)
            self.gen_throughput.set(round(rate * share, 2))
            for rank, children in enumerate(self._rank_children, start=1):
                share = self.weights[rank] / sum(self.weights)
                children["gen_throughput"].set(round(rate * share, 2))
        self._last_s, self._last_tokens = now_s, engine.tokens_generated
        if self._prefix_queries:  # the scheduler reports the rate of its last log window
            self.cache_hit_rate.set(round(self._prefix_hits / self._prefix_queries, 4))
            self._prefix_queries = self._prefix_hits = 0

    def _refresh_ranks(self, engine: EngineModel, now_s: float) -> None:
        """Per-rank running/queue gauges: the engine's, split by the ranks' weights."""
        hot = engine.faults.get("hot_rank")
        self.weights = [
            (hot.factor if hot is not None and rank in hot.ranks else 1.0)
            for rank in range(self.dp_size)
        ]
        total = sum(self.weights)
        running, waiting = len(engine.running), len(engine.waiting)
        self.running.set(round(running * self.weights[0] / total))
        self.queue.set(round(waiting * self.weights[0] / total))
        for rank, children in enumerate(self._rank_children, start=1):
            share = self.weights[rank] / total
            children["running"].set(round(running * share))
            children["queue"].set(round(waiting * share))
            children["token_usage"].set(engine.kv_usage(now_s))
