"""Every schema round-trips through Arrow IPC and JSON; malformed input gets a clear reason."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.codec import (
    JSON_CONTENT_TYPE,
    decode_message,
    encode_arrow,
    encode_json,
    headers_for,
)
from pipeline.errors import DecodeError, UnknownSchemaError
from pipeline.schema import (
    ENGINE_SAMPLES,
    REQUEST_RECORDS,
    RecordSchema,
    iter_schemas,
    lookup_schema,
)
from tests.pipeline.strategies import rows_strategy

SCHEMAS = list(iter_schemas())


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _assert_rows_equal(expected: list[dict], table: pa.Table) -> None:
    got = table.to_pylist()
    assert len(got) == len(expected)
    for want_row, got_row in zip(expected, got, strict=True):
        for name, want in want_row.items():
            assert _same(want, got_row[name]), (name, want, got_row[name])


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_schema_round_trips_through_arrow_ipc(
    schema: RecordSchema, data: st.DataObject
) -> None:
    rows = data.draw(rows_strategy(schema))
    payload = encode_arrow(schema, pa.Table.from_pylist(rows, schema=schema.arrow))
    decoded = decode_message(payload, headers_for(schema))
    assert decoded.schema is schema
    assert decoded.table.schema.equals(schema.arrow, check_metadata=False)
    _assert_rows_equal(rows, decoded.table)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_schema_round_trips_through_json(schema: RecordSchema, data: st.DataObject) -> None:
    rows = data.draw(rows_strategy(schema))
    # JSON has no infinities; third-party producers send finite numbers.
    finite = json.loads(
        json.dumps(rows).replace("-Infinity", "-1e308").replace("Infinity", "1e308")
    )
    decoded = decode_message(encode_json(finite), headers_for(schema, JSON_CONTENT_TYPE))
    _assert_rows_equal(finite, decoded.table)


def _one_request() -> dict:
    return {
        "request_id": "r1",
        "attempt": 1,
        "instance": "10.0.0.1:8000",
        "received_ts_ms": 1,
        "outcome": "ok",
    }


@pytest.mark.parametrize(
    ("payload", "headers", "reason"),
    [
        (b"\x00garbage", headers_for(ENGINE_SAMPLES), "not_arrow"),
        (None, headers_for(ENGINE_SAMPLES), "empty"),
        (b"{}", [("llmslo-schema", b"engine_sample.v99")], "unknown_schema"),
        (b"{}", [("llmslo-schema", b"nonsense")], "unknown_schema"),
        (b"{}", [], "unknown_schema"),
        (b"[1, 2]", headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE), "not_json"),
        (b"{not json", headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE), "not_json"),
        (b"\xff\xfe", headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE), "not_json"),
        (
            b'{"request_id": "x"}',
            headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
            "missing_required",
        ),
        (
            json.dumps({**_one_request(), "prompt": "secret"}).encode(),
            headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
            "schema_mismatch",
        ),
        (
            json.dumps({**_one_request(), "attempt": "one"}).encode(),
            headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
            "schema_mismatch",
        ),
        (
            json.dumps({**_one_request(), "attempt": 70000}).encode(),
            headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE),
            "schema_mismatch",
        ),
        (
            b"{}",
            [("llmslo-schema", b"request_record.v1"), ("content-type", b"text/csv")],
            "unknown_content_type",
        ),
    ],
    ids=[
        "garbage is not arrow",
        "a tombstone is empty",
        "an unknown version",
        "a malformed schema header",
        "no schema header",
        "a JSON array of numbers",
        "broken JSON",
        "undecodable bytes",
        "a required field missing",
        "an unknown field (e.g. prompt text) is refused",
        "a string where an int belongs",
        "an int that overflows its column",
        "an unknown content type",
    ],
)
def test_malformed_messages_raise_decode_error_with_reason(payload, headers, reason) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_message(payload, headers)
    assert caught.value.reason == reason
    assert str(caught.value)


def test_truncated_arrow_is_reported_as_truncated() -> None:
    rows = [
        {"ts_ms": i, "instance": "a", "metric": "m", "kind": "gauge", "value": 1.0}
        for i in range(100)
    ]
    payload = encode_arrow(ENGINE_SAMPLES, pa.Table.from_pylist(rows, schema=ENGINE_SAMPLES.arrow))
    with pytest.raises(DecodeError) as caught:
        decode_message(payload[: len(payload) // 2], headers_for(ENGINE_SAMPLES))
    assert caught.value.reason == "truncated_arrow"


def test_oversized_message_is_refused_before_parsing() -> None:
    with pytest.raises(DecodeError) as caught:
        decode_message(b"x" * 1001, headers_for(ENGINE_SAMPLES), max_bytes=1000)
    assert caught.value.reason == "oversized"


def test_arrow_with_plain_strings_is_conformed_to_dictionary_columns() -> None:
    table = pa.table(
        {"ts_ms": [1], "instance": ["a"], "metric": ["m"], "kind": ["gauge"], "value": [2.5]}
    )
    decoded = decode_message(encode_arrow(ENGINE_SAMPLES, table), headers_for(ENGINE_SAMPLES))
    assert decoded.table.column("instance").to_pylist() == ["a"]
    assert decoded.table.column("le").to_pylist() == [None]


def test_lookup_schema_names_the_unknown_schema() -> None:
    with pytest.raises(UnknownSchemaError, match=r"gpu_sample\.v7"):
        lookup_schema(b"gpu_sample.v7")
    assert lookup_schema("gpu_sample.v1").table == "gpu_samples"
