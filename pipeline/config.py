"""The llmslo configuration file: one YAML document, validated once, at the boundary.

The spine owns the ``bus``, ``store`` and ``ingest`` sections. Other packages own their
own sections (``simulator``, ``collect``, ``tap``, ``slo``, …) as pydantic models; the
caller passes the table of them (``sections=``, the explicit table is ``app.sections``),
and :func:`load_config` validates every section, so ``llmslo config validate`` reports
all errors of a file at once, each by field path (``ingest.batch_max_rows: Input should
be greater than 0``). Nothing registers itself on import: a process that loads the file
with the same table gets the same errors.

Secrets never live in the file: a section names the environment variable that holds
one (``sasl_password_env: KAFKA_PASSWORD``) and :func:`secret_from_env` reads it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError

__all__ = [
    "BusConfig",
    "IngestConfig",
    "LlmsloConfig",
    "StoreConfig",
    "format_validation_error",
    "load_config",
    "parse_config",
    "secret_from_env",
]

SectionT = TypeVar("SectionT", bound=BaseModel)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BusConfig(_Section):
    """Where Kafka is and how topics are laid out."""

    bootstrap_servers: str = Field(
        "embedded",
        description="HOST:PORT[,HOST:PORT…] of the Kafka cluster, or 'embedded' to start the "
        "bundled Kafka-protocol broker on a free loopback port",
    )
    topic_prefix: str = Field("llmslo.", pattern=r"^[A-Za-z0-9._-]*$")
    partitions: int = Field(8, ge=1, le=1024, description="partitions of each topic we create")
    client_id: str = "llmslo"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password_env: str | None = Field(
        None, description="name of the environment variable holding the SASL password"
    )


class StoreConfig(_Section):
    """The DuckDB file and how long raw rows are kept."""

    path: Path = Path("var/llmslo.duckdb")
    raw_retention_days: float = Field(7.0, gt=0)
    lake_dir: Path | None = Field(None, description="where hourly Parquet partitions are exported")


class IngestConfig(_Section):
    """The Kafka → DuckDB ingester."""

    group_id: str = "llmslo-ingest"
    batch_max_rows: int = Field(250_000, gt=0, description="commit once this many rows are pending")
    batch_max_ms: int = Field(500, gt=0, description="… or once the oldest pending row is this old")
    max_message_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="larger messages are dead-lettered"
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics here (0 = any free port)"
    )
    metrics_host: str = "127.0.0.1"
    session_timeout_ms: int = Field(
        10_000,
        ge=6_000,
        le=300_000,
        description="consumer-group session: how long a dead ingester keeps its partitions",
    )
    duckdb_memory_limit: str = Field(
        "192MB",
        pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)$",
        description="DuckDB buffer pool of the ingester (bounds its RSS)",
    )


class LlmsloConfig(_Section):
    """The whole file. Unknown top-level keys are errors; the other sections stay raw here."""

    model_config = ConfigDict(extra="allow", frozen=True)

    bus: BusConfig = BusConfig()
    store: StoreConfig = StoreConfig()
    ingest: IngestConfig = IngestConfig()

    def section(self, name: str, model: type[SectionT]) -> SectionT:
        """The validated section ``name`` (defaults when the file has none)."""
        raw = (self.model_extra or {}).get(name) or {}
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, prefix=name)) from exc


#: Pydantic model of each top-level section owned outside the spine, by section name.
Sections = Mapping[str, type[BaseModel]]


def format_validation_error(
    exc: ValidationError,
    prefix: str = "",
    *,
    skip: Collection[str] = (),
    strip_value_error: bool = False,
) -> str:
    """One line per error, each starting with its dotted field path (``slos[2].objective``).

    The one formatter of pydantic errors in llmslo (config sections, SLO specs, dialect
    maps). ``prefix`` is the path of the validated node (a section name); ``skip`` names
    location parts that are not fields (the tags of a discriminated union);
    ``strip_value_error`` drops pydantic's ``Value error, `` before a validator's message.
    """
    lines = []
    for error in exc.errors():
        path = prefix
        for part in error["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif part not in skip:
                path += f".{part}" if path else str(part)
        message = error["msg"]
        if strip_value_error:
            message = message.removeprefix("Value error, ")
        lines.append(f"{path or '<root>'}: {message}")
    return "\n".join(lines)


def parse_config(
    raw: Any, source: str = "<config>", sections: Sections | None = None
) -> LlmsloConfig:
    """Validate an already-loaded YAML document against the spine's and ``sections``' models.

    Raises :class:`ConfigError` listing every problem by field path; a top-level key that
    is neither a spine section nor in ``sections`` is an ``unknown section``.
    """
    sections = sections or {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"bus", "store", "ingest"} - set(sections))
    problems = [f"{key}: unknown section" for key in unknown]
    config: LlmsloConfig | None = None
    try:
        config = LlmsloConfig.model_validate(raw)
    except ValidationError as exc:
        problems.append(format_validation_error(exc))
    for name, model in sorted(sections.items()):
        try:
            model.model_validate(raw.get(name) or {})
        except ValidationError as exc:
            problems.append(format_validation_error(exc, prefix=name))
    if problems or config is None:
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(problems))
    return config


def load_config(path: str | Path | None, sections: Sections | None = None) -> LlmsloConfig:
    """Read and validate a config file (see :func:`parse_config`); ``None`` gives the defaults."""
    if path is None:
        return parse_config({}, sections=sections)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_config(raw, source=str(path), sections=sections)


def secret_from_env(variable: str | None) -> str | None:
    """The secret held by environment variable ``variable``; an unset variable is an error."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if value is None:
        raise ConfigError(f"environment variable {variable} (named in the config) is not set")
    return value
