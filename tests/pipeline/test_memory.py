"""Where the process's memory is: DuckDB's own accounting, glibc's heap, pyarrow's pool."""

from __future__ import annotations

import ctypes.util
import platform

import duckdb
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pipeline.memory import MemoryCollector, duckdb_memory_bytes, malloc_bytes


def _served(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmslo_memory_bytes{")
    }


def test_duckdb_reports_the_rows_it_holds_and_its_limit() -> None:
    con = duckdb.connect(config={"memory_limit": "100MB"})
    before, limit = duckdb_memory_bytes(con)
    con.execute("CREATE TABLE t AS SELECT range AS x, range::VARCHAR AS s FROM range(2000000)")
    after, _ = duckdb_memory_bytes(con)
    assert limit == pytest.approx(100_000_000, rel=1e-3)  # DuckDB prints it as "95.3 MiB"
    assert after - before > 10_000_000  # two million rows of two columns, in memory


@pytest.mark.skipif(
    platform.system() != "Linux" or ctypes.util.find_library("c") is None, reason="glibc only"
)
def test_the_c_heap_counts_what_is_allocated_and_given_back() -> None:
    before = malloc_bytes()
    held = [bytearray(4096) for _ in range(5_000)]  # 20 MB in blocks malloc serves itself
    during = malloc_bytes()
    assert during["in_use"] - before["in_use"] > 15_000_000
    del held
    assert malloc_bytes()["in_use"] < during["in_use"] - 15_000_000


def test_the_collector_serves_every_part_through_its_own_cursor() -> None:
    con = duckdb.connect(config={"memory_limit": "64MB"})
    registry = CollectorRegistry()
    MemoryCollector(con.cursor(), registry=registry)
    buffer = pa.allocate_buffer(8_000_000)
    parts = _served(registry)
    assert parts["duckdb_limit"] == pytest.approx(64_000_000, rel=1e-3)
    assert parts["duckdb"] >= 0
    assert parts["arrow"] >= 8_000_000
    del buffer
    if malloc_bytes():
        assert parts["malloc_in_use"] > 0 and parts["malloc_free"] >= 0


def test_a_closed_store_leaves_the_other_parts_served() -> None:
    con = duckdb.connect()
    cursor = con.cursor()
    registry = CollectorRegistry()
    MemoryCollector(cursor, registry=registry)
    cursor.close()
    parts = _served(registry)
    assert "duckdb" not in parts and "arrow" in parts
