"""A read of the recent raw rows that every detector shares (one query per source per cycle).

Engine samples are folded per instance and scrape: gauges ``running``/``waiting`` and every
counter are summed over engine ranks, ``kv_usage`` takes the max (never summed, DESIGN §3);
``requests_finished`` is split by its ``finished_reason`` label into
``requests_finished:<reason>``. GPU samples are keyed by the pod they are allocated to.
Request stats are the taps' (``source`` null); the prober's records (``source='probe'``)
are kept apart per entry point in ``probes``, and a gateway router's signals (dialect
``epp``) apart per gateway in ``gateways``, so neither joins a pool of engines. A
kube-state-metrics target's replica gauges are kept per HPA in ``autoscalers``, each
paired with the deployment it scales (:mod:`slo.signals._autoscalers`), never summed.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slo.request_sources import source_filter
from slo.signals._autoscalers import Autoscalers, AutoscalerSeries, load_autoscalers
from slo.signals._failures import FailureStats, load_failures, load_finished_cancels
from slo.signals._series import Series

__all__ = [
    "BUCKET_SIGNALS",
    "GATEWAY_SIGNALS",
    "RANK_SIGNALS",
    "AutoscalerSeries",
    "Autoscalers",
    "ProbeSeries",
    "RequestStats",
    "Series",
    "Snapshot",
    "TargetHealthSeries",
    "load_snapshot",
]

_SUMMED = (
    "running",
    "waiting",
    "kv_free_blocks",
    "kv_largest_free_run",
    "kv_total_blocks",
    "preemptions",
    "generation_tokens",
    "requests_aborted",
    "corrupted_requests",
    "tap_in_flight",
    "tap_disconnects",
    # P/D KV transfer, prefix locality, autoscaling (slo.signals.infra)
    "prefix_cache_queries",
    "prefix_cache_hits",
    "router_prefix_lookups",
    "router_hints_rejected",
    "kv_transfer_failures",
    "kv_transfer_expired",
    "kv_transfer_queue",
    "kv_transfer_leaked_blocks",
)
#: Histogram signals whose cumulative buckets are kept per instance (quantiles over a window).
BUCKET_SIGNALS = ("kv_transfer_time",)
_MAXED = ("kv_usage", "ready", "gauges_unchanged_s", "engine_awake")
_GPU = ("gpu_util", "engine_active", "fb_used_mib", "fb_free_mib", "xid")


@dataclass
class RequestStats:
    """Tap request records of one instance over the lookback."""

    records: int = 0
    recent_records: int = 0  # received in the second half of the lookback
    retries: int = 0  # attempt > 1
    finish_errors: int = 0
    last_token_ts_ms: int | None = None  # latest end of a record that carried tokens
    tokens_after_disconnect: int = 0
    late_upstream_close: int = 0  # upstream closed > ghost grace after the client left
    unavailable: int = 0  # attempts the engine answered 503 (not ready, model not loaded)
    completion_tokens: int = 0  # tokens served (usage, else token chunks)
    recent_completion_tokens: int = 0  # of which in the second half of the lookback
    completion_tokens_sq: float = 0.0  # Σ tokens² per request (the noise of a token count)


@dataclass(frozen=True)
class ProbeSeries:
    """One entry point's probe records (``source='probe'``), oldest first."""

    ts_ms: np.ndarray  # received_ts_ms
    ok: np.ndarray  # bool: outcome ok
    error_kind: list[str | None]  # connect_refused, http_503, read_timeout, …

    def __len__(self) -> int:
        return len(self.ts_ms)


@dataclass(frozen=True)
class TargetHealthSeries:
    """One instance's scrape outcomes (``target_health`` rows), oldest first.

    ``ready`` holds ``None`` where the scrape carried no readiness probe.
    """

    ts_ms: np.ndarray
    up: np.ndarray  # bool
    error_kind: list[str | None]
    process_start_s: list[float | None]
    counter_resets: np.ndarray
    ready: list[bool | None]
    ready_source: list[str | None]
    ready_status: list[int | None]
    models: list[int | None]

    def __len__(self) -> int:
        return len(self.ts_ms)


@dataclass
class Snapshot:
    """Recent rows of every instance, pool and GPU, as of ``now_ms``."""

    now_ms: int
    engine: dict[str, dict[str, Series]] = field(default_factory=dict)  # instance → signal → series
    pools: dict[str, str] = field(default_factory=dict)  # instance → pool
    dialects: dict[str, str] = field(default_factory=dict)  # instance → dialect
    gpu: dict[str, dict[str, Series]] = field(default_factory=dict)  # pod → signal → series
    xids: dict[str, list[int]] = field(default_factory=dict)  # pod → non-zero XID codes seen
    requests: dict[str, RequestStats] = field(default_factory=dict)  # instance → stats
    health: dict[str, TargetHealthSeries] = field(default_factory=dict)  # instance → scrapes
    latency: dict[str, dict[str, np.ndarray]] = field(
        default_factory=dict
    )  # instance → {"ttft_s", "ttft_prompt_tokens", "tpot_s", "itl_jitter_s"} of ok requests
    ranks: dict[str, dict[str, dict[str, Series]]] = field(
        default_factory=dict
    )  # instance → engine rank → signal → series (instances with more than one rank)
    probes: dict[str, ProbeSeries] = field(default_factory=dict)  # entry point → probes
    gateways: dict[str, dict[str, Series]] = field(
        default_factory=dict
    )  # gateway instance → signal (split by label, see _GATEWAY_SPLIT) → series
    buckets: dict[str, dict[str, dict[float, Series]]] = field(
        default_factory=dict
    )  # instance → histogram signal → le → cumulative count series (BUCKET_SIGNALS)
    failures: dict[str, FailureStats] = field(
        default_factory=dict
    )  # instance → tap attempts and failures in the second half of the lookback
    finished_cancels_ms: dict[str, np.ndarray] = field(
        default_factory=dict
    )  # instance → when clients hung up on streams the engine had finished (not ghosts)
    autoscalers: dict[str, Autoscalers] = field(
        default_factory=dict
    )  # kube-state-metrics instance → its HPAs, each paired with its workload (never summed)
    #: Views derived from the rows above that several detectors share (see
    #: ``slo.signals._serving.pool_baselines``), computed once per snapshot: a snapshot is read, never
    #: changed, once loaded.
    derived: dict[str, object] = field(default_factory=dict, init=False, repr=False, compare=False)

    def ago_ms(self, seconds: float) -> int:
        """The time ``seconds`` before the snapshot (ms): where a detector's window starts."""
        return self.now_ms - int(seconds * 1000)

    def series(self, instance: str, signal: str) -> Series | None:
        return self.engine.get(instance, {}).get(signal)


def _arrow(con: duckdb.DuckDBPyConnection, sql: str, params: list[object]) -> pa.Table:
    """A query's answer as an Arrow table, through ``execute``: the jobs' connection may still
    hold an unfinished result (a ``fetchone``), which ``execute`` closes and ``con.sql``
    refuses. The extra copy DuckDB warns of there is of the answer only (thousands of rows)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Arrow output on a DB-API result", UserWarning)
        table: pa.Table = con.execute(sql, params).to_arrow_table()
    return table


def _flat(table: pa.Table, column: str, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """A list column of a query's answer as one flat array of its values and each row's
    offsets into it (a null list is an empty one), without a Python object per value."""
    lists = table.column(column).combine_chunks()
    offsets = lists.offsets.to_numpy()
    flat = lists.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return flat, offsets - offsets[0]


def _by_time(ts: np.ndarray, offsets: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Flat lists (:func:`_flat`) put in time order within each list (an aggregate that
    orders its lists costs more than one sort of them all here); ties keep their order."""
    row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    if not ((np.diff(ts) < 0) & (row[1:] == row[:-1])).any():
        return (ts, *columns)
    order = np.lexsort((ts, row))
    return (ts[order], *(c[order] for c in columns))


def _engine(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    """Per instance and signal, one value per scrape (ranks summed, or maxed), as lists:
    the pool of the instance's first signal's first scrape, the dialect of its last."""
    table = _arrow(
        con,
        f"""
        WITH scrapes AS (
            SELECT instance, any_value(coalesce(pool, model, '')) AS pool,
                   any_value(dialect) AS dialect,
                   CASE WHEN signal = 'requests_finished'
                        THEN 'requests_finished:'
                             || coalesce(json_extract_string(labels_json, '$.finished_reason'), '')
                        ELSE signal END AS sig,
                   ts_ms,
                   CASE WHEN signal IN ({", ".join(repr(s) for s in _MAXED)})
                        THEN max(value) ELSE sum(value) END AS value
            FROM engine_samples
            WHERE ts_ms >= ? AND ts_ms <= ? AND kind IN ('gauge', 'counter')
              AND signal IN ({", ".join(repr(s) for s in (*_SUMMED, *_MAXED, "requests_finished"))})
            GROUP BY instance, sig, ts_ms, signal
        )
        SELECT instance, sig, arg_min(pool, ts_ms) AS pool,
               arg_max(dialect, ts_ms) FILTER (WHERE dialect <> '' AND dialect <> 'tap')
                   AS dialect,
               list(ts_ms) AS ts, list(value) AS "values"
        FROM scrapes GROUP BY instance, sig ORDER BY instance, sig
        """,
        [start_ms, snap.now_ms],
    )
    ts, offsets = _flat(table, "ts", np.int64)
    values, _ = _flat(table, "values", np.float64)
    ts, values = _by_time(ts, offsets, values)
    keys = zip(
        *(table.column(c).to_pylist() for c in ("instance", "sig", "pool", "dialect")), strict=True
    )
    for row, (instance, sig, pool, dialect) in enumerate(keys):
        snap.pools.setdefault(instance, pool or "")
        if dialect:
            snap.dialects[instance] = dialect
        a, b = offsets[row], offsets[row + 1]
        snap.engine.setdefault(instance, {})[sig] = Series(ts[a:b], values[a:b])


def _buckets(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    rows = con.execute(
        f"""
        SELECT instance, signal, le, ts_ms, sum(value)
        FROM engine_samples
        WHERE ts_ms >= ? AND ts_ms <= ? AND kind = 'bucket' AND le IS NOT NULL
          AND signal IN ({", ".join(repr(s) for s in BUCKET_SIGNALS)})
        GROUP BY ALL ORDER BY instance, signal, le, ts_ms
        """,
        [start_ms, snap.now_ms],
    ).fetchall()
    grouped: dict[tuple[str, str, float], tuple[list[int], list[float]]] = defaultdict(
        lambda: ([], [])
    )
    for instance, signal, le, ts, value in rows:
        grouped[(instance, signal, float(le))][0].append(ts)
        grouped[(instance, signal, float(le))][1].append(value)
    for (instance, signal, le), (ts_list, values) in grouped.items():
        per_signal = snap.buckets.setdefault(instance, {}).setdefault(signal, {})
        per_signal[le] = Series(np.array(ts_list, np.int64), np.array(values))


def _gpu(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    rows = con.execute(
        f"""
        SELECT pod, signal, ts_ms, CASE WHEN signal = 'xid' THEN max(value) ELSE avg(value) END
        FROM gpu_samples
        WHERE ts_ms >= ? AND ts_ms <= ? AND pod IS NOT NULL
          AND signal IN ({", ".join(repr(s) for s in _GPU)})
        GROUP BY pod, signal, ts_ms ORDER BY pod, signal, ts_ms
        """,
        [start_ms, snap.now_ms],
    ).fetchall()
    grouped: dict[tuple[str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for pod, signal, ts, value in rows:
        grouped[(pod, signal)][0].append(ts)
        grouped[(pod, signal)][1].append(value)
    for (pod, signal), (ts_list, values) in grouped.items():
        snap.gpu.setdefault(pod, {})[signal] = Series(np.array(ts_list, np.int64), np.array(values))
        if signal == "xid":
            snap.xids[pod] = sorted({int(v) for v in values if v > 0})


def _requests(
    con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int, ghost_grace_ms: int
) -> None:
    half = (start_ms + snap.now_ms) // 2
    rows = con.execute(
        f"""
        SELECT instance, any_value(coalesce(pool, model, '')), count(*),
               count(*) FILTER (WHERE received_ts_ms >= ?),
               count(*) FILTER (WHERE attempt > 1),
               count(*) FILTER (WHERE finish_reason = 'error'),
               max(received_ts_ms + CAST(e2e_s * 1000 AS BIGINT))
                   FILTER (WHERE coalesce(token_chunks, 0) > 0),
               coalesce(sum(tokens_after_disconnect), 0),
               count(*) FILTER (WHERE upstream_closed_ts_ms - disconnect_ts_ms > ?),
               count(*) FILTER (WHERE upstream_status = 503 OR http_status = 503),
               coalesce(sum(coalesce(completion_tokens, token_chunks, 0)), 0),
               coalesce(sum(coalesce(completion_tokens, token_chunks, 0))
                   FILTER (WHERE received_ts_ms >= ?), 0),
               coalesce(sum(power(coalesce(completion_tokens, token_chunks, 0), 2)), 0)
        FROM requests WHERE received_ts_ms >= ? AND received_ts_ms <= ?
          AND {source_filter()}
        GROUP BY instance
        """,
        [half, ghost_grace_ms, half, start_ms, snap.now_ms],
    ).fetchall()
    for row in rows:
        instance, pool, n, recent, retries, errors, last_token, after, late = row[:9]
        unavailable, tokens, recent_tokens, tokens_sq = row[9:]
        snap.pools.setdefault(instance, pool or "")
        snap.requests[instance] = RequestStats(
            n,
            recent,
            retries,
            errors,
            None if last_token is None else int(last_token),
            int(after),
            late,
            int(unavailable),
            int(tokens),
            int(recent_tokens),
            float(tokens_sq),
        )


#: The tap's own samples (one series per tap process, ``tap_id`` label) and how long a tap
#: that stopped publishing still counts: past this its in-flight streams are gone.
_TAP_SIGNALS = ("tap_in_flight", "tap_disconnects")
_TAP_STALE_MS = 30_000


def _combine_taps(taps: list[Series], gauge: bool) -> Series:
    """Several taps in front of one instance publish at their own moments: their sum at
    every moment any of them published, from when all had (each tap's latest value; a
    gauge older than ``_TAP_STALE_MS`` counts 0, a counter keeps its last value)."""
    first = max(int(s.ts_ms[0]) for s in taps)
    ts = np.unique(np.concatenate([s.ts_ms for s in taps]))
    ts = ts[ts >= first]
    total = np.zeros(len(ts))
    for series in taps:
        latest = np.searchsorted(series.ts_ms, ts, side="right") - 1
        values = series.values[latest]
        if gauge:
            values = np.where(ts - series.ts_ms[latest] <= _TAP_STALE_MS, values, 0.0)
        total += values
    return Series(ts, total)


def _taps(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    """Replace the per-timestamp sums of tap signals by :func:`_combine_taps` where more
    than one tap reports an instance (their samples rarely share a timestamp)."""
    rows = con.execute(
        f"""
        SELECT instance, signal, coalesce(json_extract_string(labels_json, '$.tap_id'), ''),
               list(ts_ms ORDER BY ts_ms), list(value ORDER BY ts_ms)
        FROM engine_samples
        WHERE ts_ms >= ? AND ts_ms <= ? AND dialect = 'tap'
          AND signal IN ({", ".join(repr(s) for s in _TAP_SIGNALS)})
        GROUP BY ALL
        """,
        [start_ms, snap.now_ms],
    ).fetchall()
    per_instance: dict[tuple[str, str], list[Series]] = defaultdict(list)
    for instance, signal, _tap, ts, values in rows:
        per_instance[(instance, signal)].append(
            Series(np.array(ts, np.int64), np.array(values, float))
        )
    for (instance, signal), taps in per_instance.items():
        if len(taps) > 1:
            combined = _combine_taps(taps, gauge=signal == "tap_in_flight")
            snap.engine.setdefault(instance, {})[signal] = combined


#: Per-rank signals kept for rank skew (hot DP rank): throughput and queue.
RANK_SIGNALS = ("generation_tokens", "running", "waiting")


def _ranks(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    rows = con.execute(
        f"""
        WITH multi AS (
            SELECT instance FROM engine_samples
            WHERE ts_ms >= ? AND ts_ms <= ? AND coalesce(engine, '') <> ''
              AND signal IN ({", ".join(repr(s) for s in RANK_SIGNALS)})
            GROUP BY instance HAVING count(DISTINCT engine) > 1
        )
        SELECT instance, engine, signal, ts_ms, sum(value)
        FROM engine_samples
        WHERE ts_ms >= ? AND ts_ms <= ? AND instance IN (SELECT instance FROM multi)
          AND kind IN ('gauge', 'counter')
          AND signal IN ({", ".join(repr(s) for s in RANK_SIGNALS)})
        GROUP BY ALL ORDER BY instance, engine, signal, ts_ms
        """,
        [start_ms, snap.now_ms, start_ms, snap.now_ms],
    ).fetchall()
    grouped: dict[tuple[str, str, str], tuple[list[int], list[float]]] = defaultdict(
        lambda: ([], [])
    )
    for instance, rank, signal, ts, value in rows:
        grouped[(instance, rank, signal)][0].append(ts)
        grouped[(instance, rank, signal)][1].append(value)
    for (instance, rank, signal), (ts_list, values) in grouped.items():
        per_rank = snap.ranks.setdefault(instance, {}).setdefault(rank, {})
        per_rank[signal] = Series(np.array(ts_list, np.int64), np.array(values))


def _latency(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    table = _arrow(
        con,
        f"""
        SELECT instance, list(ttft_s) FILTER (WHERE ttft_s IS NOT NULL) AS ttft_s,
               list(coalesce(prompt_tokens, -1)) FILTER (WHERE ttft_s IS NOT NULL)
                   AS ttft_prompt_tokens,  -- -1: not reported
               list(tpot_s) FILTER (WHERE tpot_s IS NOT NULL) AS tpot_s,
               list(itl_jitter_s) FILTER (
                   WHERE itl_jitter_s IS NOT NULL AND NOT coalesce(itl_uncertain, false))
                   AS itl_jitter_s
        FROM requests
        WHERE received_ts_ms >= ? AND received_ts_ms <= ? AND outcome = 'ok'
          AND {source_filter()}
        GROUP BY instance
        """,
        [start_ms, snap.now_ms],
    )
    names = ("ttft_s", "ttft_prompt_tokens", "tpot_s", "itl_jitter_s")
    columns = {name: _flat(table, name, np.float64) for name in names}
    for row, instance in enumerate(table.column("instance").to_pylist()):
        snap.latency[instance] = {
            name: flat[offsets[row] : offsets[row + 1]] for name, (flat, offsets) in columns.items()
        }


def _health(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    table = _arrow(
        con,
        """
        SELECT instance, pool, ts_ms, up, error_kind, process_start_s,
               coalesce(counter_resets, 0) AS counter_resets, ready, ready_source,
               ready_status, models
        FROM target_health
        WHERE ts_ms >= ? AND ts_ms <= ?
        ORDER BY instance, ts_ms
        """,
        [start_ms, snap.now_ms],
    )
    if not table.num_rows:
        return
    instances = pc.dictionary_encode(table.column("instance")).combine_chunks()
    codes = instances.indices.to_numpy()
    starts = np.flatnonzero(np.diff(codes, prepend=-1) != 0)
    ends = np.append(starts[1:], len(codes))
    # a pool: the first one the instance's scrapes name (any_value), none if none does
    named = np.flatnonzero(table.column("pool").is_valid().to_numpy(zero_copy_only=False))
    first_named = np.searchsorted(named, starts)
    pools = table.column("pool").to_pylist()
    ts = table.column("ts_ms").to_numpy().astype(np.int64)
    up = table.column("up").to_numpy(zero_copy_only=False).astype(bool)
    resets = table.column("counter_resets").to_numpy().astype(np.int64)
    listed = {
        name: table.column(name).to_pylist()
        for name in ("error_kind", "process_start_s", "ready", "ready_source", "ready_status")
    }
    models = table.column("models").to_pylist()
    names = instances.dictionary.to_pylist()
    for a, b, f in zip(starts.tolist(), ends.tolist(), first_named.tolist(), strict=True):
        instance = names[codes[a]]
        pool = pools[named[f]] if f < len(named) and named[f] < b else None
        if pool:
            snap.pools.setdefault(instance, pool)
        snap.health[instance] = TargetHealthSeries(
            ts[a:b],
            up[a:b],
            listed["error_kind"][a:b],
            listed["process_start_s"][a:b],
            resets[a:b],
            listed["ready"][a:b],
            listed["ready_source"][a:b],
            listed["ready_status"][a:b],
            models[a:b],
        )


#: Signals of a gateway router (collector dialect ``epp``), and the labels that split them.
GATEWAY_SIGNALS = ("router_up", "pool_ready_pods", "gateway_queue", "gateway_requests")
_GATEWAY_SPLIT = {
    "gateway_answers": ("code", "reason"),  # gateway_answers:503:router_unavailable
    "gateway_request_errors": ("error_code",),  # gateway_request_errors:ServiceUnavailable
    "gateway_decisions": ("mode",),  # gateway_decisions:fail_open
}


def _gateways(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    split = " ".join(
        f"WHEN {signal!r} THEN {signal!r} || "
        + " || ".join(
            f"':' || coalesce(json_extract_string(labels_json, '$.{k}'), '')" for k in keys
        )
        for signal, keys in _GATEWAY_SPLIT.items()
    )
    names = ", ".join(repr(s) for s in (*GATEWAY_SIGNALS, *_GATEWAY_SPLIT))
    rows = con.execute(
        f"""
        SELECT instance, any_value(coalesce(pool, model, '')),
               CASE signal {split} ELSE signal END AS sig, ts_ms, sum(value)
        FROM engine_samples
        WHERE ts_ms >= ? AND ts_ms <= ? AND kind IN ('gauge', 'counter') AND signal IN ({names})
        GROUP BY instance, sig, ts_ms ORDER BY instance, sig, ts_ms
        """,
        [start_ms, snap.now_ms],
    ).fetchall()
    grouped: dict[tuple[str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for instance, pool, sig, ts, value in rows:
        snap.pools.setdefault(instance, pool or "")
        grouped[(instance, sig)][0].append(ts)
        grouped[(instance, sig)][1].append(value)
    for (instance, sig), (ts_list, values) in grouped.items():
        snap.gateways.setdefault(instance, {})[sig] = Series(
            np.array(ts_list, np.int64), np.array(values)
        )


def _probes(con: duckdb.DuckDBPyConnection, snap: Snapshot, start_ms: int) -> None:
    rows = con.execute(
        f"""
        SELECT instance, any_value(coalesce(pool, model, '')),
               list(received_ts_ms ORDER BY received_ts_ms),
               list(outcome = 'ok' ORDER BY received_ts_ms),
               list(error_kind ORDER BY received_ts_ms)
        FROM requests
        WHERE received_ts_ms >= ? AND received_ts_ms <= ? AND {source_filter("probe")}
        GROUP BY instance
        """,
        [start_ms, snap.now_ms],
    ).fetchall()
    for instance, pool, ts, ok, kinds in rows:
        snap.pools.setdefault(instance, pool or "")
        snap.probes[instance] = ProbeSeries(np.array(ts, np.int64), np.array(ok, bool), kinds)


def load_snapshot(
    con: duckdb.DuckDBPyConnection, now_ms: int, lookback_ms: int, ghost_grace_ms: int = 2_000
) -> Snapshot:
    """Everything detectors need from the last ``lookback_ms`` before ``now_ms``."""
    snap = Snapshot(now_ms)
    start = now_ms - lookback_ms
    _engine(con, snap, start)
    _taps(con, snap, start)
    _gpu(con, snap, start)
    _requests(con, snap, start, ghost_grace_ms)
    _ranks(con, snap, start)
    _latency(con, snap, start)
    _health(con, snap, start)
    _gateways(con, snap, start)
    _probes(con, snap, start)
    _buckets(con, snap, start)
    # the recent half only: a failure finding clears within half a lookback once they stop
    snap.failures = load_failures(con, (start + now_ms) // 2, now_ms)
    snap.finished_cancels_ms = load_finished_cancels(con, start, now_ms)
    snap.autoscalers = load_autoscalers(con, start, now_ms)
    for instance, scalers in snap.autoscalers.items():
        snap.pools.setdefault(instance, scalers.pool)
    return snap
