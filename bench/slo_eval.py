"""Benchmark: one full SLO evaluation over 30 days of per-minute rollups.

Builds ``slo_minute`` rows for ``--instances`` pods × ``--slos`` SLOs × ``--days`` days
(synthetic counts, realistic shape: diurnal traffic, a few bad events), derives
``slo_hour`` with the rollup code, then times :func:`slo.evaluate.evaluate` (all SLOs, all
windows up to the 30-day period, per-instance groups). ``--quick`` uses fewer instances so
it finishes in well under a minute. Last line is JSON::

    {"bench": "slo_eval", "seconds": …, "instances": …, "slos": …, "days": …}
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo.evaluate import evaluate
from slo.rollups.counts import Rollup, create_rollup_tables
from slo.spec import parse_spec
from slo.spec.model import SloModel, build_model

NOW_MS = 1_790_000_000_000 // MINUTE_MS * MINUTE_MS + 17 * MINUTE_MS  # mid-hour on purpose


def bench_model(slos: int) -> SloModel:
    kinds = [
        {"kind": "latency", "metric": "ttft", "threshold_s": 2.0},
        {"kind": "latency", "metric": "tpot", "threshold_s": 0.08},
        {"kind": "latency", "metric": "itl", "statistic": "jitter", "threshold_s": 0.03},
        {"kind": "availability"},
        {"kind": "goodput", "targets_s": {"ttft": 2.0, "tpot": 0.08}},
        {"kind": "latency", "metric": "e2e", "threshold_s": 30.0},
    ]
    specs = [
        {
            "name": f"slo-{i}",
            "objective": 0.99,
            "sli": kinds[i % len(kinds)],
            "group_by": ["instance"],
            "alerting": {"min_events": 100},
        }
        for i in range(slos)
    ]
    return build_model(parse_spec({"version": "llmslo/v1", "service": "bench", "slos": specs}))


def build_rollups(
    con: duckdb.DuckDBPyConnection, model: SloModel, instances: int, days: int
) -> int:
    """Fill slo_minute with synthetic counts, then slo_hour through the rollup code."""
    create_rollup_tables(con)
    start = NOW_MS - days * DAY_MS
    minutes = days * 1440 + 1
    for slo in model.slos:
        con.execute(
            """INSERT INTO slo_keys
               SELECT ? * 100000 + i, ?, 'pool-' || (i % 4),
                      '10.0.' || (i // 250) || '.' || (i % 250) || ':8000', '', ''
               FROM range(?) r(i)""",
            [model.slos.index(slo), slo.id, instances],
        )
        con.execute(
            f"""INSERT INTO slo_minute
                SELECT ?, ? * 100000 + i, {start} + m * {MINUTE_MS},
                       t, CAST(t * 0.002 * ((m * 7 + i) % 5) AS BIGINT)
                FROM (SELECT m, i, CAST(20 + 10 * sin(m / 229.0) + (i % 3) AS BIGINT) AS t
                      FROM range({minutes}) r(m), range({instances}) s(i))
                ORDER BY 3""",
            [slo.id, model.slos.index(slo)],
        )
    rollup = Rollup(con, model)
    for slo in model.slos:
        rollup.rebuild_hours(slo.id, start // HOUR_MS * HOUR_MS, NOW_MS + HOUR_MS)
    row = con.execute("SELECT count(*) FROM slo_minute").fetchone()
    return int(row[0]) if row else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="32 instances instead of 256 (< 60 s)")
    parser.add_argument("--instances", type=int, default=None)
    parser.add_argument("--slos", type=int, default=6)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed evaluations; the median is reported"
    )
    parser.add_argument("--db", type=Path, help="DuckDB file (default: a temporary one)")
    args = parser.parse_args(argv)
    instances = args.instances or (32 if args.quick else 256)
    model = bench_model(args.slos)
    with tempfile.TemporaryDirectory() as tmp:
        con = duckdb.connect(str(args.db or Path(tmp) / "bench.duckdb"))
        t0 = time.perf_counter()
        rows = build_rollups(con, model, instances, args.days)
        build_s = time.perf_counter() - t0
        print(f"built {rows:,} minute rows in {build_s:.1f} s", file=sys.stderr)
        timings = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            statuses = evaluate(con, model, NOW_MS)
            timings.append(time.perf_counter() - t0)
        con.close()
    timings.sort()
    median = timings[len(timings) // 2]
    alerting = sum(any(p.alerting for p in s.pairs()) for s in statuses)
    print(
        f"evaluations: {', '.join(f'{t:.3f}' for t in timings)} s; {len(statuses)} statuses, "
        f"{alerting} alerting",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "bench": "slo_eval",
                "seconds": round(median, 4),
                "instances": instances,
                "slos": args.slos,
                "days": args.days,
                "minute_rows": rows,
                "statuses": len(statuses),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
