"""Engines' default histogram bucket bounds, as data (reference/engine-metrics.md §1.1, §2).

These are what an engine exposes when nobody overrides them (vLLM
``--custom-histogram-buckets``, SGLang ``--bucket-*``). The simulator exposes them, the
collectors' examples are built from them, and the SLO engine checks an engine-sourced
threshold against them when no scrape has shown the real bounds yet. Collectors never
rely on them: bounds are always read from each scrape.
"""

from __future__ import annotations

__all__ = [
    "SGLANG_E2E_S",
    "SGLANG_ITL_S",
    "SGLANG_QUEUE_S",
    "SGLANG_TTFT_S",
    "VLLM_ITERATION_TOKENS",
    "VLLM_ITL_S",
    "VLLM_PREEMPTIONS",
    "VLLM_REQUEST_LATENCY_S",
    "VLLM_TTFT_S",
]

#: vLLM ``time_to_first_token`` family (seconds).
VLLM_TTFT_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
#: vLLM ``inter_token_latency`` family (seconds): ITL, per-request TPOT, legacy per-step TPOT.
VLLM_ITL_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
#: vLLM ``request_latency`` family (seconds): e2e, queue, inference, prefill, decode.
VLLM_REQUEST_LATENCY_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
#: vLLM ``iteration_tokens`` family (tokens per engine step).
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: vLLM ``request_num_preemptions`` family.
VLLM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)
#: SGLang time to first token (seconds).
SGLANG_TTFT_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
#: SGLang inter-token latency (seconds).
SGLANG_ITL_S = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
)
#: SGLang end-to-end request latency (seconds).
SGLANG_E2E_S = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)
#: SGLang queue time (seconds).
SGLANG_QUEUE_S = (
    0.0,
    0.001,
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.06,
    0.07,
    0.08,
    0.09,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    5.0,
    10.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    100.0,
    200.0,
    300.0,
    600.0,
    1200.0,
    3000.0,
)
