"""The ``verdicts`` table: every computed canary verdict with its per-metric evidence.

Its Arrow schema with documented columns is here (rows are bound to it); the table itself
is declared with the API's other tables in :mod:`api.tables`. :class:`VerdictStore` creates the
table, stores verdicts and reads them back for the history endpoint and for idempotent
Flagger retries (``idempotency_key``). All SQL is parameterised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from pipeline.store import duckdb_type
from pipeline.tables import TableDoc

__all__ = ["HISTORY_SCHEMA", "VERDICTS", "VERDICTS_TABLE", "StoredVerdict", "VerdictStore"]


def _field(name: str, type_: pa.DataType, doc: str, *, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


VERDICTS = pa.schema(
    [
        _field("verdict_id", pa.string(), "unique id of this verdict", nullable=False),
        _field(
            "idempotency_key",
            pa.string(),
            "hash of gate, Flagger checksum, parameters and recompute bucket; null when none",
        ),
        _field(
            "evaluated_ts_ms", pa.int64(), "when it was computed, Unix epoch ms", nullable=False
        ),
        _field("source", pa.string(), "argo (document mode) or flagger/<gate>", nullable=False),
        _field("namespace", pa.string(), "subject namespace as given, null if none"),
        _field("service", pa.string(), "subject service / Flagger canary name, null if none"),
        _field(
            "canary", pa.string(), "canary cohort, e.g. instances=a,b revision=r2", nullable=False
        ),
        _field("baseline", pa.string(), "baseline cohort", nullable=False),
        _field(
            "window_start_ts_ms", pa.int64(), "judged range start, Unix epoch ms", nullable=False
        ),
        _field(
            "window_end_ts_ms",
            pa.int64(),
            "judged range end (exclusive), Unix epoch ms",
            nullable=False,
        ),
        _field("verdict", pa.string(), "pass, fail or inconclusive", nullable=False),
        _field("score", pa.float64(), "weighted score 0–100", nullable=False),
        _field("reason", pa.string(), "why, in words", nullable=False),
        _field(
            "canary_requests", pa.int64(), "requests of the canary in the range", nullable=False
        ),
        _field(
            "baseline_requests", pa.int64(), "requests of the baseline in the range", nullable=False
        ),
        _field(
            "document_json",
            pa.string(),
            "the full verdict document with per-metric evidence (JSON)",
            nullable=False,
        ),
    ]
)
_COLUMNS = [field.name for field in VERDICTS]


def _verdict_columns() -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (
            f.name,
            duckdb_type(f.type) + ("" if f.nullable else " NOT NULL"),
            f.metadata[b"doc"].decode(),
        )
        for f in VERDICTS
    )


VERDICTS_TABLE = TableDoc(
    name="verdicts",
    doc="Every canary verdict the API computed (Argo `web` provider, Flagger webhooks), "
    "with its per-metric evidence.",
    facts=(
        "key: `verdict_id`; written by the API (`llmslo run`, or `llmslo api --db FILE` "
        "unless `--read-only`)",
        "retention: forever (one row per verdict)",
    ),
    columns=_verdict_columns(),
    key="verdict_id",
)
#: A verdict-history row without its document (``GET /api/v1/verdicts`` ``data`` / Arrow).
HISTORY_SCHEMA = pa.schema([field for field in VERDICTS if field.name != "document_json"])


@dataclass(frozen=True)
class StoredVerdict:
    """One row of ``verdicts``; ``document`` is the parsed ``document_json``."""

    verdict_id: str
    verdict: str
    evaluated_ts_ms: int
    source: str
    document: dict[str, Any]


class VerdictStore:
    """Reads and writes ``verdicts`` through a DuckDB connection or cursor the caller owns."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def migrate(self) -> None:
        """Create the table if missing (idempotent)."""
        VERDICTS_TABLE.create(self.con)

    def insert(self, row: dict[str, Any]) -> None:
        """Store one verdict; ``row`` has every column of :data:`VERDICTS`."""
        placeholders = ", ".join("?" * len(_COLUMNS))
        self.con.execute(
            f"INSERT INTO verdicts ({', '.join(_COLUMNS)}) VALUES ({placeholders})",
            [row[name] for name in _COLUMNS],
        )

    def by_idempotency_key(self, key: str) -> StoredVerdict | None:
        """The verdict stored under ``key``, if any (the first one)."""
        rows = self._select("WHERE idempotency_key = ? ORDER BY evaluated_ts_ms LIMIT 1", [key])
        return rows[0] if rows else None

    def by_id(self, verdict_id: str) -> StoredVerdict | None:
        """One verdict by id, or None."""
        rows = self._select("WHERE verdict_id = ?", [verdict_id])
        return rows[0] if rows else None

    def history(
        self, limit: int, service: str | None = None, verdict: str | None = None
    ) -> list[StoredVerdict]:
        """Newest first, at most ``limit``, optionally of one service and/or verdict."""
        tail, params = self._history_tail(limit, service, verdict)
        return self._select(tail, params)

    def history_table(
        self, limit: int, service: str | None = None, verdict: str | None = None
    ) -> pa.Table:
        """The same rows as :meth:`history` as a table of :data:`HISTORY_SCHEMA` (every
        column but the document), for the dashboards (JSON rows or Arrow)."""
        tail, params = self._history_tail(limit, service, verdict)
        columns = ", ".join(HISTORY_SCHEMA.names)
        table: pa.Table = self.con.sql(
            f"SELECT {columns} FROM verdicts {tail}", params=params
        ).to_arrow_table()
        return table.cast(HISTORY_SCHEMA)

    @staticmethod
    def _history_tail(
        limit: int, service: str | None, verdict: str | None
    ) -> tuple[str, list[object]]:
        clauses, params = ["true"], list[object]()
        if service is not None:
            clauses.append("service = ?")
            params.append(service)
        if verdict is not None:
            clauses.append("verdict = ?")
            params.append(verdict)
        where = " AND ".join(clauses)
        return f"WHERE {where} ORDER BY evaluated_ts_ms DESC, verdict_id LIMIT ?", [*params, limit]

    def count(self) -> int:
        """Number of stored verdicts."""
        row = self.con.execute("SELECT count(*) FROM verdicts").fetchone()
        return int(row[0]) if row else 0

    def _select(self, tail: str, params: list[object]) -> list[StoredVerdict]:
        rows = self.con.execute(
            f"SELECT verdict_id, verdict, evaluated_ts_ms, source, document_json FROM verdicts {tail}",
            params,
        ).fetchall()
        return [StoredVerdict(r[0], r[1], int(r[2]), r[3], json.loads(r[4])) for r in rows]
