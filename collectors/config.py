"""The ``collect`` section of the llmslo config file (validated once, here).

Example (``config/collectors.example.yaml``)::

    collect:
      interval_s: 5
      timeout_s: 3
      targets:
        - url: http://10.0.0.7:8000/metrics
          dialect: auto          # or vllm, vllm-legacy, sglang, trtllm, llamacpp, dcgm
          pool: llama-3-8b       # default: the model label of each series
        - url: 10.0.0.9:9400     # http:// and /metrics are implied
      file_sd: [var/targets/*.json]   # Prometheus file_sd format, reloaded on change
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["CollectConfig", "TargetConfig", "normalise_url"]

DialectChoice = Literal["auto", "vllm", "vllm-legacy", "sglang", "trtllm", "llamacpp", "dcgm"]


def normalise_url(url: str, metrics_path: str = "/metrics", scheme: str = "http") -> str:
    """``host:port`` → ``http://host:port/metrics``; full URLs are kept (path defaults too)."""
    text = url.strip()
    if "://" not in text:
        text = f"{scheme}://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL or host:port: {url!r}")
    path = parts.path or metrics_path
    query = f"?{parts.query}" if parts.query else ""
    return f"{parts.scheme}://{parts.netloc}{path}{query}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetConfig(_Model):
    """One scrape target. ``instance`` (the join key) is the URL's ``host:port``."""

    url: str = Field(description="http(s) URL of /metrics, or host:port")
    dialect: DialectChoice = "auto"
    pool: str | None = Field(
        default=None, description="serving pool; default the series' model label"
    )
    model: str | None = Field(
        default=None, description="model when the exporter has no model label (llama.cpp)"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return normalise_url(value)

    @property
    def instance(self) -> str:
        return urlsplit(self.url).netloc


class CollectConfig(_Model):
    """How ``llmslo collect`` scrapes and publishes."""

    targets: list[TargetConfig] = Field(default_factory=list)
    file_sd: list[str] = Field(
        default_factory=list, description="file_sd JSON/YAML files (globs allowed)"
    )
    file_sd_refresh_s: float = Field(
        5.0, gt=0, description="how often to check file_sd files for changes"
    )
    interval_s: float = Field(default=5.0, gt=0, description="time between scrape rounds")
    jitter_s: float = Field(
        0.25, ge=0, description="each target starts up to this much after the round"
    )
    timeout_s: float = Field(
        default=3.0,
        gt=0,
        description="deadline of one whole scrape (connect, headers, every piece of the body)",
    )
    concurrency: int = Field(default=64, ge=1, le=10_000, description="scrapes in flight at once")
    readiness_interval_s: float = Field(
        default=15.0,
        ge=0,
        description="probe each engine's /health and /v1/models this often (0 = never); "
        "the outcome goes to the target_health topic with every scrape's",
    )
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="larger bodies are errors; bounds the decoded (gunzipped) size too",
    )
    buffer_max_rows: int = Field(
        5_000_000, gt=0, description="rows held while Kafka is unreachable"
    )
    publish_timeout_s: float = Field(
        10.0, gt=0, description="delivery timeout of one batch before retrying"
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics here (0 = any)"
    )
    metrics_host: str = "127.0.0.1"

    @property
    def file_sd_paths(self) -> list[Path]:
        return [Path(p) for p in self.file_sd]
