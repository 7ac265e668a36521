"""Series normalisation: the view gives back exactly the rows stored, ids are stable."""

from __future__ import annotations

import gc
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.codec import conform
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, RecordSchema
from pipeline.series import SeriesIndex, series_ids
from pipeline.store import Store
from tests.pipeline.strategies import rows_strategy


def _table(schema: RecordSchema, rows: list[dict]) -> pa.Table:
    return conform(schema, pa.Table.from_pylist(rows, schema=schema.arrow))


def _value(value: object) -> str:
    # Equal values are one series: -0.0 is stored as the 0.0 of the same series, and so on.
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value + 0.0)
    return repr(value)


def _canonical(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted((k, _value(v)) for k, v in row.items())) for row in rows)


@settings(max_examples=10, deadline=None)
@given(data=st.data(), schema=st.sampled_from([ENGINE_SAMPLES, GPU_SAMPLES]))
def test_the_view_returns_exactly_the_rows_committed(
    tmp_path_factory, data, schema: RecordSchema
) -> None:
    batches = [data.draw(rows_strategy(schema)) for _ in range(data.draw(st.integers(1, 3)))]
    path: Path = tmp_path_factory.mktemp("series") / "s.duckdb"
    with Store(path) as store:
        for rows in batches:
            # Each batch twice in one commit: repeated series are stored once.
            parts = [_table(schema, rows), _table(schema, rows)]
            store.commit_batch({schema.table: parts}, group_id="g", offsets={}, now_ts_ms=0)
        stored = store.con.sql(f"SELECT * FROM {schema.table}").to_arrow_table().to_pylist()
        series = store.con.execute(
            f"SELECT count(*), count(DISTINCT series_id) FROM {schema.table}_series"
        ).fetchone()
    expected = [row for rows in batches for row in rows for _ in range(2)]
    assert _canonical(stored) == _canonical([_table(schema, [r]).to_pylist()[0] for r in expected])
    assert series is not None and series[0] == series[1]  # no series stored twice


def test_series_ids_depend_on_values_only_not_on_encoding() -> None:
    rows = [
        {"ts_ms": 1, "instance": "a:1", "metric": "m", "kind": "bucket", "le": 2.0, "value": 1.0},
        {"ts_ms": 1, "instance": "b:1", "pool": "p", "metric": "m", "kind": "gauge", "value": 1.0},
    ]
    as_dictionary = _table(ENGINE_SAMPLES, rows)
    plain = as_dictionary.cast(ENGINE_SAMPLES.storage_arrow)
    assert pa.types.is_string(plain.schema.field("instance").type)  # really a different encoding
    assert pa.types.is_dictionary(as_dictionary.schema.field("instance").type)
    columns = ENGINE_SAMPLES.series_columns
    ids = series_ids(as_dictionary, columns)
    assert ids.tolist() == series_ids(plain, columns).tolist()
    assert ids[0] != ids[1]
    assert (ids >= 0).all()


def _with(row_overrides: dict, **columns: pa.Array) -> pa.Table:
    row = {"ts_ms": 1, "instance": "a:1", "metric": "m", "kind": "bucket", "value": 1.0}
    table = _table(ENGINE_SAMPLES, [{**row, **row_overrides}])
    for name, array in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, array)
    return table


def _id(table: pa.Table) -> int:
    return int(series_ids(table, ENGINE_SAMPLES.series_columns)[0])


def test_series_ids_tell_different_values_apart() -> None:
    assert _id(_with({"le": 2.0})) != _id(_with({"le": 2.5}))
    assert _id(_with({"le": 2.0})) != _id(_with({"le": None}))
    assert _id(_with({"le": 0.0})) != _id(_with({"le": None}))
    assert _id(_with({"pool": "None"})) != _id(_with({"pool": None}))


def test_negative_zero_is_the_same_bound_as_zero() -> None:
    assert _id(_with({"le": -0.0})) == _id(_with({"le": 0.0}))


def test_every_nan_payload_is_one_series() -> None:
    payloads = np.array([0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000ABC], np.uint64)
    nans = payloads.view(np.float64)
    assert np.isnan(nans).all() and len({int(b) for b in payloads}) == 3
    ids = {_id(_with({}, le=pa.array([value], pa.float64()))) for value in nans}
    assert len(ids) == 1
    assert ids != {_id(_with({"le": None}))}


def test_a_null_dictionary_entry_is_the_same_series_as_a_masked_null() -> None:
    null_entry = pa.DictionaryArray.from_arrays(
        pa.array([0], pa.int32()), pa.array([None], pa.string())
    )
    assert null_entry.null_count == 0  # the null is in the dictionary, not in the mask
    assert _id(_with({}, pool=null_entry)) == _id(_with({"pool": None}))


def test_a_series_is_new_until_it_is_marked_stored() -> None:
    index = SeriesIndex(ENGINE_SAMPLES)
    row = {"ts_ms": 1, "instance": "a:1", "metric": "m", "kind": "gauge", "value": 1.0}
    table = conform(ENGINE_SAMPLES, pa.Table.from_pylist([row]))
    first = index.split(table)
    assert first.new_series.num_rows == 1
    assert index.split(table).new_series.num_rows == 1  # a rolled-back commit did not store it
    index.mark_stored(first.new_series.column("series_id").combine_chunks())
    assert index.split(table).new_series.num_rows == 0
    assert index.split(table).new_series.num_rows == 0  # and the fingerprint shortcut agrees


def test_known_series_survive_reopening_the_file(tmp_path: Path) -> None:
    row = {"ts_ms": 1, "instance": "a:1", "metric": "m", "kind": "gauge", "value": 1.0}
    table = conform(ENGINE_SAMPLES, pa.Table.from_pylist([row]))
    for _ in range(2):
        with Store(tmp_path / "s.duckdb") as store:
            store.commit_batch({"engine_samples": [table]}, group_id="g", offsets={}, now_ts_ms=0)
    with Store(tmp_path / "s.duckdb", read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM engine_samples_series").fetchone() == (1,)
        assert store.count("engine_samples") == 2


def _engine_table(instances: list[str]) -> pa.Table:
    rows = [
        {"ts_ms": i, "instance": instance, "metric": "m", "kind": "gauge", "value": 1.0}
        for i, instance in enumerate(instances)
    ]
    return _table(ENGINE_SAMPLES, rows)


@pytest.mark.parametrize(
    "message_rows",
    [[0, 3], [3, 0], [0], [1, 0, 2], [0, 0, 3, 0]],
    ids=["empty first", "empty last", "only an empty one", "empty between", "several"],
)
def test_zero_row_messages_split_like_the_others(message_rows: list[int]) -> None:
    table = _engine_table(["a", "b", "a"][: sum(message_rows)])
    index = SeriesIndex(ENGINE_SAMPLES)
    for _ in range(2):  # the second time through the fingerprint shortcut
        split = index.split(table, message_rows)
        assert split.values.num_rows == table.num_rows
        assert sorted(split.new_series.column("instance").to_pylist()) == sorted(
            set(table.column("instance").to_pylist())
        )
    index.mark_stored(split.new_series.column("series_id").combine_chunks())
    assert index.split(table, message_rows).new_series.num_rows == 0


def test_an_empty_table_splits_into_nothing() -> None:
    empty = _engine_table([])
    for message_rows in (None, [0], [0, 0]):
        split = SeriesIndex(ENGINE_SAMPLES).split(empty, message_rows)
        assert split.values.num_rows == 0 and split.new_series.num_rows == 0
        assert split.new_series.column_names == ["series_id", *ENGINE_SAMPLES.series_columns]


def test_message_rows_that_do_not_add_up_are_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="do not add up"):
        SeriesIndex(ENGINE_SAMPLES).split(_engine_table(["a", "b"]), [1, 2])


def test_a_message_with_the_same_id_sum_is_not_mistaken_for_a_known_one() -> None:
    # White box: ids are hashes, so craft them directly. Both messages have two rows and
    # the same Σid (mod 2^64); a fingerprint linear in the ids could not tell them apart.
    known = np.array([10, 20], np.int64)
    unknown = np.array([5, 25], np.int64)
    index = SeriesIndex(ENGINE_SAMPLES, known)
    assert index._unknown_rows(known, [2]).tolist() == []  # remembered as complete
    assert index._unknown_rows(unknown, [2]).tolist() == [0, 1]
    # and the sums of ids times a constant agree too, so only a non-linear mix helps
    mix = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        assert (known.view(np.uint64) * mix).sum() == (unknown.view(np.uint64) * mix).sum()


@pytest.mark.parametrize("empty_at", ["last", "only", "first"])
def test_a_batch_with_an_empty_message_commits(tmp_path: Path, empty_at: str) -> None:
    # The reviewer's poison pill: JSON "[]" decodes to zero rows; a batch holding it died.
    empty = _engine_table([])
    full = _engine_table(["a", "b"])
    parts = {"last": [full, empty], "only": [empty], "first": [empty, full, full]}[empty_at]
    with Store(tmp_path / "s.duckdb") as store:
        for _ in range(2):  # the second time the series are known (fingerprint shortcut)
            store.commit_batch({"engine_samples": parts}, group_id="g", offsets={}, now_ts_ms=0)
        rows = sum(part.num_rows for part in parts)
        assert store.count("engine_samples") == 2 * rows
        series = store.con.execute("SELECT count(*) FROM engine_samples_series").fetchone()
    assert series == ((2,) if rows else (0,))


def test_a_fleet_renamed_again_and_again_keeps_the_index_caches_small() -> None:
    """Pods renamed on every rollout bring new values and new message shapes for good; the
    caches of values and of complete messages stay bounded by bytes the ingester can spare
    (the series ids themselves, 8 B each, are what the index must keep)."""
    renamed = 80_000
    table = _engine_table([f"pod-{i:06d}.rollout-{i // 1000}" for i in range(renamed)])
    index = SeriesIndex(ENGINE_SAMPLES)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        split = index.split(table, [1] * renamed)  # every value and every message new
        index.mark_stored(split.new_series.column("series_id").combine_chunks())
        assert index.split(table, [1] * renamed).new_series.num_rows == 0  # all complete now
        del split
        gc.collect()
        held_mb = (tracemalloc.get_traced_memory()[0] - before) / 1e6
    finally:
        tracemalloc.stop()
    assert held_mb < 16, f"the index holds {held_mb:.1f} MB after {renamed:,} renamed series"
