"""Object storage for the lake: where its credentials come from, and putting a file there.

Secrets never live in the config file (nor in its dump, nor in logs): the access key and
secret come from a credentials file in the AWS shared-credentials format
(``credentials_file``, profile ``profile``) or from the standard environment variables
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN`` optional).
:class:`S3Credentials` hides the secret from ``repr``, and every error of this module
names the bucket and key, never a credential.

:class:`ObjectStore` puts files through s3fs (the ``lake`` extra). A PUT is atomic in S3:
an object appears whole or not at all, and putting the same key again replaces it, so a
retried upload of one exported hour (same key) can never leave that hour twice.
Transient failures (no connection, a timeout, a 5xx) are retried with back-off for
``retry_for_s``; refusals (wrong key or secret, no such bucket) are not retried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import configparser
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import ConfigError, StoreError

__all__ = [
    "ObjectStore",
    "ObjectStoreError",
    "S3Config",
    "S3Credentials",
    "read_credentials",
    "split_s3_uri",
]

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
#: An upload slower than this (bytes/s, beyond ``timeout_s``) is given up and retried.
MIN_THROUGHPUT_BYTES_S = 1024 * 1024


class ObjectStoreError(StoreError):
    """An object store refused a file or stayed unreachable; the message names the bucket
    and key (``bucket``, ``key``), never a credential."""

    def __init__(self, bucket: str, key: str, message: str) -> None:
        super().__init__(f"bucket {bucket!r}, key {key!r}: {message}")
        self.bucket = bucket
        self.key = key


class S3Config(BaseModel):
    """The S3-compatible store of an ``s3://`` Parquet lake (``store.s3``)."""

    # pipeline.config.STRICT (that module imports this one, so it is spelled out here).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    endpoint: str | None = Field(
        None,
        description="S3-compatible endpoint URL (MinIO, Ceph, moto…); default: "
        "AWS_ENDPOINT_URL or AWS's own",
    )
    region: str | None = Field(None, description="default: AWS_REGION, else us-east-1")
    credentials_file: Path | None = Field(
        None,
        strict=False,
        description="AWS shared-credentials file (aws_access_key_id, aws_secret_access_key); "
        "default: the AWS_* environment variables",
    )
    profile: str = "default"
    retry_for_s: float = Field(
        600.0,
        gt=0,
        description="how long an upload retries an unreachable store (backing off up to 5 s) "
        "before the export round fails (the next round exports the hour again)",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="seconds an upload attempt may take, plus one per MiB uploaded, before "
        "it is cancelled and retried",
    )


@dataclass(frozen=True)
class S3Credentials:
    """An access key; ``repr`` hides the secret (it must never reach a log)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def read_credentials(credentials_file: Path | None, profile: str) -> S3Credentials | None:
    """The credentials file's ``profile``, else the environment's; ``None`` when neither has
    any (the client then looks where boto looks: an instance role, ``~/.aws``). Raises
    :class:`ConfigError` naming the file and profile (never a value)."""
    if credentials_file is not None:
        parser = configparser.ConfigParser()
        try:
            with credentials_file.open() as handle:
                parser.read_file(handle)
        except (OSError, configparser.Error) as exc:
            raise ConfigError(f"cannot read credentials file {credentials_file}: {exc}") from exc
        if not parser.has_section(profile):
            raise ConfigError(f"credentials file {credentials_file} has no profile [{profile}]")
        section = parser[profile]
        try:
            return S3Credentials(
                section["aws_access_key_id"],
                section["aws_secret_access_key"],
                section.get("aws_session_token"),
            )
        except KeyError as exc:
            raise ConfigError(
                f"credentials file {credentials_file} [{profile}] lacks {exc}"
            ) from exc
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return S3Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN"))
    return None


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://BUCKET/KEY`` as ``(BUCKET, KEY)``; raises :class:`ConfigError`."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket:
        raise ConfigError(f"{uri!r} is not s3://BUCKET/PREFIX")
    return bucket, key.strip("/")


#: s3fs raises these for a refusal that retrying cannot fix (403: wrong key or secret;
#: 404: no such bucket); anything else from the store (timeouts, resets, 5xx) is retried.
_REFUSALS = (PermissionError, FileNotFoundError)


class ObjectStore:
    """Puts files into an S3-compatible store (s3fs), retrying transient failures.

    ``sleep`` waits between attempts (seconds; injected for tests); ``should_stop`` ends
    the retries early (a process shutting down).
    """

    def __init__(
        self,
        config: S3Config,
        *,
        sleep: Callable[[float], None] = time.sleep,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.config = config
        self.retries = 0  # attempts that failed and were retried, since this store was made
        self._sleep = sleep
        self._should_stop = should_stop
        self._fs = _filesystem(config)

    @property
    def filesystem(self) -> Any:
        """The s3fs filesystem (for DuckDB's ``register_filesystem``)."""
        return self._fs

    def put(self, local: Path, uri: str) -> None:
        """Upload ``local`` to ``uri`` (``s3://BUCKET/KEY``), replacing the object; raises
        :class:`ObjectStoreError` naming bucket and key on a refusal, or once the store
        stayed unreachable for ``retry_for_s``."""
        bucket, key = split_s3_uri(uri)
        deadline = time.monotonic() + self.config.retry_for_s
        delay = 0.1
        transient = _transient()
        while True:
            try:
                self._put_once(local, f"{bucket}/{key}")
                return
            except _REFUSALS as exc:
                raise ObjectStoreError(bucket, key, f"refused: {_reason(exc)}") from exc
            except transient as exc:
                if time.monotonic() + delay > deadline or self._should_stop():
                    raise ObjectStoreError(
                        bucket,
                        key,
                        f"unreachable for {self.config.retry_for_s:.0f} s or stopping: "
                        f"{_reason(exc)}",
                    ) from exc
                self.retries += 1
                log.warning(
                    "upload to bucket %r, key %r failed (%s); retrying in %.1f s",
                    bucket,
                    key,
                    _reason(exc),
                    delay,
                )
                self._sleep(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)

    def _put_once(self, local: Path, path: str) -> None:
        """One attempt, cancelled after ``timeout_s`` plus a second per MiB: botocore's
        own timeouts do not end a request to a server that accepted the connection and
        then answers nothing (a stopped process, a black-holed route)."""
        limit_s = self.config.timeout_s + local.stat().st_size / MIN_THROUGHPUT_BYTES_S
        attempt = asyncio.run_coroutine_threadsafe(
            self._fs._put_file(str(local), path), self._fs.loop
        )
        try:
            attempt.result(timeout=limit_s)
        except concurrent.futures.TimeoutError:
            attempt.cancel()  # a late success could overwrite a later round's object
            raise TimeoutError(f"no answer within {limit_s:.0f} s") from None

    def glob(self, uri: str) -> list[str]:
        """The ``s3://`` URIs matching ``uri``'s pattern; raises :class:`ObjectStoreError`."""
        bucket, key = split_s3_uri(uri)
        try:
            return ["s3://" + path for path in self._fs.glob(f"{bucket}/{key}")]
        except Exception as exc:
            raise ObjectStoreError(bucket, key, f"cannot list: {_reason(exc)}") from exc

    def invalidate(self) -> None:
        """Forget listings cached by the filesystem (files written by other processes)."""
        self._fs.invalidate_cache()


def _reason(exc: BaseException) -> str:
    """The error's words, or its class when it has none (a bare timeout)."""
    return str(exc) or type(exc).__name__


def _filesystem(config: S3Config) -> Any:
    try:
        import s3fs
    except ImportError as exc:
        raise ConfigError("an s3:// lake needs s3fs: pip install 'llmslo[lake]'") from exc
    credentials = read_credentials(config.credentials_file, config.profile)
    options: dict[str, Any] = {}
    if credentials is not None:
        options = {
            "key": credentials.access_key_id,
            "secret": credentials.secret_access_key,
            "token": credentials.session_token,
        }
    region = config.region or os.environ.get("AWS_REGION") or "us-east-1"
    fs = s3fs.S3FileSystem(
        endpoint_url=config.endpoint or os.environ.get("AWS_ENDPOINT_URL"),
        client_kwargs={"region_name": region},
        config_kwargs={
            "connect_timeout": config.timeout_s,
            "read_timeout": config.timeout_s,
            "retries": {"max_attempts": 1, "mode": "standard"},
        },
        skip_instance_cache=True,  # a cached instance would keep another config's key
        **options,
    )
    fs.retries = 1  # one attempt per call: ObjectStore.put retries with its own deadline
    return fs


def _transient() -> tuple[type[BaseException], ...]:
    """What a store that is down or slow raises through s3fs: a bug (``TypeError``) is not
    among them, so it surfaces at once instead of being retried for ``retry_for_s``."""
    import aiohttp
    import botocore.exceptions

    return (OSError, TimeoutError, botocore.exceptions.BotoCoreError, aiohttp.ClientError)
