"""The declared Arrow schemas of :mod:`slo.queries`' answers (exported from there).

Times are Unix epoch ms (``*_ts_ms``), latencies seconds (``*_s``); an empty answer has
the same columns.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "ALERTS_SCHEMA",
    "ALERT_SPANS_SCHEMA",
    "BUDGET_SCHEMA",
    "DRILLS_SCHEMA",
    "ENGINE_SERIES_SCHEMA",
    "FINDINGS_SCHEMA",
    "FLAGS_SCHEMA",
    "GHOSTS_SCHEMA",
    "GPU_SERIES_SCHEMA",
    "LATENCY_SCHEMA",
    "OUTCOMES_SCHEMA",
    "SLO_SERIES_SCHEMA",
    "STATUS_SCHEMA",
]

_S, _I64, _F64 = pa.string(), pa.int64(), pa.float64()
STATUS_SCHEMA = pa.schema(
    [
        ("slo_id", _S), ("group_json", _S), ("ts_ms", _I64), ("name", _S), ("objective", _F64),
        ("sli", _F64), ("events", _I64), ("bad", _I64), ("budget_remaining", _F64),
        ("burn_rates_json", _S), ("alerting", pa.bool_()), ("status_json", _S),
    ]
)  # fmt: skip
BUDGET_SCHEMA = pa.schema(
    [
        ("bucket_ts_ms", _I64), ("total", _I64), ("bad", _I64), ("error_ratio", _F64),
        ("burn_rate", _F64), ("budget_remaining", _F64),
    ]
)  # fmt: skip
SLO_SERIES_SCHEMA = pa.schema(
    [
        ("slo_id", _S), ("pool", _S), ("instance", _S), ("tenant", _S), ("route", _S),
        ("bucket_ts_ms", _I64), ("total", _I64), ("bad", _I64),
    ]
)  # fmt: skip
#: Each alert pair's burns at a span's last bucket (``slo_alert_spans``).
_BURN = pa.struct(
    [
        ("pair", _S), ("severity", _S), ("factor", _F64), ("long_burn", _F64),
        ("short_burn", _F64),
    ]
)  # fmt: skip
ALERT_SPANS_SCHEMA = pa.schema(
    [
        ("slo_id", _S), ("group_json", _S), ("start_ms", _I64), ("end_ms", _I64),
        ("state", _S), ("burns", pa.list_(_BURN)), ("folded", _I64),
    ]
)  # fmt: skip
FINDINGS_SCHEMA = pa.schema(
    [
        ("ts_ms", _I64), ("state", _S), ("signal", _S), ("scope", _S), ("scope_id", _S),
        ("pool", _S), ("severity", _S), ("basis", _S), ("evidence_json", _S),
    ]
)  # fmt: skip
FLAGS_SCHEMA = pa.schema(
    [
        ("ts_ms", _I64), ("scope", _S), ("scope_id", _S), ("pool", _S), ("from_level", pa.int8()),
        ("to_level", pa.int8()), ("reason", _S), ("evidence_json", _S),
    ]
)  # fmt: skip
LATENCY_SCHEMA = pa.schema(
    [
        ("bucket_ts_ms", _I64), ("pool", _S), ("instance", _S), ("samples", _I64),
        ("mean_s", _F64), ("p50_s", _F64), ("p90_s", _F64), ("p99_s", _F64), ("max_s", _F64),
    ]
)  # fmt: skip
OUTCOMES_SCHEMA = pa.schema(
    [
        ("bucket_ts_ms", _I64), ("pool", _S), ("instance", _S), ("outcome", _S),
        ("attempts", _I64), ("requests", _I64),
    ]
)  # fmt: skip
GHOSTS_SCHEMA = pa.schema(
    [
        ("bucket_ts_ms", _I64), ("instance", _S), ("pool", _S), ("disconnects", _I64),
        ("ghosts", _I64), ("tokens_after_disconnect", _I64),
    ]
)  # fmt: skip
ENGINE_SERIES_SCHEMA = pa.schema(
    [
        ("bucket_ts_ms", _I64), ("instance", _S), ("pool", _S), ("engine", _S), ("signal", _S),
        ("labels_json", _S), ("kind", _S), ("value", _F64), ("value_max", _F64),
    ]
)  # fmt: skip
#: ``instance``/``pool``: the engine the GPU serves (dcgm ``pod`` label; null when no pod
#: holds the GPU); ``exporter``/``address``: the dcgm-exporter that reported it.
GPU_SERIES_SCHEMA = pa.schema(
    [
        ("bucket_ts_ms", _I64), ("instance", _S), ("pool", _S), ("exporter", _S),
        ("address", _S), ("hostname", _S), ("gpu", pa.int32()), ("uuid", _S), ("signal", _S),
        ("value", _F64), ("value_max", _F64),
    ]
)  # fmt: skip
ALERTS_SCHEMA = pa.schema(
    [
        ("ts_ms", _I64),
        ("fingerprint", _S),
        ("alertname", _S),
        ("state", _S),
        ("severity", _S),
        ("labels_json", _S),
        ("annotations_json", _S),
        ("starts_ts_ms", _I64),
        ("ends_ts_ms", _I64),
        ("generator_url", _S),
    ]
)


DRILLS_SCHEMA = pa.schema(
    [
        ("run_ts_ms", _I64), ("mode", _S), ("fleet", _S), ("instance", _S), ("fault", _S),
        ("injected_ts_ms", _I64), ("removed_ts_ms", _I64), ("detected", pa.bool_()),
        ("detected_by", _S), ("detect_s", _F64), ("first_finding_s", _F64),
        ("first_flag_s", _F64), ("first_alert_s", _F64), ("clear_s", _F64),
        ("other_signals", _S), ("false_positives", pa.int32()), ("profile_json", _S),
    ]
)  # fmt: skip
