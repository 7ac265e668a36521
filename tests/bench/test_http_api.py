"""``bench/http_api.py``'s served phase against a real read-only ``llmslo api`` process:
the verdict both ways, the readers' load, the 1 GiB-style body, and how repeats merge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import http_api
from pipeline.store import Store


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, int]]:
    """A small store (one request per instance and hour) served read-only."""
    db = tmp_path_factory.mktemp("bench") / "bench.duckdb"
    with Store(db) as store:
        http_api.fill(store, per_hour=1)
    process, url = http_api.start_api(db, "--read-only")
    try:
        yield db, url, process.pid
    finally:
        http_api.stop(process)


@pytest.fixture
def pair(served: tuple[Path, str, int]) -> Iterator[http_api.VerdictPair]:
    """The bench's verdict pair over the last 12 hours of the served store."""
    db, url, _ = served
    verdicts = http_api.VerdictPair(db, url, "12h")
    try:
        yield verdicts
    finally:
        verdicts.close()


def stored_requests(pair: http_api.VerdictPair, instances: list[str]) -> int:
    """Requests of ``instances`` in the pair's 12 hours, counted straight in DuckDB."""
    row = pair.con.execute(
        "SELECT count(*) FROM requests WHERE list_contains(?, instance)"
        " AND received_ts_ms >= ? AND received_ts_ms < ?",
        [instances, http_api.END_MS - 12 * 3_600_000, http_api.END_MS],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_verdict_is_the_same_direct_and_through_the_api(
    pair: http_api.VerdictPair,
) -> None:
    direct, api = pair.direct(), pair.api()
    figures = pair.run(count=3)
    assert direct["summary"] == api["summary"]
    assert direct["summary"]["canaryRequests"] == stored_requests(pair, http_api.CANARY)
    assert figures["runs"] == 3 and "overhead_paired_p50_ms" in figures
    assert figures["api"]["p50_ms"] > 0 and figures["direct"]["p50_ms"] > 0


def test_an_unauthenticated_huge_body_is_answered_401_before_it_is_sent(
    served: tuple[Path, str, int],
) -> None:
    _, url, pid = served
    body = http_api.bench_big_body(url, pid, total_bytes=256 << 20)
    assert body["status"] == 401
    assert body["sent_mib"] < 64  # the answer came while most of the body was unsent
    assert body["rss_peak_delta_mib"] < 64


def test_readers_are_counted_by_status_and_health_is_probed(
    served: tuple[Path, str, int], pair: http_api.VerdictPair
) -> None:
    loaded = http_api.bench_under_load(pair, served[1], seconds=1.0)
    reads = loaded["reads"]
    assert reads["readers"] == http_api.READERS
    assert reads["answered"] == reads["ok_200"] + reads["shed_503"] + sum(reads["other"].values())
    assert reads["ok_200"] > 0
    # How many probes fit in the second is a figure for the benchmark, not a test.
    assert loaded["healthz"]["probes"] >= 1 and loaded["healthz"]["failed"] == 0
    assert loaded["verdict"]["runs"] >= 1


def test_a_huge_body_is_generated_a_bounded_chunk_at_a_time() -> None:
    total = (5 << 20) + 3
    sizes = [len(chunk) for chunk in http_api._chunks(total)]
    assert sum(sizes) == total and max(sizes) == 1 << 20 and sizes[-1] == 3


def test_repeats_merge_into_the_median_of_each_figure() -> None:
    repeats = [
        {"api": {"p99_ms": 30.0}, "runs": 10, "other": {"500": 2}, "note": "a"},
        {"api": {"p99_ms": 10.0}, "runs": 12, "other": {}, "note": "b"},
        {"api": {"p99_ms": 20.0}, "runs": 11, "other": {}, "note": "c"},
    ]
    assert http_api.median_of(repeats) == {
        "api": {"p99_ms": 20.0},
        "runs": 11,
        "other": {"500": 2},
        "note": "a",
    }
