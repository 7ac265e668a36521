"""Series normalisation: the view gives back exactly the rows stored, ids are stable."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.codec import conform
from pipeline.schema import ENGINE_SAMPLES, GPU_SAMPLES, RecordSchema
from pipeline.series import SeriesIndex, series_ids
from pipeline.store import Store
from tests.pipeline.strategies import rows_strategy


def _table(schema: RecordSchema, rows: list[dict]) -> pa.Table:
    return conform(schema, pa.Table.from_pylist(rows, schema=schema.arrow))


def _canonical(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(sorted((k, repr(v)) for k, v in row.items())) for row in rows)


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
    row = {"ts_ms": 1, "instance": "a:1", "metric": "m", "kind": "bucket", "le": 2.0, "value": 1.0}
    plain = pa.table({k: [v] for k, v in row.items()})
    as_dictionary = conform(ENGINE_SAMPLES, plain)
    columns = ENGINE_SAMPLES.series_columns
    assert (
        series_ids(conform(ENGINE_SAMPLES, plain), columns)[0]
        == series_ids(as_dictionary, columns)[0]
    )
    other_bound = conform(
        ENGINE_SAMPLES, pa.table({**{k: [v] for k, v in row.items()}, "le": [2.5]})
    )
    assert series_ids(other_bound, columns)[0] != series_ids(as_dictionary, columns)[0]
    null_bound = conform(
        ENGINE_SAMPLES,
        pa.table({**{k: [v] for k, v in row.items()}, "le": pa.array([None], pa.float64())}),
    )
    assert series_ids(null_bound, columns)[0] != series_ids(as_dictionary, columns)[0]


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
