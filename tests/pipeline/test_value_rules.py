"""Values a column cannot hold are refused at decode and dead-lettered, never stored or counted.

A third party once sent ``outcome: "pwned"``, ``ttft_s: -5`` and ``e2e_s: -1``: the record
was stored and the SLO report counted it. These tests send such records through the codec
and, end to end, through the real embedded broker, the ingester and ``llmslo slo report``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from llmslo.cli import main
from pipeline.bus import Bus
from pipeline.codec import (
    JSON_CONTENT_TYPE,
    decode_message,
    encode_arrow,
    encode_json,
    headers_for,
)
from pipeline.config import IngestConfig
from pipeline.errors import DecodeError
from pipeline.ingest import Ingester
from pipeline.schema import (
    ALERTS,
    ENGINE_SAMPLES,
    FLAG_TRANSITIONS,
    GPU_SAMPLES,
    REQUEST_RECORDS,
    RecordSchema,
    iter_schemas,
    value_rules,
)
from pipeline.store import Store

EXAMPLE = str(Path(__file__).parents[2] / "config" / "slo.example.yaml")
T0_MS = 1_700_000_000_000


def _request(**fields: object) -> dict[str, object]:
    return {
        "request_id": "r-1",
        "attempt": 1,
        "instance": "10.0.0.1:8000",
        "pool": "llama-3-8b",
        "received_ts_ms": T0_MS,
        "outcome": "ok",
        "ttft_s": 0.3,
        "e2e_s": 2.0,
        **fields,
    }


_MINIMAL = {
    ENGINE_SAMPLES: {"ts_ms": T0_MS, "instance": "p", "metric": "m", "kind": "gauge", "value": 1.0},
    GPU_SAMPLES: {"ts_ms": T0_MS, "instance": "d", "metric": "DCGM_FI_DEV_GPU_UTIL", "value": 1.0},
    REQUEST_RECORDS: _request(),
    FLAG_TRANSITIONS: {
        "ts_ms": T0_MS,
        "scope": "pool",
        "scope_id": "llama",
        "from_level": 0,
        "to_level": 1,
    },
    ALERTS: {"ts_ms": T0_MS, "fingerprint": "f", "alertname": "A", "state": "firing"},
}


def _json_reason(schema: RecordSchema, rows: list[dict[str, object]]) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode_message(encode_json(rows), headers_for(schema, JSON_CONTENT_TYPE))
    return caught.value


@pytest.mark.parametrize(
    ("schema", "field", "value", "words"),
    [
        (REQUEST_RECORDS, "outcome", "pwned", "outcome='pwned'"),
        (REQUEST_RECORDS, "ttft_s", -5, "ttft_s=-5.0"),
        (REQUEST_RECORDS, "e2e_s", -1, "e2e_s=-1.0"),
        (REQUEST_RECORDS, "tpot_s", -0.001, "tpot_s=-0.001"),
        (REQUEST_RECORDS, "attempt", 0, "attempt=0"),
        (REQUEST_RECORDS, "http_status", 42, "http_status=42"),
        (REQUEST_RECORDS, "completion_tokens", -3, "completion_tokens=-3"),
        (REQUEST_RECORDS, "itl_gaps_s", [0.01, -0.5], "itl_gaps_s=-0.5"),
        (REQUEST_RECORDS, "chunk_tokens", [1, -1], "chunk_tokens=-1"),
        (REQUEST_RECORDS, "slo_ttft_s", 601, "slo_ttft_s=601.0"),
        (REQUEST_RECORDS, "slo_tpot_s", -0.02, "slo_tpot_s=-0.02"),
        (REQUEST_RECORDS, "received_ts_ms", -1, "received_ts_ms=-1"),
        (REQUEST_RECORDS, "received_ts_ms", T0_MS * 1000, "received_ts_ms=1700000000000000"),
        (ENGINE_SAMPLES, "kind", "histogramm", "kind='histogramm'"),
        (ENGINE_SAMPLES, "ts_ms", -1, "ts_ms=-1"),
        (GPU_SAMPLES, "gpu", -1, "gpu=-1"),
        (FLAG_TRANSITIONS, "to_level", 7, "to_level=7"),
        (FLAG_TRANSITIONS, "from_level", -2, "from_level=-2"),
        (FLAG_TRANSITIONS, "kv_free_ratio", 1.5, "kv_free_ratio=1.5"),
        (FLAG_TRANSITIONS, "scope", "galaxy", "scope='galaxy'"),
        (ALERTS, "state", "exploded", "state='exploded'"),
        (ALERTS, "severity", "meh", "severity='meh'"),
    ],
    ids=lambda v: v.name if isinstance(v, RecordSchema) else None,
)
def test_a_value_outside_its_rule_is_refused_naming_field_and_value(
    schema: RecordSchema, field: str, value: object, words: str
) -> None:
    good = _MINIMAL[schema]
    decode_message(encode_json([good]), headers_for(schema, JSON_CONTENT_TYPE))  # baseline
    error = _json_reason(schema, [good, {**good, field: value}])
    assert error.reason == "invalid_value"
    assert words in str(error) and "row 1" in str(error)


def test_a_flag_going_unknown_and_coming_back_is_a_valid_transition() -> None:
    """Level −1 is the flag board's "unknown" (target down, data stale): the jobs publish
    L0 → L−1 and L−1 → L0, and losing them to the dead letters hid every crash from the
    flag timeline."""
    rows = [
        {**_MINIMAL[FLAG_TRANSITIONS], "scope": "instance", "from_level": 0, "to_level": -1},
        {**_MINIMAL[FLAG_TRANSITIONS], "scope": "instance", "from_level": -1, "to_level": 0},
    ]
    decoded = decode_message(encode_json(rows), headers_for(FLAG_TRANSITIONS, JSON_CONTENT_TYPE))
    assert decoded.table.column("to_level").to_pylist() == [-1, 0]


def test_a_request_judged_against_its_own_targets_decodes_from_json() -> None:
    row = _request(slo_ttft_s=0.5, slo_tpot_s=600, slo_met=False)
    decoded = decode_message(encode_json([row]), headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE))
    got = decoded.table.select(["slo_ttft_s", "slo_tpot_s", "slo_met"]).to_pylist()
    assert got == [{"slo_ttft_s": 0.5, "slo_tpot_s": 600.0, "slo_met": False}]


def test_the_reason_holds_a_bounded_excerpt_of_a_huge_value() -> None:
    error = _json_reason(REQUEST_RECORDS, [_request(outcome="x" * 100_000)])
    assert error.reason == "invalid_value"
    assert len(str(error)) < 400


def test_nan_durations_from_arrow_producers_are_refused() -> None:
    # JSON cannot carry NaN; Arrow can, and a NaN TTFT is no duration at all.
    table = pa.Table.from_pylist([_request(ttft_s=float("nan"))])
    table = table.set_column(
        table.schema.get_field_index("attempt"), "attempt", pa.array([1], pa.int16())
    )
    with pytest.raises(DecodeError, match="ttft_s=nan") as caught:
        decode_message(encode_arrow(REQUEST_RECORDS, table), headers_for(REQUEST_RECORDS))
    assert caught.value.reason == "invalid_value"


def test_an_unused_bad_dictionary_entry_is_not_a_bad_value() -> None:
    # Arrow dictionaries may hold entries no row points at; only the rows' values count.
    outcome = pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), ["ok", "pwned"])
    table = pa.Table.from_pylist([_request()]).set_column(
        pa.Table.from_pylist([_request()]).schema.get_field_index("outcome"), "outcome", outcome
    )
    table = table.set_column(
        table.schema.get_field_index("attempt"), "attempt", pa.array([1], pa.int16())
    )
    decoded = decode_message(encode_arrow(REQUEST_RECORDS, table), headers_for(REQUEST_RECORDS))
    assert decoded.table.column("outcome").to_pylist() == ["ok"]


@pytest.mark.parametrize("schema", list(iter_schemas()), ids=lambda s: s.name)
def test_every_rule_names_a_column_of_its_schema(schema: RecordSchema) -> None:
    for rule in value_rules(schema):
        assert rule.column in schema.arrow.names, rule


def test_hostile_third_party_records_are_dead_lettered_and_not_counted_by_the_slo_report(
    bus: Bus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [_request(request_id=f"ok-{i}", received_ts_ms=T0_MS + i * 1000) for i in range(20)]
    hostile = [
        _request(request_id="pwned", outcome="pwned", received_ts_ms=T0_MS + 30_000),
        _request(request_id="neg", ttft_s=-5, e2e_s=-1, received_ts_ms=T0_MS + 31_000),
    ]
    producer = bus.producer()
    for row in good[:10] + hostile[:1] + good[10:] + hostile[1:]:
        producer.send_raw(
            "requests",
            json.dumps(row).encode(),
            key=b"10.0.0.1:8000",
            headers=headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
        )
    producer.close()

    db = tmp_path / "llmslo.duckdb"
    with Store(db) as store:
        Ingester(bus, store, IngestConfig(group_id=bus.prefix, batch_max_ms=100)).run(
            max_idle_s=2.0
        )
        stored = {r for (r,) in store.con.execute("SELECT request_id FROM requests").fetchall()}
        letters = store.con.execute(
            "SELECT reason, error, payload FROM deadletter ORDER BY error"
        ).fetchall()
    assert stored == {row["request_id"] for row in good}
    assert [reason for reason, _, _ in letters] == ["invalid_value", "invalid_value"]
    errors = sorted(error for _, error, _ in letters)
    assert "outcome='pwned'" in errors[0] and "ttft_s=-5.0" in errors[1]
    assert {json.loads(payload)["request_id"] for _, _, payload in letters} == {"pwned", "neg"}

    at = str(T0_MS + 60_000)
    assert main(["slo", "report", "--spec", EXAMPLE, "--db", str(db), "--at", at, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    availability = next(s for s in report["slos"] if s["name"] == "availability")
    assert availability["events"] == 20 and availability["bad"] == 0
