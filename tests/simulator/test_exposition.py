"""Every dialect's /metrics parses with prometheus-client, has the documented families,
labels and buckets, and its counters add up to the requests the pod served."""

from __future__ import annotations

import math

import pytest

from simulator.dialects.sglang import TTFT_BUCKETS as SGLANG_TTFT
from simulator.dialects.vllm import TTFT_BUCKETS as VLLM_TTFT
from tests.simulator.conftest import MODEL, completion, get, post, scrape, value

DOCUMENTED = {
    "vllm": {
        "vllm:num_requests_running": {"model_name", "engine"},
        "vllm:num_requests_waiting": {"model_name", "engine"},
        "vllm:kv_cache_usage_perc": {"model_name", "engine"},
        "vllm:num_preemptions_total": {"model_name", "engine"},
        "vllm:prompt_tokens_total": {"model_name", "engine"},
        "vllm:generation_tokens_total": {"model_name", "engine"},
        "vllm:request_success_total": {"model_name", "engine", "finished_reason"},
        "vllm:time_to_first_token_seconds_bucket": {"model_name", "engine", "le"},
        "vllm:inter_token_latency_seconds_bucket": {"model_name", "engine", "le"},
        "vllm:request_time_per_output_token_seconds_bucket": {"model_name", "engine", "le"},
        "vllm:e2e_request_latency_seconds_bucket": {"model_name", "engine", "le"},
        "vllm:request_queue_time_seconds_bucket": {"model_name", "engine", "le"},
        "vllm:iteration_tokens_total_bucket": {"model_name", "engine", "le"},
        "vllm:corrupted_requests_total": {"model_name", "engine"},
        "vllm:cache_config_info": {"block_size", "num_gpu_blocks", "engine"},
    },
    "vllm-legacy": {
        "vllm:num_requests_running": {"model_name"},
        "vllm:gpu_cache_usage_perc": {"model_name"},
        "vllm:generation_tokens_total": {"model_name"},
        "vllm:request_success_total": {"model_name", "finished_reason"},
        "vllm:time_to_first_token_seconds_bucket": {"model_name", "le"},
        "vllm:time_per_output_token_seconds_bucket": {"model_name", "le"},
        "vllm:e2e_request_latency_seconds_bucket": {"model_name", "le"},
    },
    "sglang": {
        "sglang:num_running_reqs": {"model_name", "engine_type", "tp_rank", "pp_rank"},
        "sglang:num_queue_reqs": {"model_name", "engine_type", "tp_rank", "pp_rank"},
        "sglang:token_usage": {"model_name", "engine_type", "tp_rank", "pp_rank"},
        "sglang:gen_throughput": {"model_name", "engine_type", "tp_rank", "pp_rank"},
        "sglang:realtime_tokens_total": {"model_name", "engine_type", "mode"},
        "sglang:num_retracted_requests_total": {"model_name", "engine_type"},
        "sglang:prompt_tokens_total": {"model_name", "engine_type", "is_streaming"},
        "sglang:generation_tokens_total": {"model_name", "engine_type", "is_streaming"},
        "sglang:num_requests_total": {"model_name", "is_streaming"},
        "sglang:time_to_first_token_seconds_bucket": {"model_name", "is_streaming", "le"},
        "sglang:inter_token_latency_seconds_bucket": {"model_name", "le"},
        "sglang:e2e_request_latency_seconds_bucket": {"model_name", "is_streaming", "le"},
    },
    "trtllm": {
        "nv_trt_llm_request_metrics": {"model", "version", "request_type"},
        "nv_trt_llm_kv_cache_block_metrics": {"model", "version", "kv_cache_block_type"},
        "nv_trt_llm_inflight_batcher_metrics": {
            "model",
            "version",
            "inflight_batcher_specific_metric",
        },
        "nv_trt_llm_general_metrics": {"model", "version", "general_type"},
        # prometheus-client's parser reports Triton's suffix-less counters as *_total samples
        "nv_inference_request_success_total": {"model", "version"},
        "nv_inference_count_total": {"model", "version"},
        "nv_llm_output_token_len_bucket": {"model", "version", "response_metric_type", "le"},
    },
}


@pytest.mark.parametrize("dialect", sorted(DOCUMENTED))
def test_exposition_has_documented_names_and_labels(make_fleet, dialect):
    fleet = make_fleet([dialect])
    pod = fleet.pods[0]
    assert post(pod.url + "/v1/completions", completion(4))[0] == 200
    samples = scrape(pod.url)
    for name, labels in DOCUMENTED[dialect].items():
        assert name in samples, f"{dialect}: {name} missing"
        assert any(labels <= set(lab) for lab, _, _ in samples[name]), f"{name} lacks {labels}"
    if dialect == "vllm-legacy":
        assert "vllm:kv_cache_usage_perc" not in samples
        assert all("engine" not in lab for rows in samples.values() for lab, _, _ in rows)
    if dialect in ("sglang", "trtllm"):
        assert not any(name.endswith("_created") for name in samples), (
            "multiprocess/Triton has no _created"
        )


@pytest.mark.parametrize(
    ("dialect", "family", "bounds"),
    [
        ("vllm", "vllm:time_to_first_token_seconds", VLLM_TTFT),
        ("vllm-legacy", "vllm:time_to_first_token_seconds", VLLM_TTFT),
        ("sglang", "sglang:time_to_first_token_seconds", SGLANG_TTFT),
        ("trtllm", "nv_llm_output_token_len", (10, 50, 100, 500, 1000)),
    ],
)
def test_bucket_bounds_are_the_documented_ones(make_fleet, dialect, family, bounds):
    fleet = make_fleet([dialect])
    samples = scrape(fleet.pods[0].url)
    les = sorted({float(lab["le"]) for lab, _, _ in samples[family + "_bucket"]})
    assert les == sorted([float(b) for b in bounds] + [math.inf])


def test_vllm_ttft_bounds_match_reference_text():
    # reference/engine-metrics.md §1.1: 0.001 … 2560, 22 bounds
    assert VLLM_TTFT[0] == 0.001 and VLLM_TTFT[-1] == 2560.0 and len(VLLM_TTFT) == 22


@pytest.mark.parametrize("dialect", ["vllm", "vllm-legacy", "sglang", "trtllm"])
def test_counters_add_up_to_requests_served(make_fleet, dialect):
    fleet = make_fleet([dialect])
    pod = fleet.pods[0]
    lengths = [3, 5, 8, 13]
    for n in lengths:
        status, _ = post(pod.url + "/v1/completions", completion(n, prompt_chars=400))
        assert status == 200
    status, _ = post(
        pod.url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "b" * 400}],
            "max_tokens": 6,
            "ignore_eos": True,
            "stream": True,
        },
    )
    assert status == 200
    served, tokens, prompt = len(lengths) + 1, sum(lengths) + 6, 100 * (len(lengths) + 1)
    s = scrape(pod.url)
    if dialect.startswith("vllm"):
        assert value(s, "vllm:request_success_total") == served
        assert value(s, "vllm:request_success_total", finished_reason="length") == served
        assert value(s, "vllm:generation_tokens_total") == tokens
        assert value(s, "vllm:prompt_tokens_total") == prompt
        assert value(s, "vllm:time_to_first_token_seconds_count") == served
        assert value(s, "vllm:e2e_request_latency_seconds_count") == served
        assert value(s, "vllm:num_requests_running") == 0
    elif dialect == "sglang":
        assert value(s, "sglang:num_requests_total") == served
        assert value(s, "sglang:num_requests_total", is_streaming="true") == 1
        assert value(s, "sglang:generation_tokens_total") == tokens
        assert value(s, "sglang:realtime_tokens_total", mode="decode") == tokens
        assert value(s, "sglang:prompt_tokens_total") == prompt
    else:
        assert value(s, "nv_inference_request_success_total") == served
        assert value(s, "nv_inference_count_total") == served
        assert value(s, "nv_llm_output_token_len_sum") == tokens
        assert value(s, "nv_llm_input_token_len_sum") == prompt


def test_histogram_observations_come_from_real_timings(make_fleet):
    fleet = make_fleet(["vllm"], speed=1.0)
    pod = fleet.pods[0]
    post(pod.url + "/v1/completions", completion(10, prompt_chars=4000))
    s = scrape(pod.url)
    # prefill of 1000 tokens ≈ 6.9 + 0.107 * 1000 ms ≈ 114 ms, then 9 decode steps of ~29 ms
    ttft = value(s, "vllm:time_to_first_token_seconds_sum")
    assert 0.08 < ttft < 2.0
    itl_mean = value(s, "vllm:inter_token_latency_seconds_sum") / value(
        s, "vllm:inter_token_latency_seconds_count"
    )
    assert 0.02 < itl_mean < 0.5
    assert value(s, "vllm:inter_token_latency_seconds_count") == 9


def test_triton_counters_have_no_total_suffix_on_the_wire(make_fleet):
    fleet = make_fleet(["trtllm"])
    text = get(fleet.pods[0].url + "/metrics")[1].decode()
    assert "# TYPE nv_inference_count counter\n" in text
    assert "nv_inference_count{" in text and "nv_inference_count_total" not in text


def test_counters_add_up_under_preemption(make_fleet):
    """KV too small for the batch: requests are preempted and recomputed, yet every prompt is
    counted once and every generated token once."""
    import threading

    fleet = make_fleet(["vllm"], speed=20, num_gpu_blocks=24, block_size=16)
    pod = fleet.pods[0]
    bodies = [completion(60, prompt_chars=400) for _ in range(6)]  # 100-token prompts
    threads = [threading.Thread(target=post, args=(pod.url + "/v1/completions", b)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s = scrape(pod.url)
    assert value(s, "vllm:num_preemptions_total") > 0
    assert value(s, "vllm:request_success_total", finished_reason="length") == 6
    assert value(s, "vllm:generation_tokens_total") == 6 * 60
    assert value(s, "vllm:prompt_tokens_total") == 6 * 100
    assert value(s, "vllm:request_num_preemptions_sum") == value(s, "vllm:num_preemptions_total")
    assert value(s, "vllm:kv_cache_usage_perc") == 0
