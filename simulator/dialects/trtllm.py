"""TensorRT-LLM behind Triton (tensorrtllm_backend v0.18): ``nv_trt_llm_*`` and ``nv_inference_*``.

Labels ``model``, ``version`` plus one category label per family (reference/engine-metrics.md
§3.1). Triton counters are exposed without a ``_total`` suffix and there are no
``*_created`` series; prometheus-client renders them and the suffix is removed from the
few Triton counter families after rendering. There is no TTFT or ITL histogram in Triton.
"""

from __future__ import annotations

import time
from typing import Any

from simulator.dialects._base import MetricsDialect
from simulator.engine import EngineModel, SimRequest

__all__ = ["TrtllmDialect"]

TOKEN_LEN_BUCKETS = (10, 50, 100, 500, 1000)
_TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)


class TrtllmDialect(MetricsDialect):
    """Triton + TensorRT-LLM inflight batcher metrics."""

    name = "trtllm"
    emit_created = False

    def __init__(self, model: str, max_model_len: int) -> None:
        super().__init__(model, max_model_len)
        base = {"model": model, "version": "1"}
        self._base = base
        bn = list(base)
        g, c, h = self.gauge, self.counter, self.histogram

        def family(name: str, doc: str, label: str, values: tuple[str, ...]) -> dict[str, Any]:
            metric = g(name, doc, [*bn, label])
            return {v: metric.labels(**base, **{label: v}) for v in values}

        self.request = family(
            "nv_trt_llm_request_metrics",
            "TRT LLM request metrics",
            "request_type",
            ("active", "max", "scheduled", "context", "waiting"),
        )
        self.kv = family(
            "nv_trt_llm_kv_cache_block_metrics",
            "TRT LLM KV cache block metrics",
            "kv_cache_block_type",
            ("max", "free", "used", "tokens_per", "reused", "fraction"),
        )
        self.memory = family(
            "nv_trt_llm_runtime_memory_metrics",
            "TRT LLM runtime memory metrics",
            "memory_type",
            ("cpu", "gpu", "pinned"),
        )
        self.ifb = family(
            "nv_trt_llm_inflight_batcher_metrics",
            "TRT LLM inflight_batcher-specific metrics",
            "inflight_batcher_specific_metric",
            ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"),
        )
        self.general = family(
            "nv_trt_llm_general_metrics",
            "General TRT LLM metrics",
            "general_type",
            ("timestamp", "iteration_counter"),
        )
        tokens = h(
            "nv_llm_input_token_len",
            "TRT LLM response input token length",
            TOKEN_LEN_BUCKETS,
            [*bn, "response_metric_type"],
        )
        self.input_len = tokens.labels(**base, response_metric_type="total_input_tokens")
        out = h(
            "nv_llm_output_token_len",
            "TRT LLM response output token length",
            TOKEN_LEN_BUCKETS,
            [*bn, "response_metric_type"],
        )
        self.output_len = out.labels(**base, response_metric_type="total_output_tokens")
        docs = {
            "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
            "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
            "nv_inference_count": "Number of inferences performed (does not include cached requests)",
            "nv_inference_exec_count": "Number of model executions performed (does not include cached requests)",
            "nv_inference_request_duration_us": "Cumulative inference request duration in microseconds (includes cached requests)",
            "nv_inference_queue_duration_us": "Cumulative inference queuing duration in microseconds (includes cached requests)",
            "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in microseconds (does not include cached requests)",
        }
        self.triton = {name: c(name, docs[name], bn).labels(**base) for name in _TRITON_COUNTERS}
        self.pending = g(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            bn,
        ).labels(**base)

    def on_scheduled(self, req: SimRequest, queue_s: float) -> None:
        self.triton["nv_inference_queue_duration_us"].inc(queue_s * 1e6)

    def on_step(self, prefill_tokens: int, decode_tokens: int, duration_s: float) -> None:
        self.triton["nv_inference_exec_count"].inc()
        self.triton["nv_inference_compute_infer_duration_us"].inc(duration_s * 1e6)
        self._last_context_tokens = prefill_tokens

    def on_finish(self, req: SimRequest) -> None:
        end = req.finished_s or req.arrival_s
        ok = req.finish_reason in ("stop", "length")
        self.triton["nv_inference_request_success" if ok else "nv_inference_request_failure"].inc()
        self.triton["nv_inference_count"].inc()
        self.triton["nv_inference_request_duration_us"].inc((end - req.arrival_s) * 1e6)
        self.input_len.observe(req.prompt_tokens)
        self.output_len.observe(req.generated)

    def refresh(self, engine: EngineModel, now_s: float) -> None:
        cfg = engine.config
        free = engine.free_blocks(now_s)
        used = cfg.num_gpu_blocks - free
        context = sum(1 for r in engine.running if r.first_token_s is None)
        for key, count in (
            ("active", len(engine.running)),
            ("max", cfg.max_num_seqs),
            ("scheduled", len(engine.running)),
            ("context", context),
            ("waiting", len(engine.waiting)),
        ):
            self.request[key].set(count)
        kv_values: tuple[tuple[str, float], ...] = (
            ("max", cfg.num_gpu_blocks),
            ("free", free),
            ("used", used),
            ("tokens_per", cfg.block_size),
            ("reused", 0),
            ("fraction", used / cfg.num_gpu_blocks),
        )
        for key, value in kv_values:
            self.kv[key].set(value)
        self.memory["gpu"].set(72 * 2**30)
        self.memory["cpu"].set(2 * 2**30)
        self.memory["pinned"].set(512 * 2**20)
        self.ifb["total_context_tokens"].set(getattr(self, "_last_context_tokens", 0))
        self.ifb["generation_requests"].set(len(engine.running) - context)
        self.ifb["micro_batch_id"].set(0)
        self.ifb["paused_requests"].set(sum(1 for r in engine.waiting if r.preemptions))
        self.general["iteration_counter"].set(engine.iterations)
        self.general["timestamp"].set(int(time.time() * 1e6))
        self.pending.set(len(engine.waiting))

    def exposition(self, engine: EngineModel, now_s: float) -> bytes:
        text = super().exposition(engine, now_s)
        for name in _TRITON_COUNTERS:  # Triton's counters have no _total suffix
            text = text.replace(f"{name}_total".encode(), name.encode())
        return text
