"""The llmslo configuration file: one YAML document, validated once, at the boundary.

The spine owns the ``bus``, ``store`` and ``ingest`` sections. Other packages own their
own sections (``simulator``, ``collect``, ``tap``, ``slo``, …) as pydantic models; the
caller passes the table of them (``sections=``, the explicit table is ``llmslo.sections``),
and :func:`load_config` validates every section, so ``llmslo config validate`` reports
all errors of a file at once, each by field path (``ingest.batch_max_rows: Input should
be greater than 0``). Nothing registers itself on import: a process that loads the file
with the same table gets the same errors.

Every YAML file llmslo reads goes through :func:`load_yaml` / :func:`load_yaml_documents`:
PyYAML's safe loader, except that a mapping repeating a key is an error naming the key and
both lines (PyYAML would silently keep the last one). Numbers are strict: ``true`` is not
``1`` and ``"5"`` is not ``5`` (:data:`STRICT`), and ports are 1–65535 (0 only where it
means "any free port").

Secrets never live in the file: a section names the environment variable that holds
one (``sasl_password_env: KAFKA_PASSWORD``) and :func:`secret_from_env` reads it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.errors import ConfigError
from pipeline.iceberg.config import IcebergConfig
from pipeline.s3 import S3Config, split_s3_uri

__all__ = [
    "EMBEDDED_MAX_BYTES",
    "INGEST_BASELINE_MB",
    "STRICT",
    "BusConfig",
    "FreePortOr",
    "IngestConfig",
    "LlmsloConfig",
    "Port",
    "StoreConfig",
    "UniqueKeyLoader",
    "check_url_port",
    "format_validation_error",
    "ingest_memory_defaults",
    "load_config",
    "load_yaml",
    "load_yaml_documents",
    "parse_config",
    "secret_from_env",
]

SectionT = TypeVar("SectionT", bound=BaseModel)

#: Model config of every config section and spec: unknown keys are errors, values are
#: immutable, and types are strict (YAML ``true`` is not the number 1, ``"5"`` not 5).
#: A field that must convert (a path from a string) says so with ``Field(strict=False)``.
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)

#: A TCP port to connect to or listen on.
Port = Annotated[int, Field(ge=1, le=65535)]
#: A port to listen on, where 0 means "any free port".
FreePortOr = Annotated[int, Field(ge=0, le=65535)]


def check_url_port(url: str) -> str:
    """``url`` unchanged if its port (if any) is 1–65535; raises ``ValueError`` naming it."""
    try:
        port = urlsplit(url).port
    except ValueError as exc:  # urllib's message: "Port out of range 0-65535"
        raise ValueError(f"{url!r}: port must be 1-65535") from exc
    if port == 0:
        raise ValueError(f"{url!r}: port must be 1-65535")
    return url


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a mapping repeating a key.

    YAML 1.2 forbids repeated keys; PyYAML keeps the last one silently, so ``port: 80``
    followed by ``port: 8080`` three screens later would win without a word. Merge keys
    (``<<``) may still be overridden, as YAML intends.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = key in first_line
                except TypeError:  # unhashable: the base class reports it
                    continue
                if seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {first_line[key]})",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)  # type: ignore[arg-type]


def _loader(text: str, source: str) -> UniqueKeyLoader:
    loader = UniqueKeyLoader(text)
    loader.name = source  # error marks then say which file, not "<unicode string>"
    return loader


def load_yaml(text: str, source: str = "<yaml>") -> Any:
    """One YAML document, safely; raises ``yaml.YAMLError`` (a repeated key included)."""
    loader = _loader(text, source)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml_documents(text: str, source: str = "<yaml>") -> list[Any]:
    """Every document of a YAML stream, safely; raises ``yaml.YAMLError``."""
    loader = _loader(text, source)
    try:
        documents = []
        while loader.check_data():
            documents.append(loader.get_data())
        return documents
    finally:
        loader.dispose()


class _Section(BaseModel):
    model_config = STRICT


#: Default bound on the embedded broker's stored record batches (1 GiB on disk; the
#: broker's memory does not grow with them).
EMBEDDED_MAX_BYTES = 1024 * 1024 * 1024


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
    embedded_data_dir: Path | None = Field(
        None,
        strict=False,
        description="where the embedded broker keeps its log, so un-ingested records survive "
        "its restart; default: `llmslo run` keeps it beside the DuckDB file "
        "(<store.path>.broker), other commands in a temporary directory removed at exit",
    )
    embedded_max_bytes: int = Field(
        EMBEDDED_MAX_BYTES,
        ge=1024 * 1024,
        description="bound on the embedded broker's record batches: past it the oldest are "
        "dropped even if a consumer group has not committed them (counted in "
        'llmslo_broker_deleted_records_total{reason="overflow"} and logged)',
    )
    embedded_retention_interval_s: float = Field(
        5.0,
        gt=0,
        description="seconds between the embedded broker's retention passes (records every "
        "consumer group committed are deleted)",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        if value == "embedded":
            return value
        for address in value.split(","):
            host, sep, port = address.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError(f"{address.strip()!r} is not HOST:PORT with a port in 1-65535")
        return value


def _lake_location(value: object) -> object:
    """An ``s3://`` URI stays a string (checked); any other string is a local path."""
    if isinstance(value, str):
        if value.startswith("s3://"):
            try:
                split_s3_uri(value)
            except ConfigError as exc:
                raise ValueError(str(exc)) from exc
            return value
        if "://" in value:
            raise ValueError(f"{value!r}: only local paths and s3:// URIs are lakes")
        return Path(value)
    return value


class StoreConfig(_Section):
    """The DuckDB file and how long raw rows are kept."""

    path: Path = Field(Path("var/llmslo.duckdb"), strict=False)
    raw_retention_days: float = Field(7.0, gt=0)
    lake_dir: Annotated[Path | str, BeforeValidator(_lake_location)] | None = Field(
        None,
        description="where hourly Parquet partitions are exported: a directory every "
        "ingester and the jobs share, or s3://BUCKET/PREFIX (the store in store.s3)",
    )
    s3: S3Config = Field(
        default_factory=S3Config,
        description="endpoint, credentials and retries of an s3:// lake_dir",
    )
    lake_export_interval_s: float = Field(
        60.0,
        gt=0,
        description="seconds between lake exports in `llmslo run --role ingest` (the open "
        "hours are rewritten each time: the lake's freshness)",
    )
    lake: Literal["parquet", "iceberg"] = Field(
        "parquet",
        description="parquet: hourly files under lake_dir; iceberg: each committed batch "
        "appended to Iceberg tables (store.iceberg) with its Kafka offsets",
    )
    iceberg: IcebergConfig | None = None

    @model_validator(mode="after")
    def _iceberg_configured(self) -> StoreConfig:
        if self.lake == "iceberg" and self.iceberg is None:
            raise ValueError("store.lake: iceberg needs store.iceberg (catalog_uri, warehouse)")
        return self


#: What the ingester's process holds besides batches, fetches and DuckDB's buffer pool:
#: the interpreter, pyarrow, DuckDB and kafka-python with the store open (measured 175 MB).
INGEST_BASELINE_MB = 175


def ingest_memory_defaults(memory_mb: int) -> dict[str, int | str]:
    """The byte settings that ``ingest.memory_mb`` implies (see :mod:`pipeline.ingest`).

    Of the budget above :data:`INGEST_BASELINE_MB`: an eighth for the Kafka fetch, a
    quarter for the batches in hand (up to 4 × ``batch_max_bytes``), half for DuckDB's
    buffer pool, and an eighth left as margin (DuckDB and Arrow allocate outside their
    pools). One decoded message may be as large as the batches. At 512 MB: 42 MiB fetch,
    21 MiB batches, a 176 MB DuckDB pool.
    """
    spare_bytes = (memory_mb - INGEST_BASELINE_MB) * 1024 * 1024
    batch_bytes = max(1024 * 1024, spare_bytes // 16)
    return {
        "fetch_max_bytes": max(2 * 1024 * 1024, spare_bytes // 8),
        "batch_max_bytes": batch_bytes,
        "max_decoded_bytes": 4 * batch_bytes,
        "duckdb_memory_limit": f"{spare_bytes // 2 // 1_000_000}MB",
    }


class IngestConfig(_Section):
    """The Kafka → DuckDB ingester.

    ``memory_mb`` is the one memory knob: ``fetch_max_bytes``, ``batch_max_bytes``,
    ``max_decoded_bytes`` and ``duckdb_memory_limit`` are derived from it
    (:func:`ingest_memory_defaults`) unless set explicitly.
    """

    group_id: str = "llmslo-ingest"
    memory_mb: int = Field(
        512,
        ge=INGEST_BASELINE_MB + 64,
        le=1_000_000,
        description="the ingester's memory budget (peak RSS, MB); the byte settings below "
        "default to shares of it",
    )
    batch_max_rows: int = Field(250_000, gt=0, description="commit once this many rows are pending")
    batch_max_ms: int = Field(500, gt=0, description="… or once the oldest pending row is this old")
    batch_max_bytes: int = Field(
        24 * 1024 * 1024,  # replaced by the memory_mb share unless given
        ge=1024 * 1024,
        description="… or once pending rows (decoded Arrow) and dead-letter payloads hold this "
        "many bytes; the ingester holds at most about 4× this in batches (see pipeline.ingest); "
        "default: a sixteenth of memory_mb above the baseline",
    )
    max_message_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="larger messages are dead-lettered"
    )
    max_decoded_bytes: int = Field(
        64 * 1024 * 1024,  # replaced by the memory_mb share unless given
        gt=0,
        description="Arrow messages whose buffers decompress to more are dead-lettered before "
        "decompressing (oversized_decoded); default: 4 × batch_max_bytes",
    )
    fetch_max_bytes: int = Field(
        32 * 1024 * 1024,  # replaced by the memory_mb share unless given
        ge=1024 * 1024,
        description="bytes one Kafka fetch may return (half of it per partition); default: a "
        "eighth of memory_mb above the baseline",
    )
    peer_stores: list[str] = Field(
        default_factory=list,
        description="paths or glob patterns of the other group members' DuckDB files; a "
        "partition's new owner starts at the greatest offset stored in any of them that it "
        "can open (a dead member's), so a crash between a member's DuckDB and Kafka commits "
        "doubles nothing",
    )
    metrics_port: FreePortOr | None = Field(
        None, description="serve /metrics here (0 = any free port)"
    )
    metrics_host: str = "127.0.0.1"
    session_timeout_ms: int = Field(
        10_000,
        ge=6_000,
        le=300_000,
        description="consumer-group session: how long a dead ingester keeps its partitions",
    )
    duckdb_memory_limit: str = Field(
        "192MB",  # replaced by the memory_mb share unless given
        pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)$",
        description="DuckDB buffer pool of the ingester (bounds its RSS); default: half of "
        "memory_mb above the baseline",
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_from_memory_mb(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        memory_mb = data.get("memory_mb", 512)
        if type(memory_mb) is not int or memory_mb < INGEST_BASELINE_MB + 64:
            return data  # the field's own validation reports it
        return {**ingest_memory_defaults(memory_mb), **data}


class LlmsloConfig(_Section):
    """The whole file. Unknown top-level keys are errors; the other sections stay raw here."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

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
    known = {"bus", "store", "ingest", *sections}
    unknown = sorted(set(raw) - known)
    if unknown and not set(raw) & known and _looks_like_slo_spec(raw):
        raise ConfigError(
            f"{source}: this is an SLO spec, not an llmslo config (it has "
            f"{', '.join(unknown)} and no config section): check it with "
            f"`llmslo slo validate {source}` and pass it as --spec; a config has sections "
            f"such as {', '.join(sorted(known))}"
        )
    problems = [f"{key}: unknown section" for key in unknown]
    config: LlmsloConfig | None = None
    try:
        config = LlmsloConfig.model_validate(raw)
    except ValidationError as exc:
        problems.append(format_validation_error(exc))
    # Only the sections the file has: an absent one is its model's defaults, validated when
    # a component asks for it (``LlmsloConfig.section``), so a process imports no model it
    # does not use (``sections`` may import each model on lookup).
    for name in sorted(set(raw) & set(sections)):
        try:
            sections[name].model_validate(raw.get(name) or {})
        except ValidationError as exc:
            problems.append(format_validation_error(exc, prefix=name))
    if problems or config is None:
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(problems))
    return config


def _looks_like_slo_spec(raw: dict[Any, Any]) -> bool:
    # llmslo/v1 and Sloth prometheus/v1 have `slos`; OpenSLO, Sloth's and Pyrra's CRDs `kind`.
    return "slos" in raw or ("apiVersion" in raw and "kind" in raw)


def load_config(path: str | Path | None, sections: Sections | None = None) -> LlmsloConfig:
    """Read and validate a config file (see :func:`parse_config`); ``None`` gives the defaults."""
    if path is None:
        return parse_config({}, sections=sections)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        raw = load_yaml(text, str(path))
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
