"""The API's own DuckDB tables, declared once (DDL, column comments, ``docs/tables.md``).

``verdicts`` keeps every computed canary verdict with its evidence; ``flag_overrides`` the
manual degradation-level overrides set through ``POST /api/v1/flags/overrides``. Both are
created by :func:`api.create_app` when its connection can write; ``llmslo tables`` renders
them after the SLO tables.
"""

from __future__ import annotations

from api.verdicts import VERDICTS_TABLE
from pipeline.tables import TableDoc

__all__ = ["API_TABLES", "FLAG_OVERRIDES_TABLE", "VERDICTS_TABLE"]


FLAG_OVERRIDES_TABLE = TableDoc(
    name="flag_overrides",
    doc="Manual degradation-level overrides: while active, `/api/v1/flags` answers the "
    "override's level for its scope instead of the computed one.",
    facts=(
        "key: `override_id`; written by the API (token required), published to topic "
        "`<prefix>flags` as transitions when set and when they end",
        "active while `cleared_ts_ms` is null and `expires_ts_ms` is in the future",
        "retention: forever (an audit trail of who forced which level)",
    ),
    columns=(
        ("override_id", "VARCHAR NOT NULL", "unique id of this override"),
        ("scope", "VARCHAR NOT NULL", "pool or instance"),
        ("scope_id", "VARCHAR NOT NULL", "the pool name or the instance address"),
        ("pool", "VARCHAR", "pool of the scope, null if not given"),
        ("level", "TINYINT NOT NULL", "forced level, 0–3"),
        ("reason", "VARCHAR NOT NULL", "why, as given by the operator"),
        ("created_ts_ms", "BIGINT NOT NULL", "when it was set, Unix epoch ms"),
        ("expires_ts_ms", "BIGINT NOT NULL", "when it ends by itself, Unix epoch ms"),
        ("cleared_ts_ms", "BIGINT", "when it was cleared by hand, Unix epoch ms; null if not"),
    ),
    key="override_id",
)
#: In ``docs/tables.md`` order.
API_TABLES = (VERDICTS_TABLE, FLAG_OVERRIDES_TABLE)
