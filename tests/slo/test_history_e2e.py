"""End to end on the simulator's history generator: raw rows → rollups → burn-rate pages."""

from __future__ import annotations

from typing import Any

import pytest

import simulator.history as history
from pipeline.store import Store
from slo.evaluate import evaluate
from slo.rollups.counts import Rollup
from slo.spec import parse_spec
from slo.spec.model import build_model

END_MS = 1_790_000_000_000 // 60_000 * 60_000
MODEL = build_model(
    parse_spec(
        {
            "version": "llmslo/v1",
            "service": "hist",
            "slos": [
                {"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}},
                {
                    "name": "ttft-tap",
                    "objective": 0.995,
                    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.5},
                },
                {
                    "name": "ttft-engine",
                    "objective": 0.995,
                    "sli": {
                        "kind": "latency",
                        "metric": "ttft",
                        "threshold_s": 2.5,
                        "source": "engine",
                        "dialect": "vllm",
                    },
                    "group_by": ["instance"],
                },
            ],
        }
    )
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("hist") / "h.duckdb"
    config = history.HistoryConfig(days=1, end_ts_ms=END_MS, pods=4, incidents_per_day=1, seed=3)
    generator = history.HistoryGenerator(config)
    with Store(path) as store:
        for schema, table in generator.chunks():
            rows = [table]
            store.commit_batch({schema.table: rows}, group_id="hist", offsets={}, now_ts_ms=0)
        Rollup(store.con, MODEL).update(END_MS)
    return path, generator.incidents


def test_rollups_count_every_raw_request(generated: Any) -> None:
    path, _ = generated
    with Store(path) as store:
        # Every record is an event but the clients' cancels (the history has no client 4xx).
        raw = store.con.execute(
            "SELECT count(*) FROM requests WHERE outcome <> 'client_cancelled'"
        ).fetchone()
        rolled = store.con.execute(
            "SELECT sum(total) FROM slo_minute WHERE slo_id = 'hist-avail'"
        ).fetchone()
        hourly = store.con.execute(
            "SELECT sum(total) FROM slo_hour WHERE slo_id = 'hist-avail'"
        ).fetchone()
    assert raw is not None and rolled is not None and hourly is not None
    assert raw[0] > 500 and rolled[0] == raw[0] == hourly[0]


@pytest.mark.parametrize("name", ["ttft-tap", "ttft-engine"])
def test_the_incident_pages_and_a_quiet_hour_does_not(generated: Any, name: str) -> None:
    path, incidents = generated
    (start,) = incidents
    with Store(path) as store:
        during = [s for s in evaluate(store.con, MODEL, start + 55 * 60_000) if s.slo.name == name]
        quiet_at = start - 6 * 3_600_000 if start - 6 * 3_600_000 > END_MS - 86_400_000 else END_MS
        quiet = [s for s in evaluate(store.con, MODEL, quiet_at) if s.slo.name == name]
    assert any(p.alerting and p.pair.severity == "page" for s in during for p in s.pairs())
    assert not any(p.alerting and p.pair.severity == "page" for s in quiet for p in s.pairs())
    if name == "ttft-engine":
        assert len(during) == 4  # grouped by instance


def test_quiet_hours_of_history_raise_no_signal_and_no_flag(generated: Any, tmp_path: Any) -> None:
    import shutil

    from slo.jobs import JobsConfig, SloJobs
    from slo.sinks import ListTransitionSink

    path, incidents = generated
    copy = tmp_path / "copy.duckdb"
    shutil.copy(path, copy)
    sink = ListTransitionSink()
    with Store(copy) as store:
        jobs = SloJobs(store.con, MODEL, JobsConfig(), sink=sink)
        quiet = [
            t
            for t in range(END_MS - 22 * 3_600_000, END_MS, 30 * 60_000)
            if all(not -600_000 <= t - start <= 3 * 3_600_000 for start in incidents)
        ]
        assert len(quiet) > 20
        findings = []
        for t in quiet:
            result = jobs.run_once(t)
            assert result is not None
            findings += result.findings
    assert findings == [] and sink.transitions == []
