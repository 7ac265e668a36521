"""Retention prunes the series with their samples: pod churn does not grow ``*_series``."""

from __future__ import annotations

from pipeline.codec import conform
from pipeline.schema import ENGINE_SAMPLES
from pipeline.store import Store
from tests.pipeline.ingest_helpers import numbered_samples


def _commit(store: Store, first_ts_ms: int, instance: str) -> None:
    store.commit_batch(
        {"engine_samples": [conform(ENGINE_SAMPLES, numbered_samples(first_ts_ms, 10, instance))]},
        group_id="g",
        offsets={},
        now_ts_ms=0,
    )


def _series(store: Store) -> list[str]:
    rows = store.con.execute("SELECT instance FROM engine_samples_series ORDER BY 1").fetchall()
    return [instance for (instance,) in rows]


def test_pruning_samples_drops_the_series_left_without_any(store: Store) -> None:
    _commit(store, 0, "pod-gone")  # ts 0 … 9
    _commit(store, 1_000, "pod-live")  # ts 1000 … 1009
    _commit(store, 5, "pod-live")  # pod-live also has old samples: it keeps its series
    deleted = store.prune(before_ts_ms=500)
    assert deleted["engine_samples_values"] == 20
    assert deleted["engine_samples_series"] == 1
    assert _series(store) == ["pod-live"]
    assert store.count("engine_samples") == 10


def test_a_pruned_series_that_comes_back_is_stored_again(store: Store) -> None:
    _commit(store, 0, "pod-a")
    store.prune(before_ts_ms=500)
    assert _series(store) == []
    _commit(store, 1_000, "pod-a")  # the same series (same hash) after its pruning
    rows = store.con.execute("SELECT instance, ts_ms FROM engine_samples ORDER BY ts_ms").fetchall()
    assert rows == [("pod-a", 1_000 + i) for i in range(10)]
    assert _series(store) == ["pod-a"]


def test_pruned_series_stay_pruned_after_reopening(tmp_path) -> None:
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        _commit(store, 0, "pod-a")
        store.prune(before_ts_ms=500)
    with Store(path) as store:
        _commit(store, 1_000, "pod-a")
        assert store.count("engine_samples") == 10
