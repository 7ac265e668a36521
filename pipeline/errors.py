"""The one exception tree of llmslo.

Every package raises these (never a bare ``Exception``)::

    LlmsloError                 root: ``except LlmsloError`` catches everything we raise
    ├── ConfigError             a config file or SLO spec failed validation (message names the field path)
    ├── DecodeError             a message, scrape or stream could not be decoded (hot paths count it, never raise)
    │   └── UnknownSchemaError  the schema name or version in the headers is not one we know
    ├── BusError                the Kafka bus or the embedded broker failed (start, connect, create topics)
    ├── StoreError              DuckDB could not be opened or written
    └── QueryError              a read query's parameter is invalid or out of bounds (names the parameter)
"""

from __future__ import annotations

__all__ = [
    "BusError",
    "ConfigError",
    "DecodeError",
    "LlmsloError",
    "QueryError",
    "StoreError",
    "UnknownSchemaError",
]


class LlmsloError(Exception):
    """Root of every error llmslo raises on purpose."""


class ConfigError(LlmsloError):
    """A configuration file or spec is invalid.

    The message names the field path, e.g. ``bus.partitions: must be >= 1``, so that a
    user can find the line to fix; the pydantic or YAML error is chained as the cause.
    """


class DecodeError(LlmsloError):
    """Input from outside (a Kafka message, exposition text, an SSE stream) is malformed.

    ``reason`` is a short, stable, label-safe token (``truncated_arrow``, ``not_json``,
    ``oversized``, …) used as the ``reason`` label on drop counters and in the dead-letter
    table; the message says what was wrong in words.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnknownSchemaError(DecodeError):
    """The message names a schema or schema version this build does not know."""


class BusError(LlmsloError):
    """The Kafka bus failed: broker unreachable, topic creation refused, broker binary missing."""


class StoreError(LlmsloError):
    """The DuckDB store could not be opened, migrated or written."""


class QueryError(LlmsloError):
    """A parameter of a read query (``slo.queries``) is of the wrong kind or out of bounds.

    ``parameter`` names it (``end_ms``, ``limit``, …) so that an HTTP API can answer 400
    with the field; the message says what is allowed.
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
