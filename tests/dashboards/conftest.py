"""A small DuckDB history with faults in it, built once per session, for every page's tests.

Two days of 4 pods from the history generator (one incident a day: TTFT × 6 and 5 %
errors), the SLO jobs run over it (rollups, status, findings), plus the events a fault
drill leaves: a stall finding, a KV leak walking one pod L0 → L1 → L2 → L1, and one
canary verdict. Times end at a fixed hour so the pages see the same range every run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

import simulator.history as history
from api.verdicts import VerdictStore
from pipeline.schema import REQUEST_RECORDS
from pipeline.store import Store
from pipeline.units import HOUR_MS, SECOND_MS
from slo.flags import FlagTransition
from slo.jobs import SloJobs
from slo.signals.findings import Finding
from slo.sinks import StoreTransitionSink, write_findings
from slo.spec import parse_spec
from slo.spec.model import build_model

END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS
POOL = "llama-3-8b"
SPEC = {
    "version": "llmslo/v1",
    "service": "chat",
    "slos": [
        # Every record an event (cancels bad), so the pages' counts are the raw record counts.
        {
            "name": "availability",
            "objective": 0.99,
            "sli": {"kind": "availability", "outcomes": {"client_cancelled": "bad"}},
        },
        {
            "name": "ttft",
            "objective": 0.995,
            "sli": {
                "kind": "latency",
                "metric": "ttft",
                "threshold_s": 2.5,
                "outcomes": {"client_cancelled": "bad"},
            },
            "group_by": ["instance"],
        },
    ],
}


@dataclass(frozen=True)
class History:
    """The built file and what was put in it."""

    path: Path
    incidents: list[int]
    instances: list[str]
    leaking: str
    stalled: str


def _drill_events(store: Store, instances: list[str]) -> None:
    stalled, leaking = instances[0], instances[1]
    stall = Finding(
        END_MS - 3 * HOUR_MS, "stall", "instance", stalled, POOL, "page", "signature",
        {"running": 12, "generation_tokens_per_s": 0.0, "for_s": 75},
    )  # fmt: skip
    write_findings(store.con, END_MS - 3 * HOUR_MS, "firing", [stall])
    write_findings(store.con, END_MS - 2 * HOUR_MS, "resolved", [stall])
    steps = [(5, 0, 1, 0.08), (4, 1, 2, 0.04), (2, 2, 1, 0.12)]
    StoreTransitionSink(store.con).write(
        [
            FlagTransition(
                END_MS - hours * HOUR_MS - 600_000,
                "instance",
                leaking,
                POOL,
                before,
                after,
                free,
                "kv_free_ratio",
                {"kv_usage": round(1 - free, 2)},
            )
            for hours, before, after, free in steps
        ]
    )
    verdicts = VerdictStore(store.con)
    verdicts.migrate()
    document = {
        "verdict": "fail",
        "metrics": [
            {"metric": "ttft_p99", "result": "High", "canary": 2.9, "baseline": 0.6},
            {"metric": "error_rate", "result": "Pass", "canary": 0.004, "baseline": 0.003},
        ],
    }
    verdicts.insert(
        {
            "verdict_id": "v-1", "idempotency_key": None, "evaluated_ts_ms": END_MS - HOUR_MS,
            "source": "argo", "namespace": "prod", "service": "chat", "canary": f"instances={leaking}",
            "baseline": f"instances={instances[2]}", "window_start_ts_ms": END_MS - 2 * HOUR_MS,
            "window_end_ts_ms": END_MS - HOUR_MS, "verdict": "fail", "score": 42.0,
            "reason": "ttft_p99 High", "canary_requests": 812, "baseline_requests": 790,
            "document_json": json.dumps(document),
        }
    )  # fmt: skip


@pytest.fixture(scope="session")
def history_db(tmp_path_factory: pytest.TempPathFactory) -> History:
    """Build the file once (about 10 s); tests open it read-only."""
    path = tmp_path_factory.mktemp("dash") / "history.duckdb"
    config = history.HistoryConfig(days=2, end_ts_ms=END_MS, pods=4, incidents_per_day=1, seed=7)
    generator = history.HistoryGenerator(config)
    with Store(path) as store:
        for schema, table in generator.chunks():
            store.commit_batch({schema.table: [table]}, group_id="h", offsets={}, now_ts_ms=0)
        SloJobs(store.con, build_model(parse_spec(SPEC))).run_once(END_MS)
        _drill_events(store, generator.instances)
    return History(
        path, generator.incidents, generator.instances, generator.instances[1],
        generator.instances[0],
    )  # fmt: skip


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with llmslo's tables and no rows (a pipeline that just started)."""
    path = tmp_path_factory.mktemp("dash-empty") / "empty.duckdb"
    with Store(path):
        pass
    return path


#: The demo store's records: 2.5 minutes from a minute past an hour (inside one 15-minute
#: bucket), one every 2 s on two pods.
DEMO_START_MS = END_MS + 60 * SECOND_MS
DEMO_SPAN_MS = 150 * SECOND_MS


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a short demo leaves: 2.5 minutes of tap records, the SLO jobs run over them."""
    path = tmp_path_factory.mktemp("dash-demo") / "demo.duckdb"
    rows = [
        {
            "request_id": f"r{i}", "received_ts_ms": DEMO_START_MS + i * 2 * SECOND_MS,
            "attempt": 1, "instance": f"pod-{i % 2}", "pool": POOL, "outcome": "ok",
            "ttft_s": 0.2 + 0.01 * (i % 17), "e2e_s": 1.0 + 0.02 * (i % 13),
        }
        for i in range(DEMO_SPAN_MS // (2 * SECOND_MS))
    ]  # fmt: skip
    table = pa.Table.from_pylist(
        [{f.name: row.get(f.name) for f in REQUEST_RECORDS.arrow} for row in rows],
        schema=REQUEST_RECORDS.arrow,
    )
    with Store(path) as store:
        store.commit_batch({"requests": [table]}, group_id="d", offsets={}, now_ts_ms=0)
        SloJobs(store.con, build_model(parse_spec(SPEC))).run_once(DEMO_START_MS + DEMO_SPAN_MS)
    return path
