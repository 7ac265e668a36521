"""The ``tap`` section of the llmslo config file (validated once, here)."""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from collectors.config import check_label_value
from collectors.tap.degradation import DegradationConfig
from pipeline.config import STRICT, FreePortOr, check_url_port

__all__ = ["TapConfig"]


class TapConfig(BaseModel):
    """How the stream tap listens, forwards, measures, retries and reports.

    Durations are seconds (``*_s``), sizes bytes (``*_bytes``).
    """

    model_config = STRICT

    listen: str = Field(
        "127.0.0.1:8100", pattern=r"^[^:]+:\d{1,5}$", description="HOST:PORT to serve on"
    )
    upstreams: list[str] = Field(
        default_factory=list, description="engine base URLs, e.g. http://127.0.0.1:8000"
    )
    measured_routes: list[str] = ["/v1/chat/completions", "/v1/completions"]
    tap_id: str | None = Field(
        None, description="name of this tap in records (default: hostname:port)"
    )
    instance: str | None = Field(
        None,
        description="name of the engine this tap fronts (a sidecar's pod name, e.g. pod-3), "
        "used for its records, in-flight samples and metrics instead of its host:port; needs "
        "exactly one upstream. Name it as the engine's scrape target is named (its instance "
        "or pod label) so detectors can join the two",
    )
    revision: str | None = Field(
        None, description="revision stamped on every request record (e.g. a rollout hash)"
    )
    cohort: str | None = Field(
        None, description="cohort stamped on every request record (e.g. canary, baseline)"
    )
    revision_header: str | None = Field(
        None,
        description="request header whose value, when present and valid, is the record's "
        "revision instead of `revision`",
    )
    cohort_header: str | None = Field(
        None,
        description="request header (e.g. x-llmslo-cohort) whose value, when present and valid, "
        "is the record's cohort instead of `cohort`",
    )
    pool: str | None = Field(
        None,
        description="pool of every upstream's records; unset, a record's pool is its requested "
        "model when configured (`models`) or announced by the upstreams on /v1/models, else "
        "'other': a client cannot name a pool",
    )
    models: list[str] = Field(
        default_factory=list,
        description="model names always used as pools and metrics labels (besides those the "
        "upstreams announce on /v1/models); any other requested name is 'other'",
    )
    tenants: list[str] = Field(
        default_factory=list,
        description="tenant names recorded as sent in `tenant_header`; any other value is "
        "recorded as 'other' (empty: every tenant is 'other'), so a client cannot create an "
        "SLO group",
    )
    max_model_labels: int = Field(
        64, ge=1, le=10_000, description="distinct model label values at most (configured first)"
    )
    models_refresh_s: float = Field(
        60.0, gt=0, description="how often each upstream's /v1/models is read again"
    )
    tenant_header: str = "x-tenant-id"
    request_id_header: str = "x-request-id"
    deadline_header: str = Field(
        "x-request-deadline", description="absolute deadline, Unix s or ms"
    )
    timeout_header: str = Field(
        "x-request-timeout-ms", description="relative timeout, milliseconds"
    )
    slo_ttft_header: str = Field(
        "x-llm-d-slo-ttft-ms",
        description="the request's own TTFT target, milliseconds (llm-d's router sets it); "
        "recorded and judged per request, never a grouping key",
    )
    slo_tpot_header: str = Field(
        "x-llm-d-slo-tpot-ms", description="the request's own TPOT target, milliseconds"
    )
    default_timeout_s: float | None = Field(
        None, gt=0, description="deadline when the client sends none"
    )
    max_attempts: int = Field(
        2, ge=1, le=10, description="attempts per request, retries only before the first token"
    )
    retry_on_status: list[int] = Field(
        [408, 429, 500, 502, 503, 504],
        description="upstream statuses retried before the first token",
    )
    retry_budget_ratio: float = Field(
        0.2, ge=0, le=1, description="retries allowed per request, on average"
    )
    retry_budget_min_per_s: float = Field(
        5.0, ge=0, description="retries always allowed per second"
    )
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float = Field(
        60.0, gt=0, description="max upstream silence (first byte or between chunks)"
    )
    client_write_timeout_s: float = Field(
        30.0, gt=0, description="a client that reads nothing this long is gone"
    )
    client_idle_timeout_s: float = Field(
        75.0, gt=0, description="a client connection idle (or mid-request) this long is closed"
    )
    client_head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request head (request line and headers) must arrive whole within this "
        "from its first byte; bytes trickling in do not extend it (408 and close)",
    )
    client_body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="a request body must arrive whole within this from the end of its head "
        "(408 and close)",
    )
    first_token_timeout_s: float | None = Field(
        60.0,
        gt=0,
        description="a streamed attempt without a token-bearing chunk this long after it was "
        "sent is an upstream_timeout; SSE comments (keep-alives) and role-only chunks do not "
        "reset it (None = off)",
    )
    shutdown_grace_s: float = Field(
        25.0, ge=0, description="on stop, running requests get this long to finish"
    )
    max_request_bytes: int = Field(16 * 1024 * 1024, gt=0)
    max_event_bytes: int = Field(
        1024 * 1024, ge=1024, description="larger SSE events are forwarded unparsed"
    )
    hold_max_bytes: int = Field(
        64 * 1024, ge=0, description="bytes held before the first token so a retry stays invisible"
    )
    max_json_response_bytes: int = Field(
        4 * 1024 * 1024, ge=0, description="non-streamed bodies parsed up to this"
    )
    drain_max_s: float = Field(
        0.0, ge=0, description="drain mode: keep reading upstream after a disconnect (0 = off)"
    )
    drain_max_bytes: int = Field(1024 * 1024, ge=0)
    max_connections: int = Field(1024, ge=1, description="upstream connection pool size")
    upstream_keepalive_s: float = Field(
        4.0,
        gt=0,
        description="idle upstream connections are closed after this; keep it below the "
        "engine's own keep-alive timeout (uvicorn's default: 5 s)",
    )
    gauge_interval_s: float = Field(
        5.0, gt=0, description="how often in-flight/disconnect samples are published"
    )
    loop_watch_interval_s: float = Field(
        0.001,
        gt=0,
        le=0.1,
        description="the loop watch's tick: a healthy loop bounds a chunk's read delay by "
        "about this (collectors/tap/loopwatch.py)",
    )
    kernel_timestamps: bool = Field(
        True,
        description="time each engine chunk by the kernel's receive stamp (SO_TIMESTAMPNS) "
        "where the platform has it and the upstream is not TLS; else, or off, by when the "
        "loop read it, bounded by the loop watch (collectors/tap/rxstamp.py)",
    )
    gap_error_max_s: float = Field(
        0.005,
        gt=0,
        description="a request whose gap error bound (itl_error_s) exceeds this is "
        "itl_uncertain and not counted by ITL SLIs; keep it at most a sixth of the tightest "
        "ITL threshold (its jitter is then within a third of it)",
    )
    record_max_gaps: int = Field(
        256,
        ge=0,
        le=32767,
        description="raw ITL gaps kept in a record (the first ones); summaries and the "
        "histogram always cover every gap, so a record's size is bounded",
    )
    kafka: bool = Field(True, description="publish records and gauges to the bus")
    records_out: str | None = Field(
        None, description="also write records as JSON lines to FILE or '-'"
    )
    batch_max_rows: int = Field(2000, gt=0)
    flush_interval_s: float = Field(0.5, gt=0)
    max_pending_records: int = Field(
        100_000, gt=0, description="records buffered for the sink; beyond, dropped and counted"
    )
    metrics_host: str = "127.0.0.1"
    metrics_port: FreePortOr | None = Field(
        None, description="serve the tap's /metrics (0 = free port)"
    )
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP endpoint for GenAI metrics and spans"
    )
    degradation: DegradationConfig = Field(
        default_factory=lambda: DegradationConfig.model_validate({}),
        description="follow the flags topic and enforce L1–L3 (collectors.tap.degradation)",
    )

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} must start with http:// or https://")
            check_url_port(url)
        return [url.rstrip("/") for url in value]

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str]) -> list[str]:
        for name in value:
            if not 0 < len(name) <= 200 or name == "other":
                raise ValueError(f"model {name[:40]!r}: 1 to 200 characters, not 'other'")
        return value

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, value: list[str]) -> list[str]:
        for name in value:
            check_label_value("tenant", name)
            if name == "other":
                raise ValueError("tenant 'other' is the bucket of unlisted tenants")
        return value

    @field_validator("instance", "revision", "cohort", "pool")
    @classmethod
    def _names(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_label_value(str(info.field_name), value)

    @model_validator(mode="after")
    def _one_named_upstream(self) -> TapConfig:
        if self.instance is not None and len(self.upstreams) > 1:
            raise ValueError(
                f"instance {self.instance!r} names one engine but there are "
                f"{len(self.upstreams)} upstreams; run one tap per engine to name each"
            )
        return self

    @model_validator(mode="after")
    def _labels_fit(self) -> TapConfig:
        if len(set(self.models)) > self.max_model_labels:
            raise ValueError(
                f"models: {len(set(self.models))} names but max_model_labels is "
                f"{self.max_model_labels}"
            )
        return self

    @field_validator("listen")
    @classmethod
    def _listen_port(cls, value: str) -> str:
        if int(value.rpartition(":")[2]) > 65535:
            raise ValueError(f"{value!r}: port must be 0-65535 (0 = any free port)")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_port(cls, value: str | None) -> str | None:
        return None if value is None else check_url_port(value)

    @field_validator("retry_on_status")
    @classmethod
    def _statuses(cls, value: list[int]) -> list[int]:
        for status in value:
            if not 400 <= status <= 599:
                raise ValueError(f"retry status {status} is not an HTTP error status")
        return value
