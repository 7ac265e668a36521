"""The ``store.iceberg`` section and where the object store's credentials come from.

Secrets never live in the config file (nor in its dump, nor in logs): the access key and
secret come from a credentials file (``credentials_file``, profile ``s3_profile``) or from
the ``AWS_*`` environment variables, read as :func:`pipeline.s3.read_credentials` reads
them for every object store of the lake. A PostgreSQL catalog's password comes from libpq's own ``PGPASSWORD`` or ``~/.pgpass``, so
``catalog_uri`` refuses one.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.s3 import S3Credentials, read_credentials

__all__ = ["IcebergConfig", "S3Credentials", "catalog_properties", "s3_credentials"]


class IcebergConfig(BaseModel):
    """Where the Iceberg catalog and warehouse are (``store.iceberg``)."""

    # pipeline.config.STRICT (that module imports this one, so it is spelled out here).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    catalog_uri: str = Field(
        description="SQL catalog: sqlite:///PATH (one host) or postgresql://USER@HOST:PORT/DB "
        "(a fleet; the password from PGPASSWORD or ~/.pgpass)"
    )
    warehouse: str = Field(
        description="s3://BUCKET/PREFIX, or a local directory, where tables' files go"
    )
    namespace: str = Field("llmslo", pattern=r"^[A-Za-z0-9_]{1,64}$")
    s3_endpoint: str | None = Field(
        None,
        description="S3-compatible endpoint URL (MinIO, Ceph, moto…); default: "
        "AWS_ENDPOINT_URL or AWS's own",
    )
    s3_region: str | None = Field(None, description="default: AWS_REGION, else us-east-1")
    credentials_file: Path | None = Field(
        None,
        strict=False,
        description="AWS shared-credentials file (aws_access_key_id, aws_secret_access_key); "
        "default: the AWS_* environment variables",
    )
    s3_profile: str = "default"
    retry_for_s: float = Field(
        600.0,
        gt=0,
        description="how long a commit retries an unreachable store (backing off up to 5 s) "
        "before the ingester stops (a restart re-reads the batch: nothing is lost)",
    )

    maintain_interval_s: float = Field(
        600.0,
        ge=0,
        description="seconds between lake maintenance passes in `llmslo run --role jobs` "
        "(retention, compaction of closed hours, snapshot expiry); 0: never (run "
        "`llmslo lake maintain` from a scheduler instead)",
    )
    snapshot_keep_s: float = Field(
        600.0,
        gt=0,
        description="snapshots younger than this survive expiry (at least retry_for_s: an "
        "ingester retrying a commit whose reply was lost looks for it among them)",
    )

    orphan_grace_s: float = Field(
        3 * 86_400.0,
        gt=0,
        description="lake maintenance deletes a file under a table that no snapshot ever "
        "referenced (a lost commit race, a writer that died) once it is this old (at least "
        "retry_for_s: a writer may be about to commit a younger one); files only expired "
        "snapshots referenced go at once",
    )

    @model_validator(mode="after")
    def _windows_cover_retries(self) -> IcebergConfig:
        if self.snapshot_keep_s < self.retry_for_s:
            raise ValueError(
                "snapshot_keep_s must be >= retry_for_s (a retried commit looks for itself "
                "among the snapshots kept)"
            )
        if self.orphan_grace_s < self.retry_for_s:
            raise ValueError(
                "orphan_grace_s must be >= retry_for_s (a commit still retrying may yet "
                "reference the files it wrote)"
            )
        return self

    @field_validator("catalog_uri")
    @classmethod
    def _sql_catalog(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("sqlite", "postgresql", "postgresql+psycopg2"):
            raise ValueError("catalog_uri must start with sqlite:/// or postgresql://")
        if parts.password:
            raise ValueError(
                "catalog_uri must not hold a password: set PGPASSWORD or use ~/.pgpass"
            )
        return value

    @property
    def sqlalchemy_uri(self) -> str:
        """``catalog_uri`` as SQLAlchemy names its driver."""
        if self.catalog_uri.startswith("postgresql://"):
            return "postgresql+psycopg2://" + self.catalog_uri.removeprefix("postgresql://")
        return self.catalog_uri

    @property
    def warehouse_uri(self) -> str:
        """``warehouse`` as a URI (a local directory becomes ``file://``, absolute)."""
        if "://" in self.warehouse:
            return self.warehouse
        return Path(self.warehouse).resolve().as_uri()

    @property
    def bucket(self) -> str | None:
        """The warehouse's bucket when it is on S3."""
        parts = urlsplit(self.warehouse)
        return parts.netloc if parts.scheme in ("s3", "s3a") else None


def s3_credentials(config: IcebergConfig) -> S3Credentials | None:
    """The credentials file's profile, else the environment's; ``None`` when neither has any
    (then the store is read anonymously, or by the instance's role where pyarrow finds one).
    Raises :class:`ConfigError` naming the file and profile (never a value)."""
    return read_credentials(config.credentials_file, config.s3_profile)


def catalog_properties(config: IcebergConfig, *, create_local: bool = False) -> dict[str, str]:
    """pyiceberg's catalog properties: URI, warehouse, endpoint, region and credentials.

    ``create_local`` first makes the directories of a local SQLite catalog file and of a
    local warehouse (a one-host lake starts from an empty ``var/``)."""
    if create_local:
        if config.catalog_uri.startswith("sqlite:///"):
            Path(config.catalog_uri.removeprefix("sqlite:///")).parent.mkdir(
                parents=True, exist_ok=True
            )
        if "://" not in config.warehouse:
            Path(config.warehouse).mkdir(parents=True, exist_ok=True)
    properties = {"uri": config.sqlalchemy_uri, "warehouse": config.warehouse_uri}
    endpoint = config.s3_endpoint or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        properties["s3.endpoint"] = endpoint
    properties["s3.region"] = config.s3_region or os.environ.get("AWS_REGION") or "us-east-1"
    credentials = s3_credentials(config)
    if credentials is not None:
        properties["s3.access-key-id"] = credentials.access_key_id
        properties["s3.secret-access-key"] = credentials.secret_access_key
        if credentials.session_token:
            properties["s3.session-token"] = credentials.session_token
    return properties
