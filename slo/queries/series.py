"""Raw-series reads: engine and GPU signals per time bucket (re-exported by :mod:`slo.queries`).

Both read the collectors' raw tables (``engine_samples``, ``gpu_samples``) on the same grid
and filters as the rest of :mod:`slo.queries`: ``[start_ms, end_ms)`` in Unix epoch ms,
buckets of whole seconds, values bound as parameters; a bad parameter raises
:class:`pipeline.errors.QueryError` naming it; a table not created yet reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import duckdb
import pyarrow as pa

from pipeline.units import MINUTE_MS
from slo.queries._params import check_grid
from slo.queries._schemas import ENGINE_SERIES_SCHEMA, GPU_SERIES_SCHEMA
from slo.queries._sql import present_tables, run_query, signal_filter

__all__ = ["engine_series", "gpu_series"]

#: Counter samples read before the range so the first bucket's increase is known.
_COUNTER_LOOKBACK_MS = 10 * MINUTE_MS


def engine_series(
    con: duckdb.DuckDBPyConnection,
    *,
    signals: Sequence[str],
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    instances: Sequence[str] | None = None,
    pool: str | None = None,
) -> pa.Table:
    """Canonical engine signals per bucket and series (instance × engine rank × labels).

    Gauges: ``value`` the mean, ``value_max`` the maximum in the bucket. Counters:
    ``value`` the rate per second over the scrape intervals that end in the bucket (their
    increase, counter resets handled, over their length: a bucket narrower than the scrape
    interval, or one after a scrape gap, reads the true rate, not a multiple of it),
    ``value_max`` null. Series are never summed across instances or ranks.
    """
    grid = check_grid(start_ms, end_ms, bucket_ms)
    where, params = signal_filter(
        signals, within=[("instance", instances, "instances")], equal=[("pool", pool, "pool")]
    )
    sql = f"""
        WITH samples AS (
            SELECT ts_ms, instance, pool, coalesce(engine, '') AS engine, signal,
                   coalesce(labels_json, '{{}}') AS labels_json, kind, value,
                   value - lag(value) OVER series AS delta, ts_ms - lag(ts_ms) OVER series AS gap_ms
            FROM engine_samples WHERE ts_ms >= ? AND ts_ms < ? AND kind IN ('gauge', 'counter')
              AND {where}
            WINDOW series AS (PARTITION BY instance, engine, metric, labels_json ORDER BY ts_ms)
        )
        SELECT ts_ms // ? * ? AS bucket_ts_ms, instance, any_value(pool), engine, signal,
               labels_json, kind,
               CASE kind WHEN 'gauge' THEN avg(value)
                    ELSE sum(CASE WHEN delta < 0 THEN value ELSE delta END)
                         / (nullif(sum(gap_ms) FILTER (WHERE delta IS NOT NULL), 0) / 1000.0)
               END,
               CASE kind WHEN 'gauge' THEN max(value) END
        FROM samples WHERE ts_ms >= ?
        GROUP BY bucket_ts_ms, instance, engine, signal, labels_json, kind
        ORDER BY bucket_ts_ms, instance, engine, signal, labels_json"""
    bound = [grid.start_ms - _COUNTER_LOOKBACK_MS, grid.end_ms, *params]
    bound += [grid.bucket_ms, grid.bucket_ms, grid.start_ms]
    return run_query(con, ENGINE_SERIES_SCHEMA, ["engine_samples"], sql, bound)


def gpu_series(
    con: duckdb.DuckDBPyConnection,
    *,
    signals: Sequence[str],
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    instances: Sequence[str] | None = None,
    pool: str | None = None,
    hostname: str | None = None,
    gpu_pods: Mapping[str, str] | None = None,
) -> pa.Table:
    """DCGM signals per bucket and GPU, each GPU named by the engine instance it serves.

    ``instance`` is the engine instance the GPU is allocated to: dcgm-exporter's ``pod``
    label mapped through ``gpu_pods`` (pod → engine instance, the detectors'
    ``DetectorConfig.gpu_pods``, for engines not named by their pod), else the label itself,
    which is the engine's instance name by default (``collectors.config.instance_name``);
    null for a GPU no pod holds. ``pool`` is that engine's pool (from its engine samples; null
    when unknown). ``exporter`` and ``address`` name the dcgm-exporter that reported the
    GPU and its host:port; ``hostname`` the node, ``gpu`` its index there, ``uuid`` its
    UUID. ``value`` is the mean and ``value_max`` the maximum in the bucket.

    ``instances`` and ``pool`` narrow to the GPUs of those engines (unallocated GPUs are
    then left out); ``hostname`` to one node.
    """
    grid = check_grid(start_ms, end_ms, bucket_ms)
    where, params = signal_filter(
        signals,
        within=[("instance", instances, "instances")],
        equal=[("pool", pool, "pool"), ("hostname", hostname, "hostname")],
    )
    # A GPU-only store (no engine scraped yet) has no pools to join: pool reads as null.
    engines = (
        "SELECT instance, max(pool) AS pool FROM engine_samples_series GROUP BY instance"
        if "engine_samples_series" in present_tables(con)
        else "SELECT NULL::VARCHAR AS instance, NULL::VARCHAR AS pool WHERE false"
    )
    sql = f"""
        WITH engines AS ({engines}),
        pod_engines AS (
            SELECT unnest(?::VARCHAR[]) AS pod, unnest(?::VARCHAR[]) AS instance),
        gpus AS (
            SELECT g.*, coalesce(m.instance, g.pod) AS engine_instance
            FROM gpu_samples AS g LEFT JOIN pod_engines AS m ON m.pod = g.pod
            WHERE g.ts_ms >= ? AND g.ts_ms < ?),
        samples AS (
            SELECT g.ts_ms, g.engine_instance AS instance, e.pool, g.instance AS exporter,
                   g.address, g.hostname, g.gpu, g.uuid, g.signal, g.value
            FROM gpus AS g LEFT JOIN engines AS e ON e.instance = g.engine_instance
        )
        SELECT ts_ms // ? * ? AS bucket_ts_ms, instance, any_value(pool), exporter,
               any_value(address), any_value(hostname), gpu, uuid, signal, avg(value), max(value)
        FROM samples WHERE {where}
        GROUP BY bucket_ts_ms, instance, exporter, gpu, uuid, signal
        ORDER BY bucket_ts_ms, instance NULLS LAST, exporter, gpu, signal"""
    pods = sorted(gpu_pods or {})
    bound = [pods, [(gpu_pods or {})[p] for p in pods], grid.start_ms, grid.end_ms]
    bound += [grid.bucket_ms, grid.bucket_ms, *params]
    return run_query(con, GPU_SERIES_SCHEMA, ["gpu_samples"], sql, bound)
