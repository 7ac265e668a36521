"""Every schema round-trips through Arrow IPC and JSON; malformed input gets a clear reason."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import codec
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
    # JSON carries no NaN or infinities (they are refused, see below): finite numbers only.
    rows = data.draw(rows_strategy(schema, json_safe=True))
    decoded = decode_message(encode_json(rows), headers_for(schema, JSON_CONTENT_TYPE))
    _assert_rows_equal(rows, decoded.table)


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


# --- poison pills found in review: each is a DecodeError with a stable reason -------------


def _ipc(table: pa.Table) -> bytes:
    """An uncompressed Arrow IPC stream of ``table`` as is (no conforming, no checks)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _reason(payload: bytes, headers: list) -> str:
    with pytest.raises(DecodeError) as caught:
        decode_message(payload, headers)
    assert str(caught.value)
    return caught.value.reason


def _engine_row(**overrides: object) -> dict:
    return {"ts_ms": 1, "instance": "i", "metric": "m", "kind": "gauge", "value": 1.0, **overrides}


def test_invalid_utf8_in_a_plain_string_column_is_corrupt_arrow() -> None:
    table = pa.Table.from_pylist([{**_one_request(), "request_id": "AA"}])
    payload = _ipc(table)
    bad = payload.replace(b"AA", b"\xff\xfe", 1)
    assert bad != payload
    assert _reason(bad, headers_for(REQUEST_RECORDS)) == "corrupt_arrow"


def test_invalid_utf8_in_a_dictionary_is_corrupt_arrow() -> None:
    table = pa.Table.from_pylist([_engine_row(instance="ZZZZ")], schema=ENGINE_SAMPLES.arrow)
    payload = _ipc(table)
    bad = payload.replace(b"ZZZZ", b"\xff\xff\xff\xff", 1)
    assert bad != payload
    assert _reason(bad, headers_for(ENGINE_SAMPLES)) == "corrupt_arrow"


def test_an_out_of_range_dictionary_index_is_corrupt_arrow() -> None:
    instance = pa.DictionaryArray.from_arrays(
        pa.array([0, 5], pa.int32()), pa.array(["a"]), safe=False
    )
    table = pa.table(
        {
            "ts_ms": [1, 2],
            "instance": instance,
            "metric": ["m", "m"],
            "kind": ["gauge", "gauge"],
            "value": [1.0, 2.0],
        }
    )
    assert _reason(_ipc(table), headers_for(ENGINE_SAMPLES)) == "corrupt_arrow"


def _with_dictionary_null(column: str) -> pa.Table:
    """Two engine rows whose ``column`` points at a null *entry* of its dictionary."""
    values = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["x", None]))
    plain = {"ts_ms": [1, 2], "instance": ["i", "i"], "metric": ["m", "m"]}
    return pa.table({**plain, "kind": ["gauge", "gauge"], "value": [1.0, 2.0], column: values})


def test_a_null_inside_the_dictionary_of_a_required_column_is_missing_required() -> None:
    payload = _ipc(_with_dictionary_null("instance"))
    assert _reason(payload, headers_for(ENGINE_SAMPLES)) == "missing_required"


def test_a_null_inside_the_dictionary_of_a_nullable_column_is_a_null() -> None:
    decoded = decode_message(_ipc(_with_dictionary_null("pool")), headers_for(ENGINE_SAMPLES))
    assert decoded.table.column("pool").to_pylist() == ["x", None]


def test_duplicate_column_names_are_a_schema_mismatch() -> None:
    table = pa.Table.from_arrays(
        [pa.array([value]) for value in (1, "i", "j", "m", "gauge", 1.0)],
        names=["ts_ms", "instance", "instance", "metric", "kind", "value"],
    )
    assert _reason(_ipc(table), headers_for(ENGINE_SAMPLES)) == "schema_mismatch"


def test_arrow_doubles_that_overflow_a_float32_list_are_refused() -> None:
    table = pa.table({**{k: [v] for k, v in _one_request().items()}, "itl_gaps_s": [[0.5, 1e300]]})
    table = table.set_column(
        table.schema.get_field_index("attempt"), "attempt", pa.array([1], pa.int16())
    )
    assert _reason(_ipc(table), headers_for(REQUEST_RECORDS)) == "schema_mismatch"
    fine = table.set_column(table.num_columns - 1, "itl_gaps_s", pa.array([[0.5, float("inf")]]))
    decoded = decode_message(_ipc(fine), headers_for(REQUEST_RECORDS))
    assert decoded.table.column("itl_gaps_s").to_pylist() == [[0.5, float("inf")]]


J_REQ = headers_for(REQUEST_RECORDS, JSON_CONTENT_TYPE)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "not_json"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "not_json"),
        (json.dumps({**_one_request(), "request_id": "\ud800"}).encode(), "not_json"),
        (json.dumps({**_one_request(), "instance": "\udcff"}).encode(), "not_json"),
        (json.dumps({**_one_request(), "ttft_s": float("nan")}).encode(), "not_json"),
        (json.dumps({**_one_request(), "ttft_s": float("inf")}).encode(), "not_json"),
        (json.dumps({**_one_request(), "ttft_s": float("-inf")}).encode(), "not_json"),
        (json.dumps({**_one_request(), "attempt": 1.5}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "attempt": True}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "attempt": "1"}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "received_ts_ms": 10**30}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "itl_gaps_s": [1e300]}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "chunk_tokens": [1.5]}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "streamed": 1}).encode(), "schema_mismatch"),
        (json.dumps({**_one_request(), "itl_gaps_s": [[1.0]]}).encode(), "schema_mismatch"),
    ],
    ids=[
        "deeply nested arrays",
        "deeply nested objects",
        "a lone surrogate in a plain string",
        "a lone surrogate in a dictionary column",
        "NaN",
        "Infinity",
        "-Infinity",
        "a fraction for an int column",
        "a bool for an int column",
        "a numeric string for an int column",
        "an int beyond int64",
        "a double beyond float32 in a list",
        "a fraction in an int list",
        "an int for a bool",
        "a nested list",
    ],
)
def test_hostile_json_is_refused_with_a_reason(payload: bytes, reason: str) -> None:
    assert _reason(payload, J_REQ) == reason


def test_json_numbers_that_fit_exactly_are_accepted() -> None:
    row = {**_one_request(), "attempt": 2.0, "ttft_s": 1e300, "itl_gaps_s": [1, 0.25, 3e38]}
    decoded = decode_message(json.dumps(row).encode(), J_REQ)
    got = decoded.table.to_pylist()[0]
    assert got["attempt"] == 2
    assert got["ttft_s"] == 1e300
    assert got["itl_gaps_s"][:2] == [1.0, 0.25]
    assert math.isfinite(got["itl_gaps_s"][2])


def test_an_empty_json_array_is_zero_rows() -> None:
    decoded = decode_message(b"[]", J_REQ)
    assert decoded.table.num_rows == 0
    assert decoded.table.schema.equals(REQUEST_RECORDS.arrow, check_metadata=False)


# st.text() never draws surrogates, even from an alphabet that holds them: join characters.
_ANY_TEXT = st.lists(
    st.characters(exclude_categories=())
    | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    max_size=10,
).map("".join)


@settings(max_examples=60, deadline=None)
@given(text=_ANY_TEXT)
def test_json_strings_round_trip_unless_they_hold_a_lone_surrogate(text: str) -> None:
    payload = json.dumps({**_one_request(), "request_id": text, "tenant": text}).encode()
    # An escaped surrogate *pair* is one valid character once parsed; a lone one is not text.
    parsed = json.loads(json.dumps(text))
    if any("\ud800" <= char <= "\udfff" for char in parsed):
        assert _reason(payload, J_REQ) == "not_json"
    else:
        row = decode_message(payload, J_REQ).table.to_pylist()[0]
        assert (row["request_id"], row["tenant"]) == (parsed, parsed)


@pytest.mark.parametrize(
    "header",
    [
        "engine_sample.v\u00b9".encode(),  # superscript one: str.isdigit() is True
        "engine_sample.v\u0661".encode(),  # Arabic-Indic one: int() reads it as 1
        b"engine_sample.v" + b"9" * 5000,  # beyond int()'s digit limit
        b"engine_sample.v1234567",  # more than 6 digits
        b"engine_sample.v",
        b"engine_sample.v+1",
        b"engine_sample.v 1",
        b"\xff\xfe.v1",
    ],
)
def test_malformed_schema_versions_are_unknown_schema(header: bytes) -> None:
    with pytest.raises(UnknownSchemaError) as caught:
        lookup_schema(header)
    assert caught.value.reason == "unknown_schema"
    assert _reason(b"{}", [("llmslo-schema", header)]) == "unknown_schema"


@pytest.mark.parametrize(
    "headers",
    [
        [("llmslo-schema", b"request_record.v1"), ("content-type", b"Application/JSON")],
        [
            ("llmslo-schema", b"request_record.v1"),
            ("content-type", b"application/json; charset=utf-8"),
        ],
        [("LLMSLO-Schema", "request_record.v1"), ("Content-Type", "application/json")],
        [(b"llmslo-schema", b"request_record.v1"), (b"content-type", b"APPLICATION/JSON ")],
    ],
    ids=["mixed case", "with parameters", "str values", "bytes keys"],
)
def test_headers_are_matched_leniently(headers: list) -> None:
    decoded = decode_message(json.dumps(_one_request()).encode(), headers)
    assert decoded.table.column("request_id").to_pylist() == ["r1"]


@pytest.mark.parametrize(
    "content_type",
    ["Application/Vnd.Apache.Arrow.Stream; codec=lz4", None, b"", "absent"],
)
def test_arrow_is_recognised_and_is_the_default(content_type: str | bytes | None) -> None:
    table = pa.Table.from_pylist([_engine_row()], schema=ENGINE_SAMPLES.arrow)
    headers: list = [("llmslo-schema", "engine_sample.v1")]
    if content_type != "absent":
        headers.append(("Content-Type", content_type))
    assert decode_message(encode_arrow(ENGINE_SAMPLES, table), headers).table.num_rows == 1


def test_an_unexpected_exception_becomes_decode_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    # Defence in depth: a bug below decode_message must not escape into the ingest loop.
    def broken(schema: RecordSchema, table: pa.Table) -> pa.Table:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(codec, "conform", broken)
    with pytest.raises(DecodeError) as caught:
        decode_message(json.dumps(_one_request()).encode(), J_REQ)
    assert caught.value.reason == "decode_crash"
    assert "ZeroDivisionError" in str(caught.value)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
