"""The SLO engine's own DuckDB tables, declared once: DDL, column comments, documentation.

:mod:`slo.rollups.counts` creates the rollup tables, :mod:`slo.sinks` the jobs' outputs, both
from these declarations; ``llmslo tables`` renders them into ``docs/tables.md`` after the
spine's tables; :mod:`slo.queries` reads them.
"""

from __future__ import annotations

from pipeline.tables import TableDoc

__all__ = [
    "DOCUMENTED_TABLES",
    "DRILLS",
    "OUTPUT_TABLES",
    "REQUEST_HOUR",
    "REQUEST_LATENCY_HOUR",
    "REQUEST_LATENCY_MINUTE",
    "REQUEST_LATENCY_POOL_HOUR",
    "REQUEST_MINUTE",
    "REQUEST_ROLLUP_STATE",
    "REQUEST_ROLLUP_TABLES",
    "ROLLUP_TABLES",
    "SLO_DAY",
    "SLO_FINDINGS",
    "SLO_HOUR",
    "SLO_KEYS",
    "SLO_MINUTE",
    "SLO_ROLLUP_STATE",
    "SLO_STATUS_CURRENT",
    "SLO_TABLES",
]


def _counts(grain: str) -> tuple[tuple[str, str, str], ...]:
    return (
        ("slo_id", "VARCHAR NOT NULL", "the SLO (service-name), see slo_keys"),
        ("key_id", "BIGINT NOT NULL", "the SLO × group, see slo_keys"),
        ("ts_ms", "BIGINT NOT NULL", f"{grain} start, Unix epoch ms"),
        ("total", "BIGINT NOT NULL", f"events of the SLI in that {grain} (client requests)"),
        ("bad", "BIGINT NOT NULL", f"bad events of the SLI in that {grain}"),
    )


SLO_KEYS = TableDoc(
    name="slo_keys",
    doc="The integer key of one SLO × (pool, instance, tenant, route) group.",
    facts=(
        "key: `key_id`; written by the SLO jobs (rollup)",
        "retention: forever (one row per group)",
    ),
    columns=(
        ("key_id", "BIGINT NOT NULL", "hash of the five other columns"),
        ("slo_id", "VARCHAR NOT NULL", "the SLO (service-name)"),
        ("pool", "VARCHAR NOT NULL", "serving pool, '' unless the SLO groups by it"),
        ("instance", "VARCHAR NOT NULL", "engine instance, '' unless the SLO groups by it"),
        ("tenant", "VARCHAR NOT NULL", "tenant, '' unless the SLO groups by it"),
        ("route", "VARCHAR NOT NULL", "API route, '' unless the SLO groups by it"),
    ),
    key="key_id",
)
SLO_MINUTE = TableDoc(
    name="slo_minute",
    doc="Good/bad event counts per SLO group and minute that had events, recomputed from raw rows.",
    facts=(
        "key: (`key_id`, `ts_ms`); written by the SLO jobs (rollup), idempotently",
        "retention: `slo.minute_retention_days` (default 35 d)",
    ),
    columns=_counts("minute"),
)
SLO_HOUR = TableDoc(
    name="slo_hour",
    doc="The same counts summed per hour, so a 30-day window reads ~720 rows per group.",
    facts=("key: (`key_id`, `ts_ms`); written by the SLO jobs (rollup)", "retention: forever"),
    columns=_counts("hour"),
)
SLO_DAY = TableDoc(
    name="slo_day",
    doc="The same counts summed per UTC day, so a 30-day window reads ~30 rows per group.",
    facts=("key: (`key_id`, `ts_ms`); written by the SLO jobs (rollup)", "retention: forever"),
    columns=_counts("day"),
)
SLO_ROLLUP_STATE = TableDoc(
    name="slo_rollup_state",
    doc="Per SLO, the definition its rollups were built with and how far they reach.",
    facts=("key: `slo_id`; written by the SLO jobs (rollup)", "retention: forever"),
    columns=(
        ("slo_id", "VARCHAR NOT NULL", "the SLO (service-name)"),
        (
            "fingerprint",
            "VARCHAR NOT NULL",
            "hash of SLI, selector and group_by; a change rebuilds",
        ),
        ("watermark_ts_ms", "BIGINT NOT NULL", "rollups are complete before this, Unix epoch ms"),
    ),
    key="slo_id",
)
SLO_FINDINGS = TableDoc(
    name="slo_findings",
    doc="A failure signal (stall, ghost requests, KV pressure, …) that started or ended, with its evidence.",
    facts=("key: none (append-only); written by the SLO jobs", "retention: forever (small)"),
    columns=(
        ("ts_ms", "BIGINT NOT NULL", "evaluation time at which it started or ended, Unix epoch ms"),
        ("state", "VARCHAR NOT NULL", "firing or resolved"),
        (
            "signal",
            "VARCHAR NOT NULL",
            "detector name, e.g. stall, ghost_requests, preemption_cascade",
        ),
        ("scope", "VARCHAR NOT NULL", "instance or pool"),
        ("scope_id", "VARCHAR NOT NULL", "the instance address or pool name"),
        ("pool", "VARCHAR", "pool of the scope"),
        ("severity", "VARCHAR", "page, ticket or info"),
        ("basis", "VARCHAR", "what the finding rests on (e.g. block_stats or signature)"),
        ("evidence_json", "VARCHAR", "supporting samples and thresholds as sorted-key JSON"),
    ),
)
SLO_STATUS_CURRENT = TableDoc(
    name="slo_status_current",
    doc="The status of every SLO group at the last evaluation, replaced each cycle.",
    facts=(
        "key: (`slo_id`, `group_json`); written by the SLO jobs, replaced in one transaction",
        "retention: the last cycle only",
    ),
    columns=(
        ("slo_id", "VARCHAR NOT NULL", "the SLO (service-name)"),
        ("group_json", "VARCHAR NOT NULL", "the group's dimensions as sorted-key JSON"),
        ("ts_ms", "BIGINT NOT NULL", "evaluation time, Unix epoch ms"),
        (
            "status_json",
            "VARCHAR NOT NULL",
            "budget, burn rates and alert pairs (as `slo report --json`)",
        ),
    ),
)


def _request_counts(grain: str) -> tuple[tuple[str, str, str], ...]:
    return (
        ("ts_ms", "BIGINT NOT NULL", f"{grain} start (of `received_ts_ms`), Unix epoch ms"),
        ("pool", "VARCHAR", "serving pool of the attempts"),
        ("instance", "VARCHAR", "engine instance of the attempts"),
        ("address", "VARCHAR", "host:port of the instance (as `requests.address`)"),
        ("outcome", "VARCHAR", "outcome of the attempts (see `requests.outcome`)"),
        ("attempts", "BIGINT NOT NULL", "request records (attempts)"),
        (
            "requests",
            "BIGINT NOT NULL",
            "client requests (`original_request_id`) whose first attempt with this outcome on this instance is here",
        ),
        (
            "pool_requests",
            "BIGINT NOT NULL",
            "client requests whose first attempt with this outcome in this pool is here",
        ),
    )


def _request_latency(grain: str) -> tuple[tuple[str, str, str], ...]:
    return (
        ("ts_ms", "BIGINT NOT NULL", f"{grain} start (of `received_ts_ms`), Unix epoch ms"),
        ("pool", "VARCHAR", "serving pool"),
        ("instance", "VARCHAR", "engine instance"),
        (
            "metric",
            "VARCHAR NOT NULL",
            "ttft, tpot, e2e (one value per attempt) or itl (every gap)",
        ),
        (
            "bin",
            "SMALLINT NOT NULL",
            "log bin i: values in (γ^(i−1), γ^i] seconds, γ = 1.01/0.99 (slo.rollups.requests)",
        ),
        ("samples", "BIGINT NOT NULL", "values in the bin"),
        ("sum_s", "DOUBLE NOT NULL", "their sum, seconds (exact means)"),
        ("max_s", "DOUBLE NOT NULL", "their maximum, seconds"),
    )


REQUEST_MINUTE = TableDoc(
    name="request_minute",
    doc=(
        "Attempts and client requests per minute × pool × instance × outcome, recomputed from "
        "the taps' `requests` (user traffic: probe records, `source = 'probe'`, are left out)."
    ),
    facts=(
        "key: none (`ts_ms`, `pool`, `instance`, `address`, `outcome` unique); written by the "
        "SLO jobs and "
        "`llmslo sim history`, idempotently",
        "retention: `slo.minute_retention_days` (default 35 d)",
    ),
    columns=_request_counts("minute"),
)
REQUEST_HOUR = TableDoc(
    name="request_hour",
    doc="`request_minute` summed per hour (long ranges read ~720 rows per instance and outcome).",
    facts=("key: as `request_minute`; written with it", "retention: forever"),
    columns=_request_counts("hour"),
)
REQUEST_LATENCY_MINUTE = TableDoc(
    name="request_latency_minute",
    doc=(
        "TTFT / TPOT / E2E / ITL of tap records (not probe records) as fixed log-bin histograms "
        "per minute × pool × instance: percentiles over any range are a sum of bins (relative "
        "error ≤ 1 %)."
    ),
    facts=(
        "key: none (`ts_ms`, `pool`, `instance`, `metric`, `bin` unique); written by the SLO "
        "jobs and `llmslo sim history`, idempotently",
        "retention: `slo.minute_retention_days` (default 35 d)",
    ),
    columns=_request_latency("minute"),
)
REQUEST_LATENCY_HOUR = TableDoc(
    name="request_latency_hour",
    doc="`request_latency_minute` summed per hour, once the hour is wholly settled.",
    facts=(
        "key: as `request_latency_minute`; written with it for settled hours only (reads "
        "take the unsettled tail raw)",
        "retention: forever",
    ),
    columns=_request_latency("hour"),
)
REQUEST_LATENCY_POOL_HOUR = TableDoc(
    name="request_latency_pool_hour",
    doc=(
        "`request_latency_hour` summed over the instances of each pool: a 30-day pool band "
        "reads ~10⁵ rows instead of ~10⁷."
    ),
    facts=(
        "key: none (`ts_ms`, `pool`, `metric`, `bin` unique); written with it (settled hours only)",
        "retention: forever",
    ),
    columns=tuple(c for c in _request_latency("hour") if c[0] != "instance"),
)
REQUEST_ROLLUP_STATE = TableDoc(
    name="request_rollup_state",
    doc="How far the request rollups reach: one row; reads take raw `requests` outside it.",
    facts=("key: none (one row); written with the request rollups", "retention: forever"),
    columns=(
        ("version", "INTEGER NOT NULL", "bin layout and event rules; another version rebuilds"),
        ("start_ts_ms", "BIGINT NOT NULL", "first minute rolled up, Unix epoch ms"),
        (
            "settled_ts_ms",
            "BIGINT NOT NULL",
            "minutes before this are final (watermark − settle); reads take raw rows after it",
        ),
        ("watermark_ts_ms", "BIGINT NOT NULL", "minutes before this are rolled up, Unix epoch ms"),
    ),
)
#: Tables of the request rollup (:mod:`slo.rollups.requests`), by name.
REQUEST_ROLLUP_TABLES: dict[str, TableDoc] = {
    t.name: t
    for t in (
        REQUEST_MINUTE,
        REQUEST_HOUR,
        REQUEST_LATENCY_MINUTE,
        REQUEST_LATENCY_HOUR,
        REQUEST_LATENCY_POOL_HOUR,
        REQUEST_ROLLUP_STATE,
    )
}

#: Tables of the rollup, by name.
ROLLUP_TABLES: dict[str, TableDoc] = {
    t.name: t for t in (SLO_KEYS, SLO_MINUTE, SLO_HOUR, SLO_DAY, SLO_ROLLUP_STATE)
}
#: Tables the jobs write besides the rollups, by name.
OUTPUT_TABLES: dict[str, TableDoc] = {t.name: t for t in (SLO_FINDINGS, SLO_STATUS_CURRENT)}
#: Every table of this package, in documentation order.
SLO_TABLES: tuple[TableDoc, ...] = (*ROLLUP_TABLES.values(), *OUTPUT_TABLES.values())

#: ``llmslo drill`` results, one row per mode per drill run (the healthy control: mode ``healthy``).
DRILLS = TableDoc(
    name="drills",
    doc="One failure mode of one `llmslo drill` run: detected or not, by what, how fast, cleared; false positives.",
    facts=(
        "key: (`run_ts_ms`, `mode`); written by `llmslo drill --db`, appended per run",
        "retention: forever (small)",
    ),
    columns=(
        ("run_ts_ms", "BIGINT NOT NULL", "when the drill run started, Unix epoch ms"),
        ("mode", "VARCHAR NOT NULL", "failure mode (llmslo.drill.modes.MODES), or healthy"),
        ("fleet", "VARCHAR NOT NULL", "the simulated fleet it ran in"),
        ("instance", "VARCHAR", "the faulted instance (NULL for healthy or pool-wide)"),
        ("fault", "VARCHAR", "simulator fault set (NULL: the load shape alone)"),
        ("injected_ts_ms", "BIGINT", "fault set, Unix epoch ms"),
        ("removed_ts_ms", "BIGINT", "fault removed, Unix epoch ms"),
        ("detected", "BOOLEAN", "an expected signal or flag fired after injection"),
        (
            "detected_by",
            "VARCHAR",
            "the expected signals / flag levels that fired, comma-separated",
        ),
        ("detect_s", "DOUBLE", "injection to first detection, seconds"),
        ("first_finding_s", "DOUBLE", "injection to first expected finding, seconds"),
        ("first_flag_s", "DOUBLE", "injection to first flag rise (when a flag counts), seconds"),
        ("first_alert_s", "DOUBLE", "injection to first Alertmanager alert, seconds (NULL: none)"),
        ("clear_s", "DOUBLE", "removal to everything cleared, seconds (NULL: not cleared)"),
        ("other_signals", "VARCHAR", "other signals on the faulted instance, comma-separated"),
        ("false_positives", "INTEGER NOT NULL", "findings/flags on healthy instances of its fleet"),
        ("profile_json", "VARCHAR NOT NULL", "the drill profile (timings) as sorted-key JSON"),
    ),
    key="run_ts_ms, mode",
)

#: What ``docs/tables.md`` documents after the spine's tables: this package's, the request
#: rollups and ``drills``.
DOCUMENTED_TABLES: tuple[TableDoc, ...] = (*SLO_TABLES, *REQUEST_ROLLUP_TABLES.values(), DRILLS)
