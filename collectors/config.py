"""The ``collect`` section of the llmslo config file (validated once, here).

Example (``config/collectors.example.yaml``)::

    collect:
      interval_s: 5
      timeout_s: 3
      targets:
        - url: http://10.0.0.7:8000/metrics
          dialect: auto          # or a dialect of collectors/dialects/*.yaml: vllm, sglang, …
          pool: llama-3-8b       # default: the model label of each series
        - url: 10.0.0.9:9400     # http:// and /metrics are implied
          labels: {instance: gpu-node-3}
      file_sd: [var/targets/*.json]   # Prometheus file_sd format, reloaded on change

How an instance is named (one rule for scrape targets and taps, see :func:`instance_name`):
the ``instance`` label if given, else the ``pod`` label, else the target's ``host:port``.
The ``host:port`` stays in the ``address`` column of every record either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

from collectors.dialects import DialectName
from pipeline.config import STRICT, FreePortOr, check_url_port

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_TARGET_LABELS",
    "NAMING_LABELS",
    "CollectConfig",
    "DialectChoice",
    "TargetConfig",
    "check_label_value",
    "check_labels",
    "instance_name",
    "normalise_url",
]

#: Longest label value accepted (a Kubernetes object name is at most 253 characters).
MAX_LABEL_CHARS = 253
#: Most labels one target may carry (a hostile file_sd cannot grow a record without bound).
MAX_TARGET_LABELS = 32
#: Labels that name an instance, strongest first; see :func:`instance_name`.
NAMING_LABELS = ("instance", "pod")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: A target's ``dialect``: ``auto`` (detected per scrape) or one of the maps' dialects.
DialectChoice = Literal["auto", DialectName]


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


def check_label_value(name: str, value: object) -> str:
    """``value`` if it is a usable label value; raises ``ValueError`` naming ``name``.

    A value is a string of 1 to :data:`MAX_LABEL_CHARS` printable characters: it ends up
    in table cells, reports and alert labels, so control characters (a newline forging a
    report line, an escape sequence) and unbounded lengths are refused at the config.
    """
    if not isinstance(value, str):
        raise ValueError(f"label {name!r}: expected a string, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_LABEL_CHARS:
        raise ValueError(
            f"label {name!r}: {len(value)} characters, expected 1 to {MAX_LABEL_CHARS}"
        )
    if not value.isprintable():
        raise ValueError(f"label {name!r}: control characters are not allowed in {value[:40]!r}")
    return value


def check_labels(labels: Mapping[str, object]) -> dict[str, str]:
    """Validated copy of a target's labels; raises ``ValueError`` naming the bad label."""
    if len(labels) > MAX_TARGET_LABELS:
        raise ValueError(f"{len(labels)} labels, at most {MAX_TARGET_LABELS} allowed")
    checked: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name) or len(name) > 128:
            raise ValueError(f"label name {str(name)[:40]!r}: expected [a-zA-Z_][a-zA-Z0-9_]*")
        checked[name] = check_label_value(name, value)
    return checked


def instance_name(labels: Mapping[str, str], address: str) -> str:
    """The name an instance goes by in every record, report, flag and alert.

    The ``instance`` label if set, else the ``pod`` label, else ``address`` (``host:port``).
    An engine's scrape target and the tap in front of it must resolve to the same name,
    since detectors join their samples by instance (ghosts, GPU evidence by DCGM ``pod``).
    """
    for label in NAMING_LABELS:
        if labels.get(label):
            return labels[label]
    return address


class _Model(BaseModel):
    model_config = STRICT


class TargetConfig(_Model):
    """One scrape target. ``instance`` (the join key) follows :func:`instance_name`;
    ``address`` is always the URL's ``host:port``."""

    url: str = Field(description="http(s) URL of /metrics, or host:port")
    dialect: DialectChoice = "auto"
    pool: str | None = Field(
        default=None, description="serving pool; default the series' model label"
    )
    model: str | None = Field(
        default=None, description="model when the exporter has no model label (llama.cpp)"
    )

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="names people use: instance, pod (name the instance, in that order), "
        "node, … (1 to 253 printable characters each)",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_url_port(normalise_url(value))

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: object) -> object:
        return check_labels(value) if isinstance(value, Mapping) else value

    @property
    def address(self) -> str:
        """``host:port`` of the URL (the ``address`` column)."""
        return urlsplit(self.url).netloc

    @property
    def instance(self) -> str:
        """The instance name (the ``instance`` column); see :func:`instance_name`."""
        return instance_name(self.labels, self.address)


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
    metrics_port: FreePortOr | None = Field(None, description="serve /metrics here (0 = any)")
    metrics_host: str = "127.0.0.1"

    @model_validator(mode="after")
    def _names_unique(self) -> CollectConfig:
        seen: dict[str, str] = {}
        for target in self.targets:
            if target.instance == target.address:
                continue  # unnamed: a host:port may serve several paths
            other = seen.setdefault(target.instance, target.url)
            if other != target.url:
                raise ValueError(
                    f"targets: {target.url} and {other} are both named {target.instance!r}"
                )
        return self

    @property
    def file_sd_paths(self) -> list[Path]:
        return [Path(p) for p in self.file_sd]
