"""Canonical, versioned record schemas: the contract between every producer and the store.

Each :class:`RecordSchema` names one kind of record, the Kafka topic it travels on, the
DuckDB table it lands in and its Arrow schema. Column documentation (with units) lives in
the Arrow field metadata, so ``docs/tables.md`` is generated from this module and cannot
drift from it.

Conventions: timestamps are ``*_ts_ms`` (int64, Unix epoch milliseconds, UTC); durations
are ``*_s`` (float64 seconds); token counts are plain integers. Free-form label sets are a
JSON object with sorted keys (``labels_json``), so identical label sets compare equal as
strings and compress well.

To change a schema, add a new version beside the old one (``version=2``) and keep decoding
the old one: producers and ingesters are upgraded independently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from pipeline._lazy import on_first_use
from pipeline.errors import UnknownSchemaError

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = on_first_use("pyarrow")  # a producer of JSON rows (the tap) never loads Arrow

__all__ = [
    "ALERTS",
    "ENGINE_SAMPLES",
    "FLAG_TRANSITIONS",
    "GPU_SAMPLES",
    "HEARTBEAT_STALE_INTERVALS",
    "JOBS_HEARTBEATS",
    "MAX_OWN_TARGET_S",
    "OUTCOMES",
    "REQUEST_RECORDS",
    "SCHEMAS",
    "TARGET_HEALTH",
    "VALUE_RULES",
    "RecordSchema",
    "ValueRule",
    "heartbeat_bound_s",
    "iter_schemas",
    "lookup_schema",
    "value_rules",
]

#: Every value the ``outcome`` column of a request record may take (DESIGN §3).
OUTCOMES = (
    "ok",
    "rejected",
    "error_before_first_token",
    "interrupted_after_first_token",
    "client_cancelled",
    "deadline_exceeded",
    "upstream_timeout",
)


def _dict_str() -> pa.DataType:
    """Dictionary-encoded strings: the type of every low-cardinality label column."""
    return pa.dictionary(pa.int32(), pa.string())


_INSTANCE_DOC = (
    "the name people use for the instance: its instance or pod label, else host:port "
    "(collectors.config.instance_name)"
)
_ADDRESS_DOC = "host:port the instance was reached at (scrape target or upstream); null in old rows"


def _field(name: str, type_: pa.DataType, doc: str, *, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


@dataclass(frozen=True)
class RecordSchema:
    """One versioned record kind.

    ``topic`` is the topic name without the configurable prefix (``engine`` becomes
    ``llmslo.engine``); ``key_field`` is the column whose value keys Kafka messages, so
    that all records of one instance land on one partition, in order.
    """

    name: str
    version: int
    topic: str
    table: str
    key_field: str
    #: Builds the Arrow schema (called once, on first use of :attr:`arrow`).
    build_arrow: Callable[[], pa.Schema] = field(repr=False, compare=False)
    doc: str
    retention: str
    #: For high-volume sample schemas: the columns that identify a time series. The store
    #: keeps each distinct series once and only (ts_ms, series_id, value) per sample.
    series_columns: tuple[str, ...] = ()

    @cached_property
    def arrow(self) -> pa.Schema:
        """The Arrow schema (column types, nullability, docs in the field metadata)."""
        return self.build_arrow()

    @property
    def header_value(self) -> bytes:
        """The ``llmslo-schema`` header: ``name.vVERSION``, e.g. ``engine_sample.v1``."""
        return f"{self.name}.v{self.version}".encode()

    @property
    def storage_arrow(self) -> pa.Schema:
        """The Arrow schema as stored: dictionary columns decoded to plain strings."""
        return pa.schema(
            [
                f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                for f in self.arrow
            ]
        )


ENGINE_SAMPLES = RecordSchema(
    name="engine_sample",
    version=1,
    topic="engine",
    table="engine_samples",
    key_field="instance",
    doc="One sample of an inference engine's /metrics scrape (or of the tap's own gauges), "
    "with its canonical signal when the dialect maps it.",
    retention="raw horizon (default 7 d); SLO rollups keep what long windows need",
    build_arrow=lambda: pa.schema(
        [
            _field("ts_ms", pa.int64(), "scrape time, Unix epoch ms", nullable=False),
            _field("instance", _dict_str(), _INSTANCE_DOC + ", e.g. vllm-0", nullable=False),
            _field("pool", _dict_str(), "serving pool the instance belongs to (often the model)"),
            _field(
                "dialect",
                _dict_str(),
                "the exporter's dialect (vllm, vllm-legacy, sglang, trtllm, llamacpp, epp, "
                "kube-state-metrics: collectors.dialects) or tap",
            ),
            _field("model", _dict_str(), "served model name (model_name label)"),
            _field("engine", _dict_str(), "engine core / DP rank within the instance, '' if none"),
            _field("metric", _dict_str(), "metric name exactly as exposed", nullable=False),
            _field(
                "signal",
                _dict_str(),
                "canonical signal (running, kv_usage, ttft, …), null if unknown",
            ),
            _field(
                "kind",
                _dict_str(),
                "gauge, counter, bucket, sum, count, info, untyped, created (a *_created restart marker)",
                nullable=False,
            ),
            _field(
                "le",
                pa.float64(),
                "histogram bucket upper bound, numeric (+inf allowed); null otherwise",
            ),
            _field("labels_json", _dict_str(), "remaining labels as a sorted-key JSON object"),
            _field(
                "value",
                pa.float64(),
                "sample value (counters cumulative as exposed)",
                nullable=False,
            ),
            # Appended after the first release (nullable; ALTER TABLE … ADD COLUMN on open).
            _field("address", _dict_str(), _ADDRESS_DOC),
        ]
    ),
    series_columns=(
        "instance",
        "pool",
        "dialect",
        "model",
        "engine",
        "metric",
        "signal",
        "kind",
        "le",
        "labels_json",
        "address",
    ),
)

GPU_SAMPLES = RecordSchema(
    name="gpu_sample",
    version=1,
    topic="gpu",
    table="gpu_samples",
    key_field="instance",
    doc="One sample of an NVIDIA dcgm-exporter scrape, labels lifted into columns.",
    retention="raw horizon (default 7 d)",
    build_arrow=lambda: pa.schema(
        [
            _field("ts_ms", pa.int64(), "scrape time, Unix epoch ms", nullable=False),
            _field(
                "instance", _dict_str(), "dcgm-exporter target: " + _INSTANCE_DOC, nullable=False
            ),
            _field("hostname", _dict_str(), "node name (Hostname / hostname label)"),
            _field("gpu", pa.int32(), "GPU index on the node (gpu label)"),
            _field("uuid", _dict_str(), "GPU UUID (UUID / uuid label)"),
            _field("device", _dict_str(), "device name, e.g. nvidia0"),
            _field("gpu_model", _dict_str(), "GPU product name (modelName label)"),
            _field(
                "gpu_instance_id", _dict_str(), "MIG GPU instance id (GPU_I_ID), null if not MIG"
            ),
            _field("pod", _dict_str(), "pod the GPU is allocated to, null when unallocated"),
            _field("namespace", _dict_str(), "namespace of that pod"),
            _field("container", _dict_str(), "container of that pod"),
            _field(
                "metric",
                _dict_str(),
                "DCGM field name as exposed, e.g. DCGM_FI_DEV_GPU_UTIL",
                nullable=False,
            ),
            _field(
                "signal",
                _dict_str(),
                "canonical signal (gpu_util, engine_active, fb_used_mib, xid, …)",
            ),
            _field(
                "labels_json",
                _dict_str(),
                "remaining labels (err_code, err_msg, …) as sorted-key JSON",
            ),
            _field(
                "value",
                pa.float64(),
                "sample value; DCGM blank sentinels are dropped, never stored",
                nullable=False,
            ),
            # Appended after the first release (nullable; ALTER TABLE … ADD COLUMN on open).
            _field("address", _dict_str(), _ADDRESS_DOC),
        ]
    ),
    series_columns=(
        "instance",
        "hostname",
        "gpu",
        "uuid",
        "device",
        "gpu_model",
        "gpu_instance_id",
        "pod",
        "namespace",
        "container",
        "metric",
        "signal",
        "labels_json",
        "address",
    ),
)

REQUEST_RECORDS = RecordSchema(
    name="request_record",
    version=1,
    topic="requests",
    table="requests",
    key_field="instance",
    doc="One attempt of one client request as seen by the stream tap (DESIGN §3). Never holds "
    "prompt or completion text.",
    retention="raw horizon (default 7 d); per-minute SLO rollups beyond",
    build_arrow=lambda: pa.schema(
        [
            _field(
                "request_id",
                pa.string(),
                "id of this attempt (x-request-id or generated)",
                nullable=False,
            ),
            _field(
                "original_request_id",
                pa.string(),
                "id of the first attempt; equals request_id when attempt = 1",
            ),
            _field(
                "attempt",
                pa.int16(),
                "1 for the first attempt, 2… for retries before the first token",
                nullable=False,
            ),
            _field("tap_id", _dict_str(), "the tap process that measured it"),
            _field(
                "instance",
                _dict_str(),
                "upstream engine instance that served the attempt: " + _INSTANCE_DOC,
                nullable=False,
            ),
            _field("pool", _dict_str(), "serving pool (often the model)"),
            _field("model", _dict_str(), "requested model"),
            _field("tenant", _dict_str(), "tenant from the configured header, null if absent"),
            _field("route", _dict_str(), "API route, e.g. /v1/chat/completions"),
            _field("streamed", pa.bool_(), "the client asked for an SSE stream"),
            _field(
                "received_ts_ms",
                pa.int64(),
                "t0: request received by the tap, Unix epoch ms",
                nullable=False,
            ),
            _field("deadline_ts_ms", pa.int64(), "client deadline, Unix epoch ms; null if none"),
            _field("http_status", pa.int16(), "status sent to the client; null if none was sent"),
            _field("outcome", _dict_str(), "one of: " + ", ".join(OUTCOMES), nullable=False),
            _field(
                "error_kind", _dict_str(), "short machine reason for a bad outcome, null when ok"
            ),
            _field(
                "finish_reason",
                _dict_str(),
                "finish_reason of the last choice (stop, length, abort, error…)",
            ),
            _field("ttfb_s", pa.float64(), "first chunk of any kind (role-only included) minus t0"),
            _field(
                "ttft_s",
                pa.float64(),
                "first chunk with content, reasoning or tool-call delta minus t0",
            ),
            _field(
                "tpot_s",
                pa.float64(),
                "(t_last_token − t_first_token)/(N − 1), N = completion_tokens; null if N ≤ 1",
            ),
            _field("e2e_s", pa.float64(), "last byte to the client minus t0"),
            _field("prompt_tokens", pa.int32(), "usage.prompt_tokens"),
            _field(
                "completion_tokens",
                pa.int32(),
                "usage.completion_tokens, or the tokens counted from the token-bearing chunks "
                "when the engine sent no usage (tokens_source says which)",
            ),
            _field("token_chunks", pa.int32(), "number of token-bearing chunks"),
            _field("itl_mean_s", pa.float64(), "mean ITL gap, exact over every gap"),
            _field("itl_p99_s", pa.float64(), "99th percentile ITL gap (nearest rank, exact)"),
            _field("itl_max_s", pa.float64(), "largest ITL gap"),
            _field(
                "itl_gaps_s",
                pa.list_(pa.float32()),
                "the first ITL gaps in order, at most tap.record_max_gaps (default 256) of "
                "itl_count",
            ),
            _field(
                "chunk_tokens",
                pa.list_(pa.int16()),
                "tokens carried by each of the first token-bearing chunks (spec decode > 1), "
                "one more than itl_gaps_s holds gaps",
            ),
            _field(
                "client_disconnected", pa.bool_(), "the client went away before the response ended"
            ),
            _field(
                "disconnect_ts_ms", pa.int64(), "when the client disconnect was seen, Unix epoch ms"
            ),
            _field(
                "upstream_closed_ts_ms",
                pa.int64(),
                "when the tap closed the upstream connection, Unix epoch ms",
            ),
            _field(
                "tokens_after_disconnect",
                pa.int32(),
                "drain mode: tokens the engine generated after the disconnect",
            ),
            # Added after the first release: appended, nullable, so files and producers of
            # the columns above stay positionally compatible (ALTER TABLE … ADD COLUMN).
            _field(
                "upstream_status",
                pa.int16(),
                "status the engine answered this attempt with (a retried one too); null if none",
            ),
            _field(
                "itl_count",
                pa.int32(),
                "number of gaps between consecutive token-bearing chunks (ITL gaps), all of them",
            ),
            _field("itl_p50_s", pa.float64(), "median ITL gap (nearest rank, exact)"),
            _field("itl_p90_s", pa.float64(), "90th percentile ITL gap (nearest rank, exact)"),
            _field(
                "itl_jitter_s",
                pa.float64(),
                "ITL jitter = p99 gap − median gap; null under 10 token-bearing chunks",
            ),
            _field(
                "itl_histogram",
                pa.list_(pa.int32()),
                "ITL gaps per log bucket, 32 counts: bucket k holds gaps ≤ 0.25 ms·√2^k "
                "(k = 0…30, up to 8.2 s) and above the previous bound; the last, larger gaps",
            ),
            _field("address", _dict_str(), _ADDRESS_DOC),
            _field(
                "revision",
                _dict_str(),
                "revision of the serving deployment, from the tap's config or its "
                "revision_header; null if neither (canary cohorts select by it)",
            ),
            _field(
                "cohort",
                _dict_str(),
                "cohort (e.g. canary, baseline), from the tap's config or its cohort_header; "
                "null if neither",
            ),
            _field(
                "tokens_source",
                _dict_str(),
                "where N of TPOT came from: usage (the engine's usage) or chunks (counted from "
                "token-bearing chunks, engine sent no usage); null without tokens",
            ),
            _field(
                "degradation_level",
                pa.int8(),
                "degradation level (0–3) the tap acted on for this request; null when the tap "
                "follows no flags or they were stale (fail open)",
            ),
            _field(
                "enforced_action",
                _dict_str(),
                "what the tap did: degradation_header, rejected_long_prompt, "
                "rejected_max_tokens, fallback_upstream, fail_open; null for nothing",
            ),
            _field(
                "source",
                _dict_str(),
                "who measured it: null = a stream tap, 'probe' = the synthetic prober (llmslo probe)",
            ),
            _field(
                "slo_ttft_s",
                pa.float64(),
                "the request's own TTFT target (router header x-llm-d-slo-ttft-ms), seconds; "
                "null if it carried none or an unusable one",
            ),
            _field(
                "slo_tpot_s",
                pa.float64(),
                "the request's own TPOT target (router header x-llm-d-slo-tpot-ms), seconds; "
                "null if none",
            ),
            _field(
                "slo_met",
                pa.bool_(),
                "the measured TTFT/TPOT are within the request's own targets (each judged where "
                "measured); null without targets or without a targeted measurement",
            ),
            _field(
                "itl_error_s",
                pa.float64(),
                "bound on how much earlier than timed the token-bearing chunks its ITL "
                "statistics hold reached the tap (the kernel receive stamp's, or the tap's "
                "event-loop lag without one; every chunk's when itl_uncertain): each of "
                "those gaps and statistics is within ± it, the jitter within ± twice it; "
                "null if unmeasured",
            ),
            _field(
                "itl_uncertain",
                pa.bool_(),
                "too few gaps were read within the tap's gap_error_max_s for a jitter (the "
                "ITL statistics then hold every gap as read): they say more about the tap "
                "than the engine, ITL SLIs do not count the request; null without gaps",
            ),
        ]
    ),
)

FLAG_TRANSITIONS = RecordSchema(
    name="flag_transition",
    version=1,
    topic="flags",
    table="flag_transitions",
    key_field="scope_id",
    doc="A change of degradation level (L0–L3) of a pool or an instance, with its evidence.",
    retention="forever (small)",
    build_arrow=lambda: pa.schema(
        [
            _field(
                "ts_ms", pa.int64(), "event time of the transition, Unix epoch ms", nullable=False
            ),
            _field("scope", _dict_str(), "pool or instance", nullable=False),
            _field(
                "scope_id", _dict_str(), "the pool name or the instance address", nullable=False
            ),
            _field("pool", _dict_str(), "pool of the scope"),
            _field("from_level", pa.int8(), "level before, 0–3; −1 = unknown", nullable=False),
            _field(
                "to_level",
                pa.int8(),
                "level after, 0–3; −1 = unknown (the instance is down or its data is stale)",
                nullable=False,
            ),
            _field(
                "kv_free_ratio", pa.float64(), "KV free ratio (1 − usage) that drove the change"
            ),
            _field("reason", _dict_str(), "why, e.g. kv_free_below_l2, dwell_elapsed, oom_risk"),
            _field("evidence_json", pa.string(), "supporting samples and thresholds as JSON"),
        ]
    ),
)

JOBS_HEARTBEATS = RecordSchema(
    name="jobs_heartbeat",
    version=1,
    topic="flags",
    table="jobs_heartbeats",
    key_field="jobs_id",
    doc="One cycle of the SLO jobs that computed the flags: published on the flags topic with "
    "the transitions, so that readers of the flags (the API, the taps) know how old they are "
    "and stop acting on them when the jobs stop.",
    retention="raw horizon (default 7 d)",
    build_arrow=lambda: pa.schema(
        [
            _field(
                "ts_ms",
                pa.int64(),
                "wall-clock time the cycle finished, Unix epoch ms: what staleness is measured "
                "from (event time stands still over a finished or idle store)",
                nullable=False,
            ),
            _field(
                "event_ts_ms",
                pa.int64(),
                "the cycle's event time (the newest data it judged), Unix epoch ms",
                nullable=False,
            ),
            _field(
                "jobs_id", _dict_str(), "the jobs process, host-pid (one row each)", nullable=False
            ),
            _field("interval_s", pa.float64(), "the jobs' configured interval, seconds"),
            _field("errors", pa.int32(), "steps of the cycle that failed (logged by the jobs)"),
        ]
    ),
)

#: A reader's staleness bound is never under this many jobs intervals (a heartbeat says its
#: interval), so a jobs config slower than the reader's ``staleness_s`` is not stale
#: between two of its own cycles.
HEARTBEAT_STALE_INTERVALS = 3.0


def heartbeat_bound_s(staleness_s: float, interval_s: float | None) -> float:
    """How old a jobs heartbeat may be before what it vouches for is stale, seconds."""
    return max(staleness_s, HEARTBEAT_STALE_INTERVALS * (interval_s or 0.0))


ALERTS = RecordSchema(
    name="alert",
    version=1,
    topic="alerts",
    table="alerts",
    key_field="fingerprint",
    doc="An alert state change the pipeline computed itself (and pushed to Alertmanager).",
    retention="forever (small)",
    build_arrow=lambda: pa.schema(
        [
            _field("ts_ms", pa.int64(), "evaluation time, Unix epoch ms", nullable=False),
            _field("fingerprint", pa.string(), "stable hash of the alert's labels", nullable=False),
            _field("alertname", _dict_str(), "alert name", nullable=False),
            _field("state", _dict_str(), "firing or resolved", nullable=False),
            _field("severity", _dict_str(), "page, ticket or info"),
            _field("labels_json", pa.string(), "all labels as sorted-key JSON"),
            _field(
                "annotations_json",
                pa.string(),
                "annotations (summary, description, runbook) as JSON",
            ),
            _field("starts_ts_ms", pa.int64(), "startsAt, Unix epoch ms"),
            _field("ends_ts_ms", pa.int64(), "endsAt, Unix epoch ms; null while firing"),
            _field("generator_url", pa.string(), "link back to the dashboard view"),
        ]
    ),
)

TARGET_HEALTH = RecordSchema(
    name="target_health",
    version=1,
    topic="health",
    table="target_health",
    key_field="instance",
    doc="The outcome of one scrape of one target (up or why not) and, at the slower probe "
    "interval, the engine's readiness (health endpoint or /v1/models).",
    retention="raw horizon (default 7 d)",
    build_arrow=lambda: pa.schema(
        [
            _field("ts_ms", pa.int64(), "scrape start, Unix epoch ms", nullable=False),
            _field("instance", _dict_str(), _INSTANCE_DOC, nullable=False),
            _field("target", _dict_str(), "scraped URL", nullable=False),
            _field("pool", _dict_str(), "configured pool of the target, null if none"),
            _field(
                "dialect", _dict_str(), "detected dialect (vllm, sglang, dcgm, …), null if unknown"
            ),
            _field("up", pa.bool_(), "the scrape returned a whole, parseable body", nullable=False),
            _field(
                "http_status", pa.int16(), "HTTP status of the scrape; null if none was received"
            ),
            _field("duration_s", pa.float64(), "time to fetch and parse, seconds"),
            _field(
                "error_kind",
                _dict_str(),
                "why the scrape failed: connect, timeout, http_status, truncated, oversized, "
                "encoding; null when up",
            ),
            _field("error", pa.string(), "the error message (≤ 200 characters); null when up"),
            _field(
                "process_start_s",
                pa.float64(),
                "engine process start, Unix seconds (process_start_time_seconds or the "
                "Process-Start-Time-Unix header); null if the engine does not say",
            ),
            _field(
                "counter_resets",
                pa.int32(),
                "counter resets detected in this scrape (value drops, *_created, process start)",
            ),
            _field(
                "ready",
                pa.bool_(),
                "readiness from the last probe: health endpoint 200, or a model listed in "
                "/v1/models, or the engine's ready gauge; null when not probed this time",
            ),
            _field(
                "ready_source",
                _dict_str(),
                "what readiness rests on: health, models, gauge; null when not probed",
            ),
            _field("ready_status", pa.int16(), "HTTP status of the readiness probe; null if none"),
            _field("models", pa.int32(), "models listed by /v1/models when probed; null otherwise"),
        ]
    ),
)

#: Every schema this build can decode, by (name, version).
SCHEMAS: dict[tuple[str, int], RecordSchema] = {
    (s.name, s.version): s
    for s in (
        ENGINE_SAMPLES,
        GPU_SAMPLES,
        REQUEST_RECORDS,
        FLAG_TRANSITIONS,
        JOBS_HEARTBEATS,
        ALERTS,
        TARGET_HEALTH,
    )
}


def iter_schemas() -> Iterator[RecordSchema]:
    """All known schemas in a stable order (the order tables are created and documented)."""
    return iter(SCHEMAS.values())


_VERSION = re.compile(r"[0-9]{1,6}")


def lookup_schema(header_value: bytes | str | None) -> RecordSchema:
    """Resolve an ``llmslo-schema`` header value such as ``b"engine_sample.v1"``.

    The version is 1 to 6 ASCII digits (``v¹``, ``v١`` or ``v`` + 5,000 nines are malformed,
    not a crash or a silent alias of ``v1``). Raises :class:`UnknownSchemaError` (reason
    ``unknown_schema``) for a missing, malformed or unknown name or version.
    """
    if header_value is None:
        raise UnknownSchemaError("unknown_schema", "message has no llmslo-schema header")
    text = (
        header_value.decode("utf-8", "replace") if isinstance(header_value, bytes) else header_value
    )
    name, sep, version = text.rpartition(".v")
    if not sep or _VERSION.fullmatch(version) is None:
        raise UnknownSchemaError("unknown_schema", f"malformed schema header {text[:80]!r}")
    schema = SCHEMAS.get((name, int(version)))
    if schema is None:
        raise UnknownSchemaError("unknown_schema", f"unknown schema {text[:80]!r}")
    return schema


# --- Value rules: what each column may hold, beyond its Arrow type -------------------------
#
# Checked at decode (pipeline.codec) for every message, ours and third parties' alike: a
# message holding one value outside its rule is dead-lettered whole (reason
# ``invalid_value``) and none of its rows are stored. The rules are data, one table per
# schema, so that a reader sees every constraint of a record kind in one place.

#: Event times are after the Unix epoch and before 2100-01-01 (a ms/µs/ns mix-up lands beyond).
MAX_TIMESTAMP_MS = 4_102_444_800_000
#: A request's own latency target (``slo_ttft_s``, ``slo_tpot_s``) is at most 10 minutes:
#: beyond it a value is a mistake, not an SLO (the tap ignores such a header value).
MAX_OWN_TARGET_S = 600.0


@dataclass(frozen=True)
class ValueRule:
    """What every non-null value of ``column`` must satisfy.

    ``minimum`` and ``maximum`` bound numbers, inclusive; list columns are checked element by
    element and NaN never satisfies a bound. ``allowed`` is the only strings the column may
    hold. Nulls are not judged here (required columns are checked for them separately).
    """

    column: str
    minimum: float | None = None
    maximum: float | None = None
    allowed: tuple[str, ...] | None = None

    def describe(self) -> str:
        """The rule in words, e.g. ``must be in [0, 86400]`` or ``must be one of ok, …``."""
        if self.allowed is not None:
            return "must be one of " + ", ".join(self.allowed)
        low = "-inf" if self.minimum is None else f"{self.minimum:g}"
        high = "inf" if self.maximum is None else f"{self.maximum:g}"
        return f"must be a number in [{low}, {high}]"


def _ranged(minimum: float, maximum: float | None, *columns: str) -> tuple[ValueRule, ...]:
    return tuple(ValueRule(column, minimum=minimum, maximum=maximum) for column in columns)


def _timestamps(*columns: str) -> tuple[ValueRule, ...]:
    return _ranged(0, MAX_TIMESTAMP_MS, *columns)


#: Every schema's value rules, by (name, version) like :data:`SCHEMAS`.
VALUE_RULES: dict[tuple[str, int], tuple[ValueRule, ...]] = {
    ("engine_sample", 1): (
        *_timestamps("ts_ms"),
        ValueRule(
            "kind",
            allowed=("gauge", "counter", "bucket", "sum", "count", "info", "untyped", "created"),
        ),
    ),
    ("gpu_sample", 1): (*_timestamps("ts_ms"), *_ranged(0, None, "gpu")),
    ("request_record", 1): (
        *_timestamps(
            "received_ts_ms", "deadline_ts_ms", "disconnect_ts_ms", "upstream_closed_ts_ms"
        ),
        ValueRule("outcome", allowed=OUTCOMES),
        *_ranged(1, None, "attempt"),
        *_ranged(100, 599, "http_status"),
        # Durations and counts: non-negative (NaN is never a duration). No upper bound: a
        # day-long stream is odd but real, and the SLO report only compares with thresholds.
        *_ranged(
            0,
            None,
            "ttfb_s",
            "ttft_s",
            "tpot_s",
            "e2e_s",
            "itl_mean_s",
            "itl_p99_s",
            "itl_max_s",
            "itl_gaps_s",
            "prompt_tokens",
            "completion_tokens",
            "token_chunks",
            "chunk_tokens",
            "tokens_after_disconnect",
            "itl_error_s",
        ),
        *_ranged(0, MAX_OWN_TARGET_S, "slo_ttft_s", "slo_tpot_s"),
    ),
    ("flag_transition", 1): (
        *_timestamps("ts_ms"),
        ValueRule("scope", allowed=("pool", "instance")),
        # −1 is the flag board's "unknown" (the instance is down or its data is stale)
        *_ranged(-1, 3, "from_level", "to_level"),
        *_ranged(0, 1, "kv_free_ratio"),
    ),
    ("jobs_heartbeat", 1): (
        *_timestamps("ts_ms", "event_ts_ms"),
        *_ranged(0, None, "interval_s", "errors"),
    ),
    ("alert", 1): (
        *_timestamps("ts_ms", "starts_ts_ms", "ends_ts_ms"),
        ValueRule("state", allowed=("firing", "resolved")),
        ValueRule("severity", allowed=("page", "ticket", "info")),
    ),
}


def value_rules(schema: RecordSchema) -> tuple[ValueRule, ...]:
    """The value rules of ``schema`` (empty for a schema that declares none)."""
    return VALUE_RULES.get((schema.name, schema.version), ())
