"""History generator: rows land in DuckDB (and Kafka) with canonical signals and sane values."""

from __future__ import annotations

import json

from llmslo.cli import main
from pipeline.publisher import Publisher
from pipeline.schema import OUTCOMES, REQUEST_RECORDS
from pipeline.signals import ENGINE_SIGNALS, GPU_SIGNALS
from pipeline.store import Store
from simulator.history import BusSink, HistoryConfig, HistoryGenerator, StoreSink

END = 1_800_000_000_000


def _generate(store: Store, **kw) -> HistoryGenerator:
    gen = HistoryGenerator(HistoryConfig(days=kw.pop("days", 0.1), end_ts_ms=END, pods=3, **kw))
    sink = StoreSink(store)
    for schema, table in gen.chunks():
        sink.write(schema, table)
    return gen


def test_history_rows_use_canonical_signals_and_simulated_time(store):
    _generate(store)
    con = store.con
    signals = {s for (s,) in con.execute("SELECT DISTINCT signal FROM engine_samples").fetchall()}
    assert (
        signals <= set(ENGINE_SIGNALS)
        and {"running", "kv_usage", "ttft", "generation_tokens"} <= signals
    )
    gpu = {s for (s,) in con.execute("SELECT DISTINCT signal FROM gpu_samples").fetchall()}
    assert gpu <= set(GPU_SIGNALS)
    lo, hi = con.execute("SELECT min(ts_ms), max(ts_ms) FROM engine_samples").fetchone()
    assert hi == END and END - lo <= 0.1 * 86_400_000
    outcomes = {o for (o,) in con.execute("SELECT DISTINCT outcome FROM requests").fetchall()}
    assert outcomes <= set(OUTCOMES)


def test_counters_and_buckets_are_monotone(store):
    _generate(store)
    bad = store.con.execute(
        """SELECT count(*) FROM (
             SELECT value - lag(value) OVER (
                 PARTITION BY instance, metric, labels_json, le ORDER BY ts_ms) AS d
             FROM engine_samples WHERE kind IN ('counter', 'bucket', 'count', 'sum')) WHERE d < 0"""
    ).fetchone()[0]
    assert bad == 0
    # _count equals the +Inf bucket, buckets cumulative in le
    mismatch = store.con.execute(
        """SELECT count(*) FROM engine_samples c JOIN engine_samples b
             ON c.instance = b.instance AND c.ts_ms = b.ts_ms
            AND b.metric = replace(c.metric, '_count', '_bucket')
           WHERE c.kind = 'count' AND b.le = 'inf'::DOUBLE AND b.value <> c.value"""
    ).fetchone()[0]
    assert mismatch == 0


def test_request_records_follow_design_definitions(store):
    _generate(store)
    rows = store.con.execute(
        "SELECT outcome, ttft_s, tpot_s, e2e_s, completion_tokens FROM requests"
    ).fetchall()
    assert rows
    for outcome, ttft, tpot, e2e, tokens in rows:
        if outcome == "error_before_first_token":
            assert ttft is None and tokens == 0
        else:
            assert ttft is not None and ttft > 0 and e2e >= ttft
            assert tpot is None or tokens > 1


def test_incidents_raise_ttft(store):
    gen = _generate(store, days=0.5, incidents_per_day=2.0, seed=4)
    assert gen.incidents
    start = gen.incidents[0]
    inside, outside = store.con.execute(
        """SELECT avg(ttft_s) FILTER (received_ts_ms BETWEEN ? AND ? + 3600000),
                  avg(ttft_s) FILTER (received_ts_ms NOT BETWEEN ? - 3600000 AND ? + 7200000)
           FROM requests""",
        [start, start, start, start],
    ).fetchone()
    assert inside > 2 * outside


def test_history_through_kafka(bus):
    publisher = Publisher(bus.producer, component="sim-history")
    gen = HistoryGenerator(HistoryConfig(days=0.01, end_ts_ms=END, pods=2))
    sink = BusSink(publisher)
    sent = 0
    for schema, table in gen.chunks():
        sink.write(schema, table)
        sent += table.num_rows
    publisher.close()
    assert sent > 0
    assert publisher.published_rows == sent


def test_cli_history_into_duckdb(tmp_path, capsys):
    db = tmp_path / "h.duckdb"
    assert (
        main(
            [
                "sim",
                "history",
                "--days",
                "0.02",
                "--pods",
                "2",
                "--db",
                str(db),
                "--end-ts-ms",
                str(END),
                "--no-replay",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["replay"] is None
    assert out["rows"]["engine_samples"] > 0
    with Store(db) as store:
        assert store.count("engine_samples") == out["rows"]["engine_samples"]
        assert store.count(REQUEST_RECORDS.table) == out["rows"].get("requests", 0)


def test_cli_rejects_bad_history_args(tmp_path, capsys):
    assert main(["sim", "history", "--days", "-1", "--db", str(tmp_path / "x.duckdb")]) == 2
    assert "must be positive" in capsys.readouterr().err
