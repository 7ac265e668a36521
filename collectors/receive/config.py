"""The ``receive`` section: where ``llmslo receive`` listens, who may write, and its bounds."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from pipeline.config import STRICT, FreePortOr

__all__ = ["ReceiveConfig", "ReceiveLimits"]


class ReceiveLimits(BaseModel):
    """What one write request may hold; past a bound it (or the series) is refused and counted."""

    model_config = STRICT

    max_body_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="compressed body on the wire (413 past it)"
    )
    max_decompressed_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="snappy length header checked before decompressing (413 past it)",
    )
    max_json_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="an OTLP JSON body, decompressed (413 past it): parsed JSON takes ~10x "
        "its size in memory, protobuf ~2x",
    )
    max_series_per_request: int = Field(
        200_000, gt=0, description="time series in one request (413 past it)"
    )
    max_labels_per_series: int = Field(64, gt=0, description="series with more are refused")
    max_label_value_bytes: int = Field(
        2048, gt=0, description="series with a longer label name or value are refused"
    )
    max_cached_label_sets: int = Field(
        100_000,
        gt=0,
        description="remote-write label sets kept parsed (least recently used evicted first); "
        "each holds at most 1 KiB of labels",
    )
    max_tracked_series: int = Field(
        2_000_000, gt=0, description="series whose last timestamp is kept for deduplication"
    )


class ReceiveConfig(BaseModel):
    """How ``llmslo receive`` accepts Prometheus remote-write and OTLP/HTTP metrics."""

    model_config = STRICT

    enabled: bool = Field(
        False, description="serve the receiver inside `llmslo run` (`llmslo receive` always does)"
    )
    host: str = Field("127.0.0.1", description="listen address")
    port: FreePortOr = Field(9201, description="listen port (0 = any free port)")
    bearer_token: str | None = Field(
        None, description="required `Authorization: Bearer` token (prefer bearer_token_file)"
    )
    bearer_token_file: str | None = Field(None, description="file holding the token")
    limits: ReceiveLimits = Field(default_factory=ReceiveLimits)
    buffer_max_rows: int = Field(
        2_000_000,
        gt=0,
        description="rows held for Kafka; a write that does not fit is answered 503 (retried)",
    )
    publish_timeout_s: float = Field(10.0, gt=0, description="delivery timeout of one batch")
    publish_gather_s: float = Field(
        0.05,
        ge=0,
        le=5,
        description="a delivery to Kafka waits up to this long for more writes to travel "
        "with it: fewer, larger messages, less CPU per sample (0: send at once)",
    )
    retry_after_s: int = Field(5, ge=1, description="Retry-After of a 503 (the bus is full)")

    @model_validator(mode="after")
    def _one_token_source(self) -> ReceiveConfig:
        if self.bearer_token and self.bearer_token_file:
            raise ValueError("set bearer_token or bearer_token_file, not both")
        return self

    def token(self) -> str | None:
        """The bearer token writers must send, or ``None`` (no authentication)."""
        if self.bearer_token_file:
            return Path(self.bearer_token_file).read_text().strip()
        return self.bearer_token
