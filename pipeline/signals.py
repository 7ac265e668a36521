"""The canonical signal vocabulary: the values of the ``signal`` column.

Collectors map each engine dialect's metric names onto these (``vllm:kv_cache_usage_perc``
and SGLang's ``sglang:token_usage`` both become ``kv_usage``); the SLO engine reads only
these names, never a dialect's. This is data, not code: adding a signal is adding a row.

Identity rules shared by every producer:

* ``instance`` is the engine endpoint's ``host:port`` — the same string the collector
  scrapes and the tap forwards to — so engine samples and request records join on it;
* ``pool`` is the serving pool, by default the served model name.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENGINE_SIGNALS", "GPU_SIGNALS", "Signal"]


@dataclass(frozen=True)
class Signal:
    """One canonical signal: how it is typed and what it means (with units)."""

    name: str
    kind: str  # gauge | counter | histogram | info
    doc: str


def _table(*rows: tuple[str, str, str]) -> dict[str, Signal]:
    return {name: Signal(name, kind, doc) for name, kind, doc in rows}


#: Signals found on the ``engine`` topic (engine exporters and the tap's own gauges).
ENGINE_SIGNALS: dict[str, Signal] = _table(
    ("running", "gauge", "requests in the running batch"),
    ("waiting", "gauge", "requests waiting for admission"),
    ("kv_usage", "gauge", "fraction 0–1 of KV cache in use (never summed across engines)"),
    ("kv_free_blocks", "gauge", "free KV blocks, where the engine reports blocks"),
    ("kv_largest_free_run", "gauge", "largest run of contiguous free KV blocks, where reported"),
    ("kv_total_blocks", "gauge", "KV blocks in the pool (num_gpu_blocks)"),
    ("preemptions", "counter", "preemptions / retractions, cumulative"),
    ("prompt_tokens", "counter", "prompt tokens processed, cumulative"),
    (
        "generation_tokens",
        "counter",
        "tokens generated, cumulative (stall: flat while running > 0)",
    ),
    (
        "requests_finished",
        "counter",
        "finished requests; label finished_reason (stop, length, abort, error)",
    ),
    ("requests_aborted", "counter", "requests aborted by the engine (client gone), cumulative"),
    ("corrupted_requests", "counter", "requests with NaN / corrupted output, cumulative"),
    ("admission_rejections", "counter", "requests rejected by engine queue limits, cumulative"),
    (
        "prefix_cache_queries",
        "counter",
        "prompt tokens looked up in the prefix cache, cumulative (vLLM 0.8 V1: blocks; "
        "the hit ratio rate(hits)/rate(queries) is unit-free)",
    ),
    ("prefix_cache_hits", "counter", "prompt tokens found in the prefix cache, cumulative"),
    (
        "prefix_cache_hit_rate",
        "gauge",
        "fraction 0–1 of prompt tokens served from the prefix cache, as the engine reports it "
        "(vLLM V0 gpu_prefix_cache_hit_rate, SGLang cache_hit_rate)",
    ),
    (
        "router_prefix_lookups",
        "counter",
        "router: requests routed by prefix locality (a KV-index lookup each), cumulative",
    ),
    (
        "router_hints_rejected",
        "counter",
        "router: locality hints the engine could not use (the hinted pod did not hold the "
        "prefix's KV), cumulative",
    ),
    (
        "kv_transfer_time",
        "histogram",
        "P/D: KV transfer time prefill → decode, seconds (vLLM nixl_xfer_time_seconds, "
        "SGLang kv_transfer_latency_ms × 0.001)",
    ),
    ("kv_transfer_failures", "counter", "P/D: KV transfers that failed or timed out, cumulative"),
    (
        "kv_transfer_expired",
        "counter",
        "P/D: requests whose transferred-or-pending KV expired and was freed by the producer "
        "(the cleanup of an abandoned transfer), cumulative",
    ),
    (
        "kv_transfer_queue",
        "gauge",
        "P/D: requests waiting on a KV transfer at the decode side",
    ),
    (
        "kv_transfer_leaked_blocks",
        "gauge",
        "P/D: KV blocks of failed transfers never cleaned up (the simulator's; no engine "
        "exports it)",
    ),
    ("replicas_desired", "gauge", "autoscaler: replicas the HPA wants (kube-state-metrics)"),
    ("replicas_current", "gauge", "autoscaler: replicas the HPA has created"),
    ("replicas_ready", "gauge", "autoscaler: replicas of the deployment that are ready"),
    ("replicas_max", "gauge", "autoscaler: the HPA's maxReplicas"),
    ("replicas_spec", "gauge", "autoscaler: replicas the deployment's spec asks for"),
    (
        "autoscaler_target",
        "info",
        "autoscaler: 1 per HPA, naming what it scales (labels namespace, "
        "horizontalpodautoscaler, scaletargetref_kind, scaletargetref_name)",
    ),
    ("ttft", "histogram", "time to first token, seconds (bucket / sum / count samples)"),
    ("itl", "histogram", "inter-token latency per engine step, seconds"),
    ("tpot", "histogram", "per-request time per output token, seconds"),
    ("e2e", "histogram", "end-to-end request latency, seconds"),
    ("queue_time", "histogram", "time waiting before first scheduled, seconds"),
    ("ready", "gauge", "1 when the engine reports ready / healthy, else 0"),
    (
        "engine_awake",
        "gauge",
        "1 while the engine is awake, 0 while sleep mode has offloaded or discarded its weights "
        '(vLLM engine_sleep_state{sleep_state="awake"}): an asleep engine schedules nothing',
    ),
    ("process_start_time", "gauge", "Unix seconds the engine process started (restart marker)"),
    ("tap_in_flight", "gauge", "tap: streams open to this upstream instance right now"),
    (
        "tap_disconnects",
        "counter",
        "tap: client disconnects on streams to this instance, cumulative",
    ),
    (
        "tap_uncertain_requests",
        "counter",
        "tap: attempts on this instance whose ITL gap error bound exceeded the tap's "
        "gap_error_max_s (itl_uncertain), cumulative",
    ),
    ("tap_loop_lag", "gauge", "tap: its event loop's largest lateness since the last sample, s"),
    ("tap_gc_pause", "counter", "tap: its interpreter's garbage-collection pauses, seconds"),
    ("tap_cpu_throttled", "counter", "tap: its cgroup's CPU throttling (throttled_usec), s"),
    (
        "counter_reset",
        "gauge",
        "collector: series of this instance whose cumulative counters reset in this "
        "scrape (label reason: value_drop, created, process_start)",
    ),
    (
        "gateway_requests",
        "counter",
        "gateway router (EPP): requests scheduled, cumulative; label model_name",
    ),
    (
        "gateway_request_errors",
        "counter",
        "gateway router (EPP): requests refused, cumulative; label error_code "
        "(ServiceUnavailable: no eligible endpoint; ResourceExhausted, before llm-d-router "
        "InferencePoolResourceExhausted: shed, 429)",
    ),
    (
        "gateway_slo_violations",
        "counter",
        "gateway router (EPP): requests that missed their own SLO target "
        "(x-llm-d-slo-ttft-ms / -tpot-ms) as the router judged them, cumulative; label type "
        "(ttft, tpot). The tap's per-request view is the requests' slo_met column",
    ),
    ("gateway_running", "gauge", "gateway router (EPP): requests forwarded, not finished"),
    ("pool_ready_pods", "gauge", "gateway router (EPP): ready endpoints of the pool"),
    ("gateway_queue", "gauge", "gateway: requests held in its admission / flow-control queue"),
    ("router_up", "gauge", "gateway: 1 while its router (EPP) answers, else 0"),
    (
        "gateway_answers",
        "counter",
        "gateway: answers by HTTP code and reason (upstream, queue_full, router_unavailable, "
        "no_eligible_endpoint, upstream_error), cumulative",
    ),
    (
        "gateway_decisions",
        "counter",
        "gateway: endpoints picked by mode (round_robin, …, fail_open while the router is "
        "down), cumulative",
    ),
    (
        "gauges_unchanged_s",
        "gauge",
        "collector: seconds the engine's scheduler gauges have been bit-identical "
        "(SGLang freezes them when its scheduler hangs)",
    ),
)

#: Signals found on the ``gpu`` topic (dcgm-exporter).
GPU_SIGNALS: dict[str, Signal] = _table(
    ("gpu_util", "gauge", "DCGM_FI_DEV_GPU_UTIL, percent 0–100"),
    ("engine_active", "gauge", "DCGM_FI_PROF_GR_ENGINE_ACTIVE, fraction 0–1"),
    ("fb_used_mib", "gauge", "frame buffer used, MiB"),
    ("fb_free_mib", "gauge", "frame buffer free, MiB"),
    ("xid", "gauge", "last XID error code (DCGM_FI_DEV_XID_ERRORS); labels err_code, err_msg"),
    ("temperature_c", "gauge", "GPU temperature, °C"),
    ("power_w", "gauge", "power draw, W"),
    ("sm_clock_mhz", "gauge", "SM clock, MHz"),
    ("mem_copy_util", "gauge", "memory copy utilisation, percent"),
    ("ecc_dbe", "counter", "double-bit ECC errors, cumulative"),
    ("nvlink_errors", "counter", "NVLink CRC / recovery errors, cumulative"),
)
