"""Manual flag overrides: the ``flag_overrides`` table and how an override changes the
flags that gateways read.

An operator forces a scope (pool or instance) the store knows to a level until an expiry
(``POST /api/v1/flags/overrides``, token required); its texts are printable (no control,
NUL or bidirectional-override characters, which would disguise what an operator reads). :func:`apply_overrides` is pure: it takes the
computed flags (``slo.queries.current_flags``) and the overrides active at a time and
returns the table gateways see, same schema. All SQL is parameterised.
"""

from __future__ import annotations

import json
import unicodedata
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import duckdb
import pyarrow as pa
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from api.tables import FLAG_OVERRIDES_TABLE
from pipeline.errors import QueryError
from slo.queries import FLAGS_SCHEMA, meta
from slo.sinks import OVERRIDE_REASONS

__all__ = [
    "OVERRIDE_ENDED",
    "OVERRIDE_REASON",
    "FlagOverride",
    "OverrideRequest",
    "OverrideStore",
    "apply_overrides",
    "check_scope",
]

#: ``reason`` of the transition an override publishes when set, and when it ends (the SLO
#: jobs skip both when they resume their own levels).
OVERRIDE_REASON, OVERRIDE_ENDED = OVERRIDE_REASONS
#: Longest an override may last (7 days): a forgotten override must end by itself.
MAX_OVERRIDE_S = 7 * 86_400
#: Unicode categories refused in override texts: controls (NUL included), format
#: characters (bidirectional overrides and isolates, zero-width joiners), surrogates.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Cs"})


def _printable(text: str) -> str:
    for char in text:
        if unicodedata.category(char) in _UNPRINTABLE:
            raise ValueError(f"contains the unprintable character U+{ord(char):04X}")
    return text


Printable = Annotated[str, AfterValidator(_printable)]


class OverrideRequest(BaseModel):
    """The body of ``POST /api/v1/flags/overrides``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    scope: Literal["pool", "instance"]
    scope_id: Printable = Field(min_length=1, max_length=256)
    pool: Printable | None = Field(default=None, min_length=1, max_length=256)
    level: int = Field(ge=0, le=3)
    #: How long it holds, in seconds (1 s to 7 days).
    expires_in_s: int = Field(ge=1, le=MAX_OVERRIDE_S)
    reason: Printable = Field(min_length=1, max_length=500)


def check_scope(
    con: duckdb.DuckDBPyConnection,
    request: OverrideRequest,
    flags: Mapping[tuple[str, str], Mapping[str, Any]],
) -> None:
    """Refuse an override of a scope (or ``pool``) the store does not know.

    Known: the pools and instances of the request records and engine samples
    (``slo.queries.meta``) and the scopes of the current ``flags`` (scope, id) → row.

    Raises:
        QueryError: naming the unknown scope id or pool (400).
    """
    found = meta(con)
    known = {
        "pool": set(found["pools"]) | {str(row["pool"]) for row in flags.values() if row["pool"]},
        "instance": {item["instance"] for item in found["instances"]},
    }
    for scope, scope_id in flags:
        known.setdefault(scope, set()).add(scope_id)
    if request.scope_id not in known[request.scope]:
        raise QueryError(
            "scope_id", f"no {request.scope} {request.scope_id[:80]!r} is known to the store"
        )
    if request.pool is not None and request.pool not in known["pool"]:
        raise QueryError("pool", f"no pool {request.pool[:80]!r} is known to the store")


@dataclass(frozen=True)
class FlagOverride:
    """One stored override (times in Unix epoch ms)."""

    override_id: str
    scope: str
    scope_id: str
    pool: str | None
    level: int
    reason: str
    created_ts_ms: int
    expires_ts_ms: int
    cleared_ts_ms: int | None = None

    def as_json(self) -> dict[str, object]:
        """JSON-ready fields."""
        return dict(self.__dict__)


_COLUMNS = [name for name, _, _ in FLAG_OVERRIDES_TABLE.columns]


class OverrideStore:
    """Reads and writes ``flag_overrides`` through a connection or cursor the caller owns."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def add(self, request: OverrideRequest, now_ms: int) -> FlagOverride:
        """Store a new override starting at ``now_ms``."""
        override = FlagOverride(
            override_id=uuid.uuid4().hex,
            scope=request.scope,
            scope_id=request.scope_id,
            pool=request.pool,
            level=request.level,
            reason=request.reason,
            created_ts_ms=now_ms,
            expires_ts_ms=now_ms + request.expires_in_s * 1000,
        )
        values = [getattr(override, name) for name in _COLUMNS]
        self.con.execute(
            f"INSERT INTO flag_overrides ({', '.join(_COLUMNS)}) VALUES "
            f"({', '.join('?' * len(_COLUMNS))})",
            values,
        )
        return override

    def clear(self, override_id: str, now_ms: int) -> FlagOverride | None:
        """End an active override now; None when there is no such active override."""
        found = [o for o in self.active(now_ms) if o.override_id == override_id]
        if not found:
            return None
        self.con.execute(
            "UPDATE flag_overrides SET cleared_ts_ms = ? WHERE override_id = ?",
            [now_ms, override_id],
        )
        return FlagOverride(**{**found[0].__dict__, "cleared_ts_ms": now_ms})

    def active(self, at_ms: int) -> list[FlagOverride]:
        """Overrides in force at ``at_ms``, oldest first (a table not created yet: none)."""
        try:
            rows = self.con.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM flag_overrides"
                " WHERE created_ts_ms <= ? AND expires_ts_ms > ?"
                " AND (cleared_ts_ms IS NULL OR cleared_ts_ms > ?)"
                " ORDER BY created_ts_ms, override_id",
                [at_ms, at_ms, at_ms],
            ).fetchall()
        except duckdb.CatalogException:
            return []
        return [FlagOverride(*row) for row in rows]


def apply_overrides(computed: pa.Table, overrides: list[FlagOverride]) -> pa.Table:
    """The flags gateways see: ``computed`` with each overridden scope at its forced level.

    The newest override of a scope wins. An overridden row keeps the computed level in
    ``from_level`` and says why in ``reason``/``evidence_json``. A row that is itself a
    published override transition with no override in force any more reads as its
    ``from_level`` (the end transition may not be ingested yet). Same schema, sorted by
    scope and scope id.
    """
    rows = {(r["scope"], r["scope_id"]): r for r in computed.to_pylist()}
    forced = {(o.scope, o.scope_id): o for o in overrides}
    for key, row in rows.items():
        if row["reason"] == OVERRIDE_REASON and key not in forced:
            row.update(to_level=row["from_level"], reason=OVERRIDE_ENDED)
    for key, override in forced.items():
        row = rows.get(key)
        computed_level = 0 if row is None else row["to_level"]
        if row is not None and row["reason"] == OVERRIDE_REASON:
            computed_level = row["from_level"]
        evidence = {
            "override_id": override.override_id,
            "override_reason": override.reason,
            "expires_ts_ms": override.expires_ts_ms,
            "computed_level": computed_level,
        }
        rows[key] = {
            "ts_ms": override.created_ts_ms,
            "scope": override.scope,
            "scope_id": override.scope_id,
            "pool": override.pool if row is None else (row["pool"] or override.pool),
            "from_level": computed_level,
            "to_level": override.level,
            "reason": OVERRIDE_REASON,
            "evidence_json": json.dumps(evidence, sort_keys=True),
        }
    ordered = [rows[key] for key in sorted(rows)]
    return pa.Table.from_pylist(ordered, schema=FLAGS_SCHEMA)
