"""The P/D, autoscaler and router names real components use map onto canonical signals:
vLLM's NIXL connector and SGLang's PD families, kube-state-metrics' HPA and deployment
series, the simulator gateway's queue and locality counters."""

from __future__ import annotations

import pytest

from collectors.canonical import TargetCanonicalizer
from collectors.config import TargetConfig
from collectors.dialects import DIALECT_NAMES
from collectors.exposition import ExpositionParser
from tests.collectors.test_canonical import rows_of

NIXL = (
    "# TYPE vllm:nixl_xfer_time_seconds histogram\n"
    'vllm:nixl_xfer_time_seconds_bucket{model_name="m",engine="0",le="0.005"} 8.0\n'
    'vllm:nixl_xfer_time_seconds_bucket{model_name="m",engine="0",le="2.0"} 10.0\n'
    'vllm:nixl_xfer_time_seconds_bucket{model_name="m",engine="0",le="+Inf"} 10.0\n'
    'vllm:nixl_xfer_time_seconds_count{model_name="m",engine="0"} 10.0\n'
    'vllm:nixl_xfer_time_seconds_sum{model_name="m",engine="0"} 4.02\n'
    "# TYPE vllm:nixl_num_failed_transfers_total counter\n"
    'vllm:nixl_num_failed_transfers_total{model_name="m",engine="0"} 2.0\n'
    "# TYPE vllm:nixl_num_kv_expired_reqs_total counter\n"
    'vllm:nixl_num_kv_expired_reqs_total{model_name="m",engine="0"} 1.0\n'
    "# TYPE llmslo_sim_pd_kv_transfer_leaked_blocks gauge\n"
    "llmslo_sim_pd_kv_transfer_leaked_blocks 7.0\n"
)
SGLANG_PD = (
    "# TYPE sglang:kv_transfer_latency_ms histogram\n"
    'sglang:kv_transfer_latency_ms_bucket{model_name="m",le="5.0"} 3.0\n'
    'sglang:kv_transfer_latency_ms_bucket{model_name="m",le="+Inf"} 4.0\n'
    'sglang:kv_transfer_latency_ms_count{model_name="m"} 4.0\n'
    'sglang:kv_transfer_latency_ms_sum{model_name="m"} 2010.0\n'
    "# TYPE sglang:num_transfer_failed_reqs_total counter\n"
    'sglang:num_transfer_failed_reqs_total{model_name="m"} 1.0\n'
    "# TYPE sglang:num_decode_transfer_queue_reqs gauge\n"
    'sglang:num_decode_transfer_queue_reqs{model_name="m"} 6.0\n'
    "# TYPE sglang:num_running_reqs gauge\n"
    'sglang:num_running_reqs{model_name="m"} 2.0\n'
)
KSM = (
    "# TYPE kube_horizontalpodautoscaler_status_desired_replicas gauge\n"
    'kube_horizontalpodautoscaler_status_desired_replicas{namespace="s",horizontalpodautoscaler="llm"} 3\n'
    "# TYPE kube_horizontalpodautoscaler_status_current_replicas gauge\n"
    'kube_horizontalpodautoscaler_status_current_replicas{namespace="s",horizontalpodautoscaler="llm"} 2\n'
    "# TYPE kube_deployment_status_replicas_ready gauge\n"
    'kube_deployment_status_replicas_ready{namespace="s",deployment="llm"} 1\n'
)
GATEWAY = (
    "# TYPE llmslo_sim_gateway_queue_depth gauge\n"
    "llmslo_sim_gateway_queue_depth 12.0\n"
    "# TYPE llmslo_sim_router_prefix_lookups_total counter\n"
    "llmslo_sim_router_prefix_lookups_total 40.0\n"
    "# TYPE llmslo_sim_router_prefix_hints_rejected_total counter\n"
    "llmslo_sim_router_prefix_hints_rejected_total 9.0\n"
)


def _signals(rows: list[dict[str, object]]) -> dict[tuple[str, object], float]:
    return {
        (str(r["signal"]), r["le"]): float(r["value"])  # type: ignore[arg-type]
        for r in rows
        if r["signal"] and r["kind"] in ("gauge", "counter", "bucket")
    }


@pytest.mark.parametrize(
    ("text", "dialect", "expected"),
    [
        (
            NIXL,
            "vllm",
            {
                ("kv_transfer_time", 0.005): 8.0,
                ("kv_transfer_time", 2.0): 10.0,
                ("kv_transfer_failures", None): 2.0,
                ("kv_transfer_expired", None): 1.0,
                ("kv_transfer_leaked_blocks", None): 7.0,
            },
        ),
        (
            SGLANG_PD,
            "sglang",
            {
                ("kv_transfer_time", 0.005): 3.0,  # ms bounds scaled to seconds
                ("kv_transfer_failures", None): 1.0,
                ("kv_transfer_queue", None): 6.0,
            },
        ),
        (
            KSM,
            "kube-state-metrics",
            {
                ("replicas_desired", None): 3.0,
                ("replicas_current", None): 2.0,
                ("replicas_ready", None): 1.0,
            },
        ),
        (
            GATEWAY,
            "epp",
            {
                ("gateway_queue", None): 12.0,
                ("router_prefix_lookups", None): 40.0,
                ("router_hints_rejected", None): 9.0,
            },
        ),
    ],
    ids=["vllm nixl connector", "sglang pd", "kube-state-metrics", "simulator gateway"],
)
def test_front_end_metrics_are_detected_and_become_signals(
    text: str, dialect: str, expected: dict[tuple[str, object], float]
) -> None:
    canonicalizer = TargetCanonicalizer("10.0.0.9:8000")
    signals = _signals(rows_of(text, canonicalizer=canonicalizer))
    assert canonicalizer.detection is not None and canonicalizer.detection.dialect == dialect
    for key, value in expected.items():
        assert signals[key] == value, key


def test_a_kube_state_metrics_target_can_be_pinned_to_its_dialect() -> None:
    assert TargetConfig(url="127.0.0.1:8080", dialect="kube-state-metrics").dialect == (
        "kube-state-metrics"
    )
    pinnable = set(TargetConfig.model_fields["dialect"].annotation.__args__)  # type: ignore[union-attr]
    assert set(DIALECT_NAMES) <= pinnable  # every dialect --dialect knows, targets[] knows too


def _cluster_objects(pod_created_s: float, restarts: float) -> str:
    return (
        KSM
        + "# TYPE kube_pod_created gauge\n"
        + f'kube_pod_created{{namespace="s",pod="llm-0"}} {pod_created_s}\n'
        + "# TYPE kube_pod_container_status_restarts_total counter\n"
        + 'kube_pod_container_status_restarts_total{namespace="s",pod="llm-0",container="vllm"} '
        + f"{restarts}\n"
    )


def test_a_kube_state_metrics_target_reports_no_reset_when_cluster_objects_are_recreated() -> None:
    """Its series describe the cluster's objects, not the exporter: a pod recreated under
    the same name (new ``kube_pod_created``, restarts counted from 0) is not a restart of
    kube-state-metrics, so no counter_reset rows (which would page ``crash`` on it)."""
    canonicalizer = TargetCanonicalizer("ksm:8080")
    rows_of(_cluster_objects(1_700_000_000, 4), canonicalizer=canonicalizer, ts_ms=1_000)
    parsed = ExpositionParser().parse(_cluster_objects(1_700_000_900, 0))
    batch = canonicalizer.canonicalize(parsed, 2_000)
    assert batch.resets == {}
    assert [r for r in batch.table.to_pylist() if r["signal"] == "counter_reset"] == []


def test_an_engine_whose_counter_drops_still_reports_a_reset() -> None:
    text = "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{}} {v}\n"
    canonicalizer = TargetCanonicalizer("pod-0:8000")
    rows_of(text.format(v=9), canonicalizer=canonicalizer, ts_ms=1_000)
    batch = canonicalizer.canonicalize(ExpositionParser().parse(text.format(v=1)), 2_000)
    assert batch.resets == {"value_drop": 1}
