"""A store that checkpoints itself: commits past DuckDB's default threshold carry no
checkpoint, and :meth:`Store.checkpoint` empties the log with every row kept."""

from __future__ import annotations

from pathlib import Path

from pipeline.store import Store


def _wal_bytes(path: Path) -> int:
    wal = path.with_name(path.name + ".wal")
    return wal.stat().st_size if wal.exists() else 0


def _commit_10_mb(store: Store) -> None:
    # Under a row group, so the rows go through the log (larger inserts skip it).
    with store.transaction("write 10 MB of log") as con:
        con.execute("INSERT INTO big SELECT repeat('x', 200) || range FROM range(50000)")


def _store_with_table(path: Path, threshold: str | None) -> Store:
    store = Store(path, checkpoint_threshold=threshold)
    store.con.execute("CREATE TABLE big (s VARCHAR)")
    store.checkpoint()
    return store


def test_commits_past_the_default_threshold_checkpoint_by_themselves(tmp_path: Path) -> None:
    with _store_with_table(tmp_path / "default.duckdb", None) as store:
        for _ in range(3):
            _commit_10_mb(store)
        assert _wal_bytes(store.path) < 10_000_000  # the third commit checkpointed


def test_a_raised_threshold_leaves_the_checkpoint_to_the_writer(tmp_path: Path) -> None:
    with _store_with_table(tmp_path / "raised.duckdb", "256MB") as store:
        for _ in range(3):
            _commit_10_mb(store)
        assert _wal_bytes(store.path) > 30_000_000  # no commit checkpointed
        store.checkpoint()
        assert _wal_bytes(store.path) == 0
    with Store(tmp_path / "raised.duckdb", read_only=True) as reopened:
        assert reopened.con.execute("SELECT count(*) FROM big").fetchone() == (150_000,)
