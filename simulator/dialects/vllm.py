"""vLLM dialects: ``vllm`` (V1, current 0.33 names) and ``vllm-legacy`` (≤ 0.10 names).

Names, labels and buckets from ``reference/engine-metrics.md`` §1. ``vllm`` labels every
family with ``model_name`` and ``engine="0"``; ``vllm-legacy`` has ``model_name`` only,
exposes ``vllm:gpu_cache_usage_perc`` and observes ``vllm:time_per_output_token_seconds``
per step (it is really ITL).
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.buckets import (
    VLLM_ITERATION_TOKENS,
    VLLM_ITL_S,
    VLLM_PREEMPTIONS,
    VLLM_REQUEST_LATENCY_S,
    VLLM_TTFT_S,
)
from simulator.dialects._base import MetricsDialect, prefix_hit_tokens, token_buckets
from simulator.engine import EngineModel, SimRequest

__all__ = ["TTFT_BUCKETS", "VllmDialect", "VllmLegacyDialect"]

TTFT_BUCKETS = VLLM_TTFT_S
ITL_BUCKETS = VLLM_ITL_S
LATENCY_BUCKETS = VLLM_REQUEST_LATENCY_S
ITERATION_BUCKETS = VLLM_ITERATION_TOKENS
PREEMPTION_BUCKETS = VLLM_PREEMPTIONS


class VllmDialect(MetricsDialect):
    """vLLM V1 (0.33): ``vllm:`` families with labels ``model_name``, ``engine``."""

    name = "vllm"
    legacy = False
    finished_reasons: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")

    def __init__(self, model: str, max_model_len: int) -> None:
        super().__init__(model, max_model_len)
        self.labels = {"model_name": model} if self.legacy else {"model_name": model, "engine": "0"}
        names = list(self.labels)
        g, c, h = self.gauge, self.counter, self.histogram
        bind = self._bind
        self.running = bind(
            g("vllm:num_requests_running", "Number of requests in model execution batches.", names)
        )
        self.waiting = bind(
            g("vllm:num_requests_waiting", "Number of requests waiting to be processed.", names)
        )
        kv_name = "vllm:gpu_cache_usage_perc" if self.legacy else "vllm:kv_cache_usage_perc"
        self.kv_usage = bind(g(kv_name, "KV-cache usage. 1 means 100 percent usage.", names))
        self.preemptions = bind(
            c("vllm:num_preemptions", "Cumulative number of preemption from the engine.", names)
        )
        self.prompt_tokens = bind(
            c("vllm:prompt_tokens", "Number of prefill tokens processed.", names)
        )
        self.generation_tokens = bind(
            c("vllm:generation_tokens", "Number of generation tokens processed.", names)
        )
        success = c(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
        )
        self.success = {
            r: success.labels(**self.labels, finished_reason=r) for r in self.finished_reasons
        }
        self.ttft = bind(
            h(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
                names,
            )
        )
        self.e2e = bind(
            h(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                LATENCY_BUCKETS,
                names,
            )
        )
        self.queue = bind(
            h(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                LATENCY_BUCKETS,
                names,
            )
        )
        tok = token_buckets(max_model_len)
        self.req_prompt = bind(
            h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok, names)
        )
        self.req_gen = bind(
            h(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                tok,
                names,
            )
        )
        self.iteration = bind(
            h(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                ITERATION_BUCKETS,
                names,
            )
        )
        self.prefix_queries = bind(
            c(
                "vllm:gpu_prefix_cache_queries" if self.legacy else "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                names,
            )
        )
        self.prefix_hits = bind(
            c(
                "vllm:gpu_prefix_cache_hits" if self.legacy else "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                names,
            )
        )
        if self.legacy:
            self.itl = bind(
                h(
                    "vllm:time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.",
                    ITL_BUCKETS,
                    names,
                )
            )
        else:
            self._declare_v1(names, tok)
        self.start = g(
            "process_start_time_seconds", "Start time of the process since unix epoch in seconds."
        )
        self.start.set(time.time())

    def _bind(self, metric: Any) -> Any:
        return self.child(metric, **self.labels)

    def _declare_v1(self, names: list[str], tok: list[float]) -> None:
        g, c, h, bind = self.gauge, self.counter, self.histogram, self._bind
        by_reason = g(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by reason.",
            [*names, "reason"],
        )
        self.waiting_capacity = by_reason.labels(**self.labels, reason="capacity")
        by_reason.labels(**self.labels, reason="deferred").set(0)
        self.itl = bind(
            h(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
                names,
            )
        )
        self.tpot = bind(
            h(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                ITL_BUCKETS,
                names,
            )
        )
        self.inference = bind(
            h(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                LATENCY_BUCKETS,
                names,
            )
        )
        self.prefill_time = bind(
            h(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                LATENCY_BUCKETS,
                names,
            )
        )
        self.decode_time = bind(
            h(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                LATENCY_BUCKETS,
                names,
            )
        )
        self.req_preemptions = bind(
            h(
                "vllm:request_num_preemptions",
                "Number of preemptions per finished request.",
                PREEMPTION_BUCKETS,
                names,
            )
        )
        self.max_tokens = bind(
            h(
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                tok,
                names,
            )
        )
        self.corrupted = bind(
            c(
                "vllm:corrupted_requests",
                "Corrupted requests, in terms of total number of requests with NaNs in logits.",
                names,
            )
        )
        by_source = c(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", [*names, "source"]
        )
        self.prompt_local = by_source.labels(**self.labels, source="local_compute")
        for source in ("local_cache_hit", "external_kv_transfer"):
            by_source.labels(**self.labels, source=source)
        self.cache_info = g(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [
                "block_size",
                "num_gpu_blocks",
                "gpu_memory_utilization",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
            ],
        )

    # ---- events -----------------------------------------------------------------------
    def on_scheduled(self, req: SimRequest, queue_s: float) -> None:
        self.queue.observe(queue_s)

    def on_first_token(self, req: SimRequest, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)
        # vLLM counts a request's prompt once, when its prefill completes (not on recompute)
        self.prompt_tokens.inc(req.prompt_tokens)
        self.prefix_queries.inc(req.prompt_tokens)
        self.prefix_hits.inc(prefix_hit_tokens(req.prompt_tokens) if req.prefix_cached else 0)
        if not self.legacy:
            self.prompt_local.inc(req.prompt_tokens)

    def on_tokens(self, req: SimRequest, tokens: int, itl_s: float | None) -> None:
        if itl_s is not None:
            self.itl.observe(itl_s)

    def on_step(self, prefill_tokens: int, decode_tokens: int, duration_s: float) -> None:
        if decode_tokens:
            self.generation_tokens.inc(decode_tokens)
        self.iteration.observe(prefill_tokens + decode_tokens)

    def on_preempt(self, req: SimRequest) -> None:
        self.preemptions.inc()

    def on_finish(self, req: SimRequest) -> None:
        reason = req.finish_reason or "abort"
        if reason not in self.success:
            reason = "abort"
        self.success[reason].inc()
        if req.finish_reason == "abort" and req.first_token_s is None:
            return  # vLLM records latency histograms only for requests that produced output
        end = req.finished_s or req.arrival_s
        self.e2e.observe(end - req.arrival_s)
        self.req_prompt.observe(req.prompt_tokens)
        self.req_gen.observe(req.generated)
        if self.legacy:
            return
        if req.corrupted:
            self.corrupted.inc()
        self.max_tokens.observe(req.max_tokens)
        self.req_preemptions.observe(req.preemptions)
        scheduled = req.scheduled_s if req.scheduled_s is not None else end
        first = req.first_token_s if req.first_token_s is not None else end
        self.inference.observe(end - scheduled)
        self.prefill_time.observe(first - scheduled)
        self.decode_time.observe(end - first)
        self.tpot.observe((end - first) / (req.generated - 1) if req.generated > 1 else 0.0)

    def refresh(self, engine: EngineModel, now_s: float) -> None:
        self.running.set(len(engine.running))
        self.waiting.set(len(engine.waiting))
        self.kv_usage.set(engine.kv_usage(now_s))
        if not self.legacy:
            self.waiting_capacity.set(len(engine.waiting))
            cfg = engine.config
            self.cache_info.labels(
                block_size=str(cfg.block_size),
                num_gpu_blocks=str(cfg.num_gpu_blocks),
                gpu_memory_utilization="0.9",
                cache_dtype="auto",
                enable_prefix_caching="True",
                engine="0",
            ).set(1)


class VllmLegacyDialect(VllmDialect):
    """vLLM ≤ 0.10 names: ``gpu_cache_usage_perc``, per-step TPOT, no ``engine`` label."""

    name = "vllm-legacy"
    legacy = True
    finished_reasons = ("stop", "length", "abort")
