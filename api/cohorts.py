"""Cohorts (which requests are the canary, which the baseline) and loading their samples.

A :class:`Cohort` selects request records by instance list and/or by label columns of the
``requests`` table (``pool``, ``model``, ``tenant``, ``route``, ``tap_id``, and ``revision`` /
``cohort``, stamped by the tap), among the stream taps' records only: the synthetic
prober's (``source = 'probe'``) are no user's requests and in no cohort. A :class:`TimeRange` is a validated, bounded
``[start_ms, end_ms)`` over ``received_ts_ms``. :func:`load_samples` returns what the judge
needs: per-request latency samples and bad-event counts (records classed as the SLIs class
them by default, :mod:`slo.spec.outcomes`). All SQL is parameterised; column
names come only from the allow-list below.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api.errors import UnknownCohortError
from pipeline.errors import QueryError
from pipeline.units import DAY_MS
from slo.queries import present_tables
from slo.request_sources import source_filter
from slo.rollups import outcome_class_sql
from slo.spec.outcomes import OutcomeClasses

__all__ = [
    "LABEL_COLUMNS",
    "LATENCY_METRICS",
    "MAX_RANGE_MS",
    "PREFIX_CACHE_METRIC",
    "RATE_METRICS",
    "Cohort",
    "CohortSamples",
    "SampleOptions",
    "TimeRange",
    "cohort_exists",
    "load_samples",
    "shared_requests",
]

#: Judge metric → request-record column (seconds).
LATENCY_METRICS = {
    "ttft_s": "ttft_s",
    "tpot_s": "tpot_s",
    "itl_p99_gap_s": "itl_p99_s",
    "e2e_s": "e2e_s",
}
#: Each record's class for the judge's error rates: the default outcome classes every SLI
#: starts from (slo.spec.outcomes), so a client's 404 or cancellation is no error of the
#: canary's, while its 503s, engine errors, timeouts and interruptions are.
_CLASS = outcome_class_sql(OutcomeClasses.resolve())
_COUNTED = f"count(*) FILTER (WHERE {_CLASS} <> 'excluded')"
#: Judge metric → (SQL count of events, SQL count of the denominator). ``?`` placeholders
#: are bound in order from :meth:`SampleOptions.rate_params`.
RATE_METRICS = {
    "availability": (f"count(*) FILTER (WHERE {_CLASS} = 'good')", _COUNTED),
    "error_before_first_token_rate": (
        f"count(*) FILTER (WHERE outcome = 'error_before_first_token' AND {_CLASS} = 'bad')",
        _COUNTED,
    ),
    "interruption_rate": (
        f"count(*) FILTER (WHERE outcome = 'interrupted_after_first_token' AND {_CLASS} = 'bad')",
        _COUNTED,
    ),
    # A ghost: the engine kept generating (drain mode counted tokens) or the tap closed
    # upstream more than the grace after the client left (DESIGN §3).
    "ghost_rate": (
        "count(*) FILTER (WHERE coalesce(tokens_after_disconnect, 0) > 0"
        " OR upstream_closed_ts_ms - disconnect_ts_ms > ?)",
        "count(*)",
    ),
    # A stalled stream: one gap between token chunks of at least the stall gap.
    "stall_rate": (
        "count(*) FILTER (WHERE itl_max_s >= ?)",
        "count(*) FILTER (WHERE itl_max_s IS NOT NULL)",
    ),
}
#: The judge's engine-side metric: the canary's prefix-cache hit rate against a share of the
#: baseline's (hits / queries of the engines serving each cohort).
PREFIX_CACHE_METRIC = "prefix_cache_hit_rate"
#: Columns of ``requests`` a cohort may filter on (the only names ever put into SQL text).
LABEL_COLUMNS = ("cohort", "model", "pool", "revision", "route", "tap_id", "tenant")
#: Longest range a verdict may look at (31 days, in ms).
MAX_RANGE_MS = 31 * DAY_MS
_MAX_INSTANCES = 1024


class Cohort(BaseModel):
    """One side of a comparison: requests served by ``instances`` and/or carrying ``labels``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instances: tuple[str, ...] = Field(default=(), max_length=_MAX_INSTANCES)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("instances")
    @classmethod
    def _instances(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not 0 < len(item) <= 256 for item in value):
            raise ValueError("each instance must be 1–256 characters")
        return tuple(sorted(set(value)))

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(LABEL_COLUMNS))
        if unknown:
            raise ValueError(f"unknown label(s) {unknown}; known: {list(LABEL_COLUMNS)}")
        if any(len(item) > 256 for item in value.values()):
            raise ValueError("label values must be at most 256 characters")
        return value

    @model_validator(mode="after")
    def _not_everything(self) -> Cohort:
        if not self.instances and not self.labels:
            raise ValueError("a cohort needs instances or labels (it would select every request)")
        return self

    def describe(self) -> str:
        """Short, stable text for verdict documents, e.g. ``instances=a,b revision=r2``."""
        parts = [f"{key}={value}" for key, value in sorted(self.labels.items())]
        if self.instances:
            parts.insert(0, "instances=" + ",".join(self.instances))
        return " ".join(parts)


class TimeRange(BaseModel):
    """``[start_ms, end_ms)`` in Unix epoch ms; non-empty and at most :data:`MAX_RANGE_MS`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_ms: int = Field(ge=0)
    end_ms: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> TimeRange:
        if self.end_ms <= self.start_ms:
            raise ValueError("end must be after start")
        if self.end_ms - self.start_ms > MAX_RANGE_MS:
            raise ValueError(f"range is longer than {MAX_RANGE_MS // DAY_MS} days")
        return self


class SampleOptions(BaseModel):
    """Knobs of sample loading: the cap per side (deterministic thinning) and event rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Latency samples kept per side and metric; above it a deterministic hash-ordered subset.
    max_samples: int = Field(5_000, ge=10, le=1_000_000)
    ghost_grace_s: float = Field(2.0, ge=0.0)
    stall_gap_s: float = Field(5.0, gt=0.0)

    def rate_params(self) -> list[object]:
        """Parameters for the ``?`` of :data:`RATE_METRICS`, in its order."""
        return [int(self.ghost_grace_s * 1000), self.stall_gap_s]


@dataclass(frozen=True)
class CohortSamples:
    """What the judge reads for one side: request count, latency samples (seconds) per
    metric, and (events, total) per rate metric."""

    requests: int
    latency: dict[str, npt.NDArray[np.float64]]
    rates: dict[str, tuple[int, int]]
    #: (prefix-cache hits, queries) the engines counted over the cohort's instances in the
    #: range (tokens on vLLM ≥ 0.9 and SGLang); ``None`` without engine samples.
    prefix_cache: tuple[int, int] | None = None


def _existing_columns(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ?", ["requests"]
    ).fetchall()
    return {row[0] for row in rows}


def _where(con: duckdb.DuckDBPyConnection, cohort: Cohort) -> tuple[str, list[object]]:
    if cohort.labels:
        missing = sorted(set(cohort.labels) - _existing_columns(con))
        if missing:
            raise QueryError(
                None, f"request records carry no {missing} label yet; select by instances"
            )
    clauses = [source_filter()]  # probe records cross the entry point, not a cohort
    params: list[object] = []
    if cohort.instances:
        clauses.append("list_contains(?, instance)")
        params.append(list(cohort.instances))
    for column in sorted(cohort.labels):
        clauses.append(f"{column} = ?")  # column is from LABEL_COLUMNS (validated)
        params.append(cohort.labels[column])
    return " AND ".join(clauses), params


def cohort_exists(con: duckdb.DuckDBPyConnection, cohort: Cohort) -> bool:
    """Whether any request record, at any time, matches ``cohort``."""
    where, params = _where(con, cohort)
    return (
        con.execute(f"SELECT 1 FROM requests WHERE {where} LIMIT 1", params).fetchone() is not None
    )


def shared_requests(
    con: duckdb.DuckDBPyConnection, a: Cohort, b: Cohort, time_range: TimeRange
) -> tuple[int, str | None]:
    """How many requests received in ``time_range`` fall in both cohorts, and one of
    their instances (None when there are none)."""
    where_a, params_a = _where(con, a)
    where_b, params_b = _where(con, b)
    row = con.execute(
        "SELECT count(*), min(instance) FROM requests"
        f" WHERE received_ts_ms >= ? AND received_ts_ms < ? AND ({where_a}) AND ({where_b})",
        [time_range.start_ms, time_range.end_ms, *params_a, *params_b],
    ).fetchone()
    assert row is not None  # an aggregate always returns one row
    return int(row[0]), row[1]


def load_samples(
    con: duckdb.DuckDBPyConnection,
    cohort: Cohort,
    time_range: TimeRange,
    options: SampleOptions | None = None,
) -> CohortSamples:
    """Load ``cohort``'s samples received in ``time_range``.

    Latency samples come from successful requests only (failures are judged by the rate
    metrics); above ``max_samples`` a subset ordered by a hash of the request id is kept,
    so the same data always gives the same samples.

    Raises:
        QueryError: the cohort filters on a label the records do not carry.
        UnknownCohortError: no record at any time matches the cohort.
    """
    options = options or SampleOptions()
    where, params = _where(con, cohort)
    where = f"received_ts_ms >= ? AND received_ts_ms < ? AND {where}"
    params = [time_range.start_ms, time_range.end_ms, *params]
    rate_sql = ", ".join(f"{events}, {total}" for events, total in RATE_METRICS.values())
    rate_params = options.rate_params()
    counts = con.execute(
        f"SELECT count(*), {rate_sql} FROM requests WHERE {where}", [*rate_params, *params]
    ).fetchone()
    assert counts is not None  # an aggregate always returns one row
    if counts[0] == 0 and not cohort_exists(con, cohort):
        raise UnknownCohortError(f"no request record matches cohort {cohort.describe()!r}")
    rates = {
        name: (int(counts[1 + 2 * i]), int(counts[2 + 2 * i]))
        for i, name in enumerate(RATE_METRICS)
    }
    return CohortSamples(
        int(counts[0]),
        _latency_samples(con, where, params, options.max_samples),
        rates,
        _prefix_cache_counts(con, cohort, time_range, where, params),
    )


def _prefix_cache_counts(
    con: duckdb.DuckDBPyConnection,
    cohort: Cohort,
    time_range: TimeRange,
    where: str,
    params: list[object],
) -> tuple[int, int] | None:
    """Increase of the engines' prefix-cache hit and query counters over the instances that
    served the cohort (its instance list, else those of its requests); resets handled."""
    if "engine_samples" not in present_tables(con):
        return None
    instances = list(cohort.instances) or [
        row[0]
        for row in con.execute(
            f"SELECT DISTINCT instance FROM requests WHERE {where}", params
        ).fetchall()
    ]
    rows = con.execute(
        """
        WITH s AS (
            SELECT signal, value, value - lag(value) OVER (
                PARTITION BY instance, coalesce(engine, ''), metric, labels_json ORDER BY ts_ms
            ) AS delta
            FROM engine_samples
            WHERE ts_ms >= ? AND ts_ms < ? AND list_contains(?, instance)
              AND signal IN ('prefix_cache_hits', 'prefix_cache_queries')
        )
        SELECT signal, sum(CASE WHEN delta < 0 THEN value ELSE delta END)
        FROM s WHERE delta IS NOT NULL GROUP BY signal""",
        [time_range.start_ms, time_range.end_ms, instances],
    ).fetchall()
    counts = {signal: int(total or 0) for signal, total in rows}
    return counts.get("prefix_cache_hits", 0), counts.get("prefix_cache_queries", 0)


def _latency_samples(
    con: duckdb.DuckDBPyConnection, where: str, params: list[object], limit: int
) -> dict[str, npt.NDArray[np.float64]]:
    # One scan for every latency column; the cap is per side, shared by the metrics.
    columns = ", ".join(LATENCY_METRICS.values())
    rows = con.execute(
        f"SELECT {columns} FROM requests WHERE {where} AND outcome = 'ok'"
        " ORDER BY hash(request_id), request_id LIMIT ?",
        [*params, limit],
    ).fetchnumpy()
    samples = {}
    for name, column in LATENCY_METRICS.items():
        values = np.ma.filled(np.ma.asarray(rows[column], dtype=np.float64), np.nan)
        samples[name] = values[np.isfinite(values)]
    return samples
