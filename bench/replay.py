"""Benchmark: ``llmslo jobs --replay`` — simulated hours replayed per second at one-minute steps.

Builds a history with the generator (``--pods`` instances, default 64, scraped every minute,
5 % of requests, one incident in the replayed range, as ``llmslo sim history`` writes) and
replays its last ``--hours`` with the **example spec** (``slo/slo.example.yaml``: the six
SLOs of ``llmslo`` without ``--spec``) and the default ``slo`` config (every detector, flags)
at one-minute steps through :func:`slo.replay.replay`, the code of ``jobs --replay``. Each
run replays the same range again (a replay replaces its range, so every run does the same
work); ``--runs`` of them give the median. Printed per run: steps, seconds, ms per step,
simulated hours per second; the last line is one JSON object.

``--quick`` (< 60 s) is 64 pods × 1 h of history, the last 15 minutes replayed once.
Usage: ``python bench/replay.py [--quick] [--pods 64] [--hours 2] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import logging  # noqa: E402

from llmslo.run import EXAMPLE_SPEC, load_model  # noqa: E402
from pipeline.store import Store  # noqa: E402
from pipeline.units import HOUR_MS, MINUTE_MS  # noqa: E402
from simulator.history import HistoryConfig, HistoryGenerator, StoreSink  # noqa: E402
from slo.replay import replay  # noqa: E402

END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS + 15 * HOUR_MS  # 15:00 UTC, the daily peak


def build(path: Path, pods: int, history_h: float, incident_ms: int) -> int:
    """Write the history; returns its raw row count."""
    generator = HistoryGenerator(
        HistoryConfig(
            days=history_h / 24, end_ts_ms=END_MS, pods=pods, incident_starts_ms=(incident_ms,)
        )
    )
    rows = 0
    with Store(path) as store:
        sink = StoreSink(store)
        for schema, table in generator.chunks():
            sink.write(schema, table)
            rows += table.num_rows
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 pods, 15 replayed minutes, 1 run")
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--hours", type=float, default=2.0, help="simulated hours replayed")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    replayed_h = 0.25 if args.quick else args.hours
    runs = 1 if args.quick else args.runs
    logging.basicConfig(level=logging.ERROR)  # the flags' transitions log at WARNING
    start_ms = END_MS - int(replayed_h * HOUR_MS) // MINUTE_MS * MINUTE_MS
    incident_ms = start_ms + 5 * MINUTE_MS
    model = load_model(None)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        path = Path(tmp) / "history.duckdb"
        began = time.perf_counter()
        rows = build(path, args.pods, replayed_h + 1.0, incident_ms)
        print(f"history: {args.pods} pods, {replayed_h + 1:g} h, {rows:,} rows "
              f"in {time.perf_counter() - began:.1f} s; spec {EXAMPLE_SPEC.name} "
              f"({len(model.slos)} SLOs)", flush=True)  # fmt: skip
        seconds, steps, findings, transitions = [], 0, 0, 0
        with Store(path) as store:
            for run in range(runs):
                summary = replay(store.con, model, start_ms=start_ms, end_ms=END_MS)
                if summary.errors:
                    print(f"errors: {summary.errors[:3]}", file=sys.stderr)
                    return 1
                steps, findings, transitions = (
                    summary.steps,
                    summary.findings_firing,
                    summary.transitions,
                )
                seconds.append(summary.seconds)
                print(
                    f"run {run + 1}: {summary.steps} steps in {summary.seconds:.1f} s = "
                    f"{1000 * summary.seconds / summary.steps:.0f} ms/step, "
                    f"{replayed_h / summary.seconds:.3f} simulated h/s "
                    f"({summary.findings_firing} findings, {summary.transitions} transitions)",
                    flush=True,
                )
    median = statistics.median(seconds)
    print(
        json.dumps(
            {
                "bench": "replay",
                "pods": args.pods,
                "spec": EXAMPLE_SPEC.name,
                "step_s": 60,
                "replayed_hours": replayed_h,
                "steps": steps,
                "runs": runs,
                "median_seconds": round(median, 3),
                "median_ms_per_step": round(1000 * median / max(steps, 1), 1),
                "simulated_hours_per_second": round(replayed_h / median, 4),
                "findings_started": findings,
                "flag_transitions": transitions,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
