"""Realistic example expositions built from the documented metric names of each engine.

The engine examples are rendered by prometheus-client itself (so the text is real 0.0.4
exposition, ``_created`` series included); the dcgm-exporter example is rendered with the
exporter's own label template and ``%f`` formatting. Names, labels and default buckets
follow ``reference/engine-metrics.md``. Used by tests, ``bench/parse.py`` and
``llmslo scrape --help`` examples; values are random but plausible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pipeline.buckets import (
    SGLANG_ITL_S,
    SGLANG_TTFT_S,
    VLLM_ITL_S,
    VLLM_REQUEST_LATENCY_S,
    VLLM_TTFT_S,
)

__all__ = [
    "dcgm_exposition",
    "llamacpp_exposition",
    "sglang_exposition",
    "triton_exposition",
    "trtllm_serve_exposition",
    "vllm_exposition",
]

VLLM_TTFT = VLLM_TTFT_S
VLLM_ITL = VLLM_ITL_S
VLLM_LATENCY = VLLM_REQUEST_LATENCY_S
VLLM_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
SGLANG_TTFT = SGLANG_TTFT_S
SGLANG_ITL = SGLANG_ITL_S


def _observe(
    hist: Histogram, labels: Sequence[str], rng: random.Random, scale: float, n: int
) -> None:
    child = hist.labels(*labels)
    for _ in range(n):
        child.observe(rng.expovariate(1 / scale))


def vllm_exposition(
    *,
    engines: int = 1,
    model: str = "llama-3-8b",
    legacy: bool = False,
    seed: int = 0,
    observations: int = 20,
) -> str:
    """A vLLM pod's ``/metrics``: V1 current names, or ≤ 0.10 names with ``legacy=True``.

    ``engines > 1`` renders a data-parallel pod (``engine="0".."N-1"``). Legacy (0.8–0.10)
    uses ``gpu_cache_usage_perc``, the per-step ``time_per_output_token_seconds`` and, as
    the oldest releases did, no ``engine`` label.
    """
    rng = random.Random(seed)
    reg = CollectorRegistry()
    names = ["model_name"] if legacy else ["engine", "model_name"]
    running = Gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        names,
        registry=reg,
    )
    waiting = Gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        names,
        registry=reg,
    )
    kv_name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    kv = Gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", names, registry=reg)
    counters = {
        name: Counter(name, doc, names, registry=reg)
        for name, doc in (
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
            ("vllm:prompt_tokens", "Number of prefill tokens processed."),
            ("vllm:generation_tokens", "Number of generation tokens processed."),
        )
    }
    success = Counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [*names, "finished_reason"],
        registry=reg,
    )
    hists = [
        (
            Histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                names,
                buckets=VLLM_TTFT,
                registry=reg,
            ),
            0.3,
        ),
        (
            Histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                names,
                buckets=VLLM_LATENCY,
                registry=reg,
            ),
            8.0,
        ),
        (
            Histogram(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase.",
                names,
                buckets=VLLM_LATENCY,
                registry=reg,
            ),
            0.5,
        ),
        (
            Histogram(
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                names,
                buckets=VLLM_TOKENS,
                registry=reg,
            ),
            800.0,
        ),
        (
            Histogram(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                names,
                buckets=VLLM_TOKENS,
                registry=reg,
            ),
            200.0,
        ),
    ]
    if legacy:
        hists.append(
            (
                Histogram(
                    "vllm:time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.",
                    names,
                    buckets=VLLM_ITL,
                    registry=reg,
                ),
                0.03,
            )
        )
    else:
        hists += [
            (
                Histogram(
                    "vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.",
                    names,
                    buckets=VLLM_ITL,
                    registry=reg,
                ),
                0.03,
            ),
            (
                Histogram(
                    "vllm:request_time_per_output_token_seconds",
                    "Histogram of time_per_output_token_seconds per request.",
                    names,
                    buckets=VLLM_ITL,
                    registry=reg,
                ),
                0.03,
            ),
            (
                Histogram(
                    "vllm:request_prefill_time_seconds",
                    "Histogram of time spent in PREFILL phase for request.",
                    names,
                    buckets=VLLM_LATENCY,
                    registry=reg,
                ),
                0.2,
            ),
            (
                Histogram(
                    "vllm:request_decode_time_seconds",
                    "Histogram of time spent in DECODE phase for request.",
                    names,
                    buckets=VLLM_LATENCY,
                    registry=reg,
                ),
                6.0,
            ),
        ]
    for engine in range(engines):
        labels = [model] if legacy else [str(engine), model]
        running.labels(*labels).set(rng.randint(0, 64))
        waiting.labels(*labels).set(rng.randint(0, 8))
        kv.labels(*labels).set(round(rng.uniform(0.1, 0.9), 6))
        for counter in counters.values():
            counter.labels(*labels).inc(rng.randint(0, 10**7))
        for reason in ("stop", "length", "abort"):
            success.labels(*labels, reason).inc(rng.randint(0, 1000))
        for hist, scale in hists:
            _observe(hist, labels, rng, scale, observations)
    return generate_latest(reg).decode()


def sglang_exposition(
    *,
    model: str = "llama-3-8b",
    legacy_name_label: bool = False,
    dp_ranks: int = 1,
    seed: int = 0,
) -> str:
    """An SGLang server's ``/metrics`` (0.5.x labels), or ~0.3 with the single ``name`` label."""
    rng = random.Random(seed)
    reg = CollectorRegistry()
    if legacy_name_label:
        sched = tok = ["name"]
    else:
        sched = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
        tok = ["model_name", "engine_type"]
    gauges = [
        Gauge(n, d, sched, registry=reg)
        for n, d in (
            ("sglang:num_running_reqs", "The number of running requests."),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
            ("sglang:token_usage", "The token usage."),
            ("sglang:gen_throughput", "The generation throughput (token/s)."),
            ("sglang:num_retracted_reqs", "The number of retracted requests."),
        )
    ]
    realtime = Counter(
        "sglang:realtime_tokens", "Tokens processed.", [*sched, "mode"], registry=reg
    )
    prompt = Counter(
        "sglang:prompt_tokens", "Number of prefill tokens processed.", tok, registry=reg
    )
    gen = Counter(
        "sglang:generation_tokens", "Number of generation tokens processed.", tok, registry=reg
    )
    ttft = Histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        tok,
        buckets=SGLANG_TTFT,
        registry=reg,
    )
    itl = Histogram(
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        tok,
        buckets=SGLANG_ITL,
        registry=reg,
    )
    tok_values = [model] if legacy_name_label else [model, "unified"]
    for rank in range(dp_ranks):
        values = [model] if legacy_name_label else [model, "unified", "0", "0", str(rank)]
        for gauge in gauges:
            gauge.labels(*values).set(round(rng.uniform(0, 50), 3))
        if not legacy_name_label:
            realtime.labels(*values, "decode").inc(rng.randint(0, 10**6))
    prompt.labels(*tok_values).inc(rng.randint(0, 10**6))
    gen.labels(*tok_values).inc(rng.randint(0, 10**6))
    _observe(ttft, tok_values, rng, 0.5, 20)
    _observe(itl, tok_values, rng, 0.02, 20)
    return generate_latest(reg).decode()


def triton_exposition(*, model: str = "tensorrt_llm", seed: int = 0) -> str:
    """A Triton + tensorrtllm_backend ``:8002/metrics`` with the category-label families."""
    rng = random.Random(seed)
    reg = CollectorRegistry()
    families = {
        ("nv_trt_llm_request_metrics", "request_type"): (
            "active",
            "max",
            "scheduled",
            "context",
            "waiting",
        ),
        ("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type"): (
            "max",
            "free",
            "used",
            "tokens_per",
            "fraction",
        ),
        ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric"): (
            "total_context_tokens",
            "generation_requests",
            "micro_batch_id",
            "paused_requests",
        ),
        ("nv_trt_llm_general_metrics", "general_type"): ("timestamp", "iteration_counter"),
    }
    for (name, category), values in families.items():
        gauge = Gauge(name, "TRT LLM metrics", ["model", "version", category], registry=reg)
        for value in values:
            number = rng.uniform(0, 1) if value == "fraction" else rng.randint(0, 4096)
            gauge.labels(model, "1", value).set(number)
    success = Counter(
        "nv_inference_request_success",
        "Number of successful inference requests",
        ["model", "version"],
        registry=reg,
    )
    success.labels(model, "1").inc(rng.randint(0, 10**5))
    first = Histogram(
        "nv_inference_first_response_histogram_ms",
        "Duration from request to first response in milliseconds",
        ["model", "version"],
        buckets=(100, 500, 2000, 5000),
        registry=reg,
    )
    _observe(first, [model, "1"], rng, 300.0, 20)
    text = generate_latest(reg).decode()
    return text.replace("nv_inference_request_success_total", "nv_inference_request_success")


def trtllm_serve_exposition(*, model: str = "llama-3-8b", seed: int = 0) -> str:
    """trtllm-serve ``/prometheus/metrics`` (1.0-era: no prefix, ``engine_type`` label)."""
    rng = random.Random(seed)
    reg = CollectorRegistry()
    names = ["model_name", "engine_type"]
    success = Counter(
        "request_success",
        "Count of successfully processed requests.",
        [*names, "finished_reason"],
        registry=reg,
    )
    success.labels(model, "trtllm", "stop").inc(rng.randint(0, 1000))
    for name, buckets, scale in (
        ("time_to_first_token_seconds", VLLM_TTFT, 0.3),
        ("time_per_output_token_seconds", VLLM_ITL, 0.03),
        ("e2e_request_latency_seconds", VLLM_LATENCY, 8.0),
        ("request_queue_time_seconds", VLLM_LATENCY, 0.5),
    ):
        hist = Histogram(name, f"Histogram of {name}.", names, buckets=buckets, registry=reg)
        _observe(hist, [model, "trtllm"], rng, scale, 20)
    return generate_latest(reg).decode()


def llamacpp_exposition(*, seed: int = 0) -> str:
    """llama.cpp ``llama-server --metrics``: no labels at all."""
    rng = random.Random(seed)
    reg = CollectorRegistry()
    for name in (
        "prompt_tokens",
        "prompt_seconds",
        "tokens_predicted",
        "tokens_predicted_seconds",
        "n_decode",
    ):
        Counter(f"llamacpp:{name}", name, registry=reg).inc(rng.randint(0, 10**6))
    for name in (
        "requests_processing",
        "requests_deferred",
        "prompt_tokens_seconds",
        "predicted_tokens_seconds",
    ):
        Gauge(f"llamacpp:{name}", name, registry=reg).set(rng.randint(0, 8))
    return generate_latest(reg).decode()


def epp_exposition(*, legacy: bool = False, model: str = "llama-3-8b", seed: int = 0) -> str:
    """Gateway API Inference Extension endpoint picker (EPP) on :9090: ``inference_objective_*``
    (v1) or ``inference_model_*`` (v0.x, InferenceModel), pool gauges by ``name``."""
    rng = random.Random(seed)
    reg = CollectorRegistry()
    prefix = "inference_model" if legacy else "inference_objective"
    labels = ["model_name", "target_model_name"]
    Counter(f"{prefix}_request", "requests", labels, registry=reg).labels(model, model).inc(
        rng.randint(100, 1000)
    )
    errors = Counter(f"{prefix}_request_error", "errors", [*labels, "error_code"], registry=reg)
    errors.labels(model, model, "ServiceUnavailable").inc(rng.randint(0, 10))
    Gauge(f"{prefix}_running_requests", "running", ["model_name"], registry=reg).labels(model).set(
        3
    )
    Gauge("inference_pool_ready_pods", "ready", ["name"], registry=reg).labels("pool-a").set(4)
    Gauge("inference_pool_average_queue_size", "queue", ["name"], registry=reg).labels(
        "pool-a"
    ).set(1)
    Gauge("inference_pool_average_kv_cache_utilization", "kv", ["name"], registry=reg).labels(
        "pool-a"
    ).set(0.4)
    return generate_latest(reg).decode()


_DCGM_FIELDS = (
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        lambda r: r.randint(210, 1980),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda r: r.randint(30, 80)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda r: r.uniform(60, 700)),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda r: r.randint(10**9, 10**12),
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda r: r.randint(0, 100)),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda r: r.randint(0, 100),
    ),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda r: 0),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda r: r.randint(1000, 8000),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        lambda r: r.randint(70000, 79000),
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda r: r.uniform(0, 1),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda r: r.uniform(0, 1),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active.",
        lambda r: r.uniform(0, 1),
    ),
)


def dcgm_exposition(
    *,
    gpus: int = 8,
    hostname: str = "node-0",
    lowercase: bool = False,
    mig: bool = False,
    allocated: Mapping[int, tuple[str, str, str]] | None = None,
    xid: Mapping[int, int] | None = None,
    blank_memory_temp: bool = False,
    seed: int = 0,
) -> str:
    """A dcgm-exporter ``:9400/metrics`` page for one node.

    ``lowercase`` uses the newest ``hostname`` label and the old-namespace ``uuid``;
    ``mig`` splits GPU 0 into two MIG instances (``GPU_I_ID``); ``allocated`` maps a GPU
    index to ``(pod, namespace, container)`` (pod labels appear only on those GPUs);
    ``xid`` sets the last XID per GPU; ``blank_memory_temp`` prints the DCGM int64 blank
    sentinel the old exporters emitted for an unsupported field.
    """
    rng = random.Random(seed)
    allocated = allocated or {}
    xid = xid or {}
    host_label = "hostname" if lowercase else "Hostname"
    uuid_label = "uuid" if lowercase else "UUID"
    entities: list[tuple[int, str]] = []
    for gpu in range(gpus):
        if mig and gpu == 0:
            entities += [
                (0, ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"'),
                (0, ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"'),
            ]
        else:
            entities.append((gpu, ""))
    lines: list[str] = []
    fields = list(_DCGM_FIELDS)
    if blank_memory_temp:
        fields.append(
            (
                "DCGM_FI_DEV_MEMORY_TEMP",
                "gauge",
                "Memory temperature (in C).",
                lambda r: 9223372036854775794,
            )
        )
    for name, type_, doc, make in fields:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {type_}"]
        for gpu, mig_labels in entities:
            labels = (
                f'gpu="{gpu}",{uuid_label}="GPU-{gpu:08d}-aaaa-bbbb-cccc-{gpu:012d}",'
                f'pci_bus_id="00000000:{gpu + 0x10:02X}:00.0",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3"{mig_labels},{host_label}="{hostname}",'
                f'DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            if gpu in allocated:
                pod, namespace, container = allocated[gpu]
                labels += f',container="{container}",namespace="{namespace}",pod="{pod}"'
            value: float = make(rng)
            if name == "DCGM_FI_DEV_XID_ERRORS" and gpu in xid:
                value = xid[gpu]
                labels += f',err_code="{xid[gpu]}",err_msg="GPU has fallen off the bus"'
            text = f"{value:f}" if isinstance(value, float) else str(value)
            lines.append(f"{name}{{{labels}}} {text}")
    return "\n".join(lines) + "\n"
