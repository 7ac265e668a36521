"""The one exception tree of llmslo.

Every package raises these (never a bare ``Exception``). The classes of this module are
the ones several packages raise or catch; a leaf that belongs to one package's surface is
defined there, beside the code that raises it (module in parentheses)::

    LlmsloError                     root: ``except LlmsloError`` catches everything we raise
    ├── ConfigError                 a config file or SLO spec failed validation (message names the field path)
    │   └── UnknownFaultError       (simulator.faults) a fault name not in the catalogue
    ├── DecodeError                 a message, scrape or stream could not be decoded (hot paths count it, never raise)
    │   ├── UnknownSchemaError      the schema name or version in the headers is not one we know
    │   └── RefusedWrite            (collectors.receive.series) a remote-write body refused with its reason
    ├── BusError                    the Kafka bus or the embedded broker failed (start, connect, create topics)
    ├── StoreError                  DuckDB could not be opened or written
    │   ├── LakeError               (pipeline.iceberg.lake) the Iceberg lake refused a write or stayed unreachable
    │   └── ObjectStoreError        (pipeline.s3) an object store refused a file or stayed unreachable (names bucket and key)
    ├── QueryError                  a read query's or API request's parameter is invalid (HTTP 400, names the parameter)
    │   └── UnknownCohortError      (api.errors) a cohort matches no request record at all (HTTP 404)
    ├── AuthError                   (api.errors) the bearer token is missing (HTTP 401) or wrong (HTTP 403)
    ├── ReadOnlyStoreError          (api.errors) a change was asked of a store opened read-only (HTTP 503)
    ├── UnknownVerdictError         (api.errors) no stored verdict has that id (HTTP 404)
    ├── OverloadedError             (api.errors) a lane of the API is full: shed with 503 + Retry-After
    ├── FlagSourceError             (collectors.tap.degradation) the tap's flags source is unreachable now
    ├── ClientGone                  (collectors.tap.downstream) the tap's client disconnected or stopped reading
    ├── UpstreamError               (collectors.tap.upstream) the engine behind the tap failed the exchange
    │   ├── ConnectFailed           no connection: refused, unreachable, TLS
    │   ├── ConnectTimeout          no connection within the connect timeout
    │   ├── ReadTimeout             the engine sent nothing within the read timeout
    │   └── UpstreamReset           closed or reset mid-exchange, or not valid HTTP
    ├── RequestError                (simulator.openai) the body is not a valid OpenAI request (HTTP 400)
    ├── SourceError                 (dashboards.sources) a dashboard's source cannot be read
    └── DrillChildError             (llmslo.drill.child) a drill child (its pipeline, its pods) failed or did not answer

Private exceptions that never leave their module (a parser's bad line) derive from
``LlmsloError`` too and are not drawn.
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
    """A parameter of a read query or API request is of the wrong kind or out of bounds.

    ``parameter`` names it (``end_ms``, ``limit``, …) so that an HTTP API can answer 400
    with the field, and the message starts with it; the rest says what is allowed.
    ``parameter`` is None when no single parameter is at fault (two cohorts that select the
    same requests); the message alone then says what is wrong.
    """

    def __init__(self, parameter: str | None, message: str) -> None:
        super().__init__(message if parameter is None else f"{parameter}: {message}")
        self.parameter = parameter
