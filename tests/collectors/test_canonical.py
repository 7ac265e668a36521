"""Dialect maps and canonical rows: legacy and edge formats built from the documented names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from collectors.canonical import TargetCanonicalizer
from collectors.dialects import load_dialects
from collectors.exposition import ExpositionParser
from pipeline.signals import ENGINE_SIGNALS, GPU_SIGNALS
from tests.collectors.examples import (
    dcgm_exposition,
    epp_exposition,
    llamacpp_exposition,
    sglang_exposition,
    triton_exposition,
    trtllm_serve_exposition,
    vllm_exposition,
)


def rows_of(
    text: str,
    *,
    ts_ms: int = 1000,
    canonicalizer: TargetCanonicalizer | None = None,
    parser: ExpositionParser | None = None,
) -> list[dict[str, Any]]:
    canonicalizer = canonicalizer or TargetCanonicalizer("10.0.0.7:8000")
    return canonicalizer.canonicalize(
        (parser or ExpositionParser()).parse(text), ts_ms
    ).table.to_pylist()


def signal_rows(rows: list[dict[str, Any]], signal: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["signal"] == signal]


@pytest.mark.parametrize(
    ("text", "dialect", "family_word", "expected"),
    [
        (
            vllm_exposition(),
            "vllm",
            "current",
            {"running", "waiting", "kv_usage", "ttft", "itl", "tpot", "generation_tokens"},
        ),
        (
            vllm_exposition(legacy=True),
            "vllm-legacy",
            "<=0.10",
            {"kv_usage", "itl", "ttft", "preemptions"},
        ),
        (
            sglang_exposition(),
            "sglang",
            "0.5",
            {"running", "waiting", "kv_usage", "ttft", "itl", "generation_tokens"},
        ),
        (
            sglang_exposition(legacy_name_label=True),
            "sglang",
            "name",
            {"running", "kv_usage", "ttft"},
        ),
        (
            triton_exposition(),
            "trtllm",
            "triton",
            {"running", "waiting", "kv_usage", "ttft", "requests_finished"},
        ),
        (trtllm_serve_exposition(), "trtllm", "serve", {"ttft", "tpot", "e2e", "queue_time"}),
        (llamacpp_exposition(), "llamacpp", "llama", {"running", "waiting", "generation_tokens"}),
        (
            epp_exposition(),
            "epp",
            "v1",
            {"gateway_requests", "gateway_request_errors", "gateway_running", "pool_ready_pods"},
        ),
        (
            epp_exposition(legacy=True),
            "epp",
            "v0",
            {"gateway_requests", "gateway_request_errors", "gateway_running", "pool_ready_pods"},
        ),
        (
            dcgm_exposition(),
            "dcgm",
            "Hostname",
            {"gpu_util", "engine_active", "fb_used_mib", "xid"},
        ),
    ],
    ids=[
        "vllm current",
        "vllm legacy",
        "sglang 0.5",
        "sglang name label",
        "triton",
        "trtllm-serve",
        "llama.cpp",
        "gateway router (EPP) v1",
        "gateway router (EPP) v0 InferenceModel",
        "dcgm",
    ],
)
def test_each_dialect_is_detected_and_mapped(
    text: str, dialect: str, family_word: str, expected: set[str]
) -> None:
    canonicalizer = TargetCanonicalizer("10.0.0.7:8000")
    rows = rows_of(text, canonicalizer=canonicalizer)
    assert canonicalizer.detection is not None
    assert canonicalizer.detection.dialect == dialect
    assert family_word in canonicalizer.detection.version_family
    assert expected <= {r["signal"] for r in rows}


def test_every_dialect_map_uses_only_canonical_signals() -> None:
    for engine in load_dialects().values():
        vocabulary = GPU_SIGNALS if engine.topic == "gpu" else ENGINE_SIGNALS
        assert all(s in vocabulary for rule in engine.metrics.values() for s in rule.signals())


def test_vllm_data_parallel_engines_and_model_become_columns() -> None:
    rows = rows_of(vllm_exposition(engines=4, model="qwen"))
    kv = signal_rows(rows, "kv_usage")
    assert sorted(r["engine"] for r in kv) == ["0", "1", "2", "3"]
    assert {(r["model"], r["pool"], r["labels_json"]) for r in kv} == {("qwen", "qwen", "{}")}


def test_vllm_legacy_per_step_tpot_is_itl_and_gpu_cache_is_kv_usage() -> None:
    rows = rows_of(vllm_exposition(legacy=True))
    assert {r["metric"] for r in signal_rows(rows, "itl")} == {
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_sum",
        "vllm:time_per_output_token_seconds_count",
    }
    assert not signal_rows(rows, "tpot")
    assert {r["metric"] for r in signal_rows(rows, "kv_usage")} == {"vllm:gpu_cache_usage_perc"}


def test_deprecated_alias_yields_to_the_new_name_when_both_are_exposed() -> None:
    text = vllm_exposition() + (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="llama-3-8b"} 0.5\n'
    )
    canonicalizer = TargetCanonicalizer("x:1")
    rows = rows_of(text, canonicalizer=canonicalizer)
    assert {r["metric"] for r in signal_rows(rows, "kv_usage")} == {"vllm:kv_cache_usage_perc"}
    assert (
        canonicalizer.detection is not None and "0.9-0.10" in canonicalizer.detection.version_family
    )


_L = 'engine="0",model_name="llama-3-8b"'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            vllm_exposition()
            + "# TYPE vllm:prefix_cache_queries_total counter\n"
            + f"vllm:prefix_cache_queries_total{{{_L}}} 4096\n"
            + "# TYPE vllm:prefix_cache_hits_total counter\n"
            + f"vllm:prefix_cache_hits_total{{{_L}}} 1024\n",
            {
                "prefix_cache_queries": {"vllm:prefix_cache_queries_total": 4096.0},
                "prefix_cache_hits": {"vllm:prefix_cache_hits_total": 1024.0},
            },
        ),
        (  # 0.9-0.11: both names side by side; the deprecated ones yield
            vllm_exposition(legacy=True)
            + "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
            + f"vllm:gpu_prefix_cache_queries_total{{{_L}}} 4096\n"
            + "# TYPE vllm:gpu_prefix_cache_hits_total counter\n"
            + f"vllm:gpu_prefix_cache_hits_total{{{_L}}} 1024\n"
            + "# TYPE vllm:prefix_cache_queries_total counter\n"
            + f"vllm:prefix_cache_queries_total{{{_L}}} 4096\n",
            {
                "prefix_cache_queries": {"vllm:prefix_cache_queries_total": 4096.0},
                "prefix_cache_hits": {"vllm:gpu_prefix_cache_hits_total": 1024.0},
            },
        ),
        (  # V0 reported the ratio itself
            vllm_exposition(legacy=True)
            + "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n"
            + 'vllm:gpu_prefix_cache_hit_rate{model_name="llama-3-8b"} 0.25\n',
            {"prefix_cache_hit_rate": {"vllm:gpu_prefix_cache_hit_rate": 0.25}},
        ),
        (
            sglang_exposition()
            + "# TYPE sglang:cache_hit_rate gauge\n"
            + 'sglang:cache_hit_rate{model_name="m",engine_type="unified",tp_rank="0"} 0.6\n',
            {"prefix_cache_hit_rate": {"sglang:cache_hit_rate": 0.6}},
        ),
    ],
    ids=["vllm current", "vllm 0.9-0.11 both names", "vllm V0 gauge", "sglang"],
)
def test_prefix_cache_metrics_become_signals_so_a_hit_ratio_exists(
    text: str, expected: dict[str, dict[str, float]]
) -> None:
    rows = rows_of(text)
    for signal, metrics in expected.items():
        assert {r["metric"]: r["value"] for r in signal_rows(rows, signal)} == metrics, signal
        assert signal in ENGINE_SIGNALS


def test_histogram_bounds_are_read_from_the_scrape_as_numbers_and_sum_before_buckets_works() -> (
    None
):
    text = (
        "# TYPE sglang:time_to_first_token_seconds histogram\n"
        'sglang:time_to_first_token_seconds_sum{name="m"} 8.128902e+06\n'
        'sglang:time_to_first_token_seconds_bucket{le="2.0",name="m"} 3\n'
        'sglang:time_to_first_token_seconds_bucket{name="m",le="7"} 4\n'
        'sglang:time_to_first_token_seconds_bucket{le="+Inf",name="m"} 5\n'
        'sglang:time_to_first_token_seconds_count{name="m"} 5\n'
    )
    rows = signal_rows(
        rows_of(text, canonicalizer=TargetCanonicalizer("x:1", dialect="sglang")), "ttft"
    )
    assert [(r["kind"], r["le"], r["value"]) for r in rows] == [
        ("sum", None, 8128902.0),
        ("bucket", 2.0, 3.0),
        ("bucket", 7.0, 4.0),
        ("bucket", float("inf"), 5.0),
        ("count", None, 5.0),
    ]
    assert {r["model"] for r in rows} == {"m"} and {r["labels_json"] for r in rows} == {"{}"}


def test_triton_category_labels_and_millisecond_histogram_are_converted() -> None:
    rows = rows_of(triton_exposition())
    running = signal_rows(rows, "running")
    assert len(running) == 1 and json.loads(running[0]["labels_json"])["request_type"] == "active"
    ttft_bounds = sorted(r["le"] for r in signal_rows(rows, "ttft") if r["kind"] == "bucket")
    assert ttft_bounds == [0.1, 0.5, 2.0, 5.0, float("inf")]
    unmapped = [
        r for r in rows if r["metric"] == "nv_trt_llm_request_metrics" and r["signal"] is None
    ]
    assert {json.loads(r["labels_json"])["request_type"] for r in unmapped} == {
        "max",
        "scheduled",
        "context",
    }


def test_dcgm_mig_lowercase_hostname_pods_only_on_allocated_gpus_and_xid() -> None:
    text = dcgm_exposition(
        gpus=2, lowercase=True, mig=True, allocated={1: ("pod-1", "serving", "vllm")}, xid={1: 79}
    )
    rows = rows_of(text, canonicalizer=TargetCanonicalizer("10.0.0.9:9400"))
    util = signal_rows(rows, "gpu_util")
    assert [(r["gpu"], r["gpu_instance_id"], r["pod"]) for r in util] == [
        (0, "1", None),
        (0, "2", None),
        (1, None, "pod-1"),
    ]
    assert {r["hostname"] for r in rows} == {"node-0"} and all(r["uuid"] for r in rows)
    xid = [r for r in signal_rows(rows, "xid") if r["gpu"] == 1]
    assert xid[0]["value"] == 79.0 and json.loads(xid[0]["labels_json"])["err_code"] == "79"


def test_dcgm_blank_sentinels_are_dropped_and_counted() -> None:
    canonicalizer = TargetCanonicalizer("10.0.0.9:9400")
    batch = canonicalizer.canonicalize(
        ExpositionParser().parse(dcgm_exposition(gpus=2, blank_memory_temp=True)), 1
    )
    assert batch.dropped == {"blank_sentinel": 2}
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in batch.table.column("metric").to_pylist()


def test_unknown_metrics_are_kept_raw_and_created_series_are_not_gauges() -> None:
    rows = rows_of(vllm_exposition() + "# TYPE my_custom_thing gauge\nmy_custom_thing 3\n")
    custom = [r for r in rows if r["metric"] == "my_custom_thing"]
    assert custom == [dict(custom[0], signal=None, kind="gauge", value=3.0)]
    created = [r for r in rows if r["metric"].endswith("_created")]
    assert created and {(r["kind"], r["signal"]) for r in created} == {("created", None)}


def test_counter_resets_by_value_drop_created_and_process_start() -> None:
    canonicalizer, parser = TargetCanonicalizer("x:1"), ExpositionParser()

    def scrape(tokens: float, created: float, start: float, ts: int) -> dict[str, int]:
        text = (
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}\n'
            "# TYPE vllm:generation_tokens_created gauge\n"
            f'vllm:generation_tokens_created{{engine="0",model_name="m"}} {created}\n'
            f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {start}\n"
        )
        return canonicalizer.canonicalize(parser.parse(text), ts).resets

    assert scrape(100, 1.0, 1.0, 1) == {}
    assert scrape(200, 1.0, 1.0, 2) == {}
    assert scrape(50, 1.0, 1.0, 3) == {"value_drop": 1}
    assert scrape(900, 2.0, 2.0, 4) == {"created": 1, "process_start": 1}
    batch = canonicalizer.canonicalize(
        parser.parse(
            "# TYPE vllm:generation_tokens_total counter\n"
            'vllm:generation_tokens_total{engine="0",model_name="m"} 1\n'
        ),
        5,
    )
    reset_rows = [r for r in batch.table.to_pylist() if r["signal"] == "counter_reset"]
    assert [(json.loads(r["labels_json"])["reason"], r["value"]) for r in reset_rows] == [
        ("value_drop", 1.0)
    ]


def test_sglang_frozen_gauges_report_how_long_they_have_been_unchanged() -> None:
    canonicalizer, parser = TargetCanonicalizer("x:1"), ExpositionParser()
    frozen = sglang_exposition(seed=1)

    def unchanged(text: str, ts_ms: int) -> float:
        rows = canonicalizer.canonicalize(parser.parse(text), ts_ms).table.to_pylist()
        return signal_rows(rows, "gauges_unchanged_s")[0]["value"]

    assert unchanged(frozen, 0) == 0.0
    assert unchanged(frozen, 5000) == 5.0
    assert unchanged(frozen, 65000) == 65.0
    assert unchanged(sglang_exposition(seed=2), 70000) == 0.0


def test_frozen_gauges_are_tracked_per_dp_rank() -> None:
    canonicalizer, parser = TargetCanonicalizer("x:1"), ExpositionParser()
    text = sglang_exposition(dp_ranks=2, seed=1)
    canonicalizer.canonicalize(parser.parse(text), 0)
    changed = text.replace(
        'sglang:num_running_reqs{dp_rank="1"', 'sglang:num_running_reqs{dp_rank="1"', 1
    )
    lines = changed.splitlines()
    rank1 = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("sglang:num_running_reqs{") and 'dp_rank="1"' in line
    )
    lines[rank1] = lines[rank1].rsplit(" ", 1)[0] + " 999.0"
    rows = canonicalizer.canonicalize(
        parser.parse("\n".join(lines) + "\n"), 10_000
    ).table.to_pylist()
    unchanged = {r["engine"]: r["value"] for r in signal_rows(rows, "gauges_unchanged_s")}
    assert unchanged == {"0": 10.0, "1": 0.0}
    assert {r["model"] for r in signal_rows(rows, "gauges_unchanged_s")} == {"llama-3-8b"}


def test_openmetrics_counter_created_samples_are_created_not_counters() -> None:
    text = (
        "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 5.0\n'
        'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9\n'
        "# EOF\n"
    )
    rows = rows_of(text)
    assert [(r["metric"], r["kind"], r["signal"]) for r in rows] == [
        ("vllm:generation_tokens_total", "counter", "generation_tokens"),
        ("vllm:generation_tokens_created", "created", None),
    ]


def test_llamacpp_process_start_header_marks_a_restart() -> None:
    canonicalizer, parser = TargetCanonicalizer("x:1", model="tiny"), ExpositionParser()
    text = llamacpp_exposition()
    assert canonicalizer.canonicalize(parser.parse(text), 1, process_start_s=100.0).resets == {}
    assert canonicalizer.canonicalize(parser.parse(text), 2, process_start_s=100.0).resets == {}
    batch = canonicalizer.canonicalize(parser.parse(text), 3, process_start_s=250.0)
    assert batch.resets == {"process_start": 1}
    rows = batch.table.to_pylist()
    assert {r["model"] for r in rows if r["signal"] == "running"} == {"tiny"}
    assert [r["labels_json"] for r in rows if r["signal"] == "counter_reset"] == [
        '{"reason": "process_start"}'
    ]


def test_epp_rows_are_the_gateway_component_with_model_and_error_code() -> None:
    rows = rows_of(epp_exposition(), canonicalizer=TargetCanonicalizer("gw:9090", pool="pool-a"))
    (errors,) = signal_rows(rows, "gateway_request_errors")
    assert (errors["instance"], errors["model"], errors["pool"]) == (
        "gw:9090",
        "llama-3-8b",
        "pool-a",
    )
    assert json.loads(errors["labels_json"])["error_code"] == "ServiceUnavailable"
    (ready,) = signal_rows(rows, "pool_ready_pods")
    assert ready["value"] == 4 and ready["pool"] == "pool-a"
