"""Probe records are not user traffic: the request reads count the taps' records only,
unless asked for the prober's (``source="probe"``).

A day of tap history with a prober's records mixed in (same pool, its own entry point, slow
and often failing) must read exactly like the day without them, from raw rows and from the
rollups; ``source="probe"`` must read like the probe records alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import simulator.history as history
from pipeline.errors import QueryError
from pipeline.store import Store
from pipeline.units import HOUR_MS, MINUTE_MS
from slo import queries
from slo.rollups.requests import (
    REQUEST_ROLLUP_VERSION,
    RequestRollup,
    read_coverage,
    rollup_history,
)
from tests.slo.factories import insert, request

END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS
START_MS = END_MS - 86_400_000
POOL = "llama-3-8b"
ENTRY = "gateway:8080"
METRICS = ("ttft", "tpot", "e2e", "itl")
#: Every 7th probe fails, in one of the ways an entry point fails (collectors/probe.py).
PROBE_FAILURES = (
    ("error_before_first_token", "http_503"),
    ("upstream_timeout", "read_timeout"),
    ("rejected", "http_429"),
)


def probe_records(*, as_tap: bool = False) -> list[dict[str, Any]]:
    """A prober's records over the day: one every 40 s, TTFT ~1.2 s (well above the taps').

    ``as_tap``: the same records without ``source`` (what they would be if a tap had seen
    them), to read them with the default reads in a file of their own."""
    rows = []
    for i, at in enumerate(range(START_MS + 13_000, END_MS, 40_000)):
        row = request(
            at,
            request_id=f"probe-{i}",
            original_request_id=f"probe-{i}",
            tap_id=None,
            instance=ENTRY,
            address=ENTRY,
            pool=POOL,
            tenant="probe",
            ttft_s=1.2 + (i % 17) * 0.05,
            tpot_s=0.04 + (i % 5) * 0.01,
            e2e_s=1.6 + (i % 11) * 0.1,
            itl_gaps_s=[0.04, 0.05, 0.06] if i % 3 == 0 else None,
            source=None if as_tap else "probe",
        )
        if i % 7 == 6:
            outcome, error_kind = PROBE_FAILURES[i % len(PROBE_FAILURES)]
            row.update(outcome=outcome, error_kind=error_kind, ttft_s=None, tpot_s=None)
        rows.append(row)
    return rows


def _tap_history(path: Path) -> None:
    """A generated day of 3 pods, plus tap records with ITL gaps (the generator has none)."""
    config = history.HistoryConfig(days=1, end_ts_ms=END_MS, pods=3, incidents_per_day=1, seed=5)
    with Store(path) as store:
        for schema, table in history.HistoryGenerator(config).chunks():
            store.commit_batch({schema.table: [table]}, group_id="h", offsets={}, now_ts_ms=0)
        gaps = [
            request(
                START_MS + i * 1_111_000,
                instance=f"pod-{i % 3}",
                pool=POOL,
                itl_gaps_s=list(np.random.default_rng(i).lognormal(np.log(0.03), 0.5, 20 + i)),
            )
            for i in range(70)
        ]
        insert(store, gaps)


def _rolled(path: Path) -> Path:
    rolled = path.with_name(path.stem + "-rolled.duckdb")
    rolled.write_bytes(path.read_bytes())
    with Store(rolled) as store:
        rollup_history(store.con)
    return rolled


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tap``: the taps' day; ``mixed``: the same plus the probe records; ``probes``: the
    probe records alone, as tap records; each raw and ``…-rolled`` (with rollups)."""
    folder = tmp_path_factory.mktemp("request-sources")
    tap, mixed, probes = folder / "tap.duckdb", folder / "mixed.duckdb", folder / "probes.duckdb"
    _tap_history(tap)
    mixed.write_bytes(tap.read_bytes())
    with Store(mixed) as store:
        insert(store, probe_records())
    with Store(probes) as store:
        insert(store, probe_records(as_tap=True))
    paths = {"tap": tap, "mixed": mixed, "probes": probes}
    return {**paths, **{f"{name}-rolled": _rolled(path) for name, path in paths.items()}}


@pytest.fixture
def con(files: dict[str, Path]) -> Iterator[Any]:
    opened: list[duckdb.DuckDBPyConnection] = []

    def connect(name: str) -> duckdb.DuckDBPyConnection:
        opened.append(duckdb.connect(str(files[name]), read_only=True))
        return opened[-1]

    yield connect
    for connection in opened:
        connection.close()


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows in a stable order, floats to 12 digits (summation order may differ)."""

    def value(v: Any) -> Any:
        return float(f"{v:.12g}") if isinstance(v, float) else v

    return sorted((tuple(value(v) for v in row.values()) for row in table.to_pylist()), key=repr)


RANGES = {
    "the day in hours": (START_MS, END_MS, HOUR_MS),
    "an unaligned range in 10-minute buckets": (START_MS + 17_321, END_MS - 41_000, 10 * MINUTE_MS),
}
SCOPES = {
    "per pool": {"by": "pool"},
    "per instance": {"by": "instance"},
    "one pool per instance": {"by": "instance", "pool": POOL},
}
STORES = {"raw records": "", "rollups": "-rolled"}


@pytest.mark.parametrize("kind", STORES.values(), ids=list(STORES))
@pytest.mark.parametrize("scope", SCOPES.values(), ids=list(SCOPES))
@pytest.mark.parametrize("grid", RANGES.values(), ids=list(RANGES))
def test_outcome_counts_are_those_of_the_tap_records_alone(
    con: Any, grid: tuple[int, int, int], scope: dict[str, str], kind: str
) -> None:
    start, end, bucket = grid
    args: dict[str, Any] = {"start_ms": start, "end_ms": end, "bucket_ms": bucket, **scope}
    expected = queries.outcome_counts(con("tap" + kind), **args)
    answer = queries.outcome_counts(con("mixed" + kind), **args)
    assert expected.num_rows > 0
    assert ENTRY not in answer["instance"].to_pylist()
    assert _rows(answer) == _rows(expected)


@pytest.mark.parametrize("kind", STORES.values(), ids=list(STORES))
@pytest.mark.parametrize("by", ["pool", "instance"])
@pytest.mark.parametrize("metric", METRICS)
def test_latency_percentiles_are_those_of_the_tap_records_alone(
    con: Any, metric: str, by: str, kind: str
) -> None:
    for start, end, bucket in RANGES.values():
        args: dict[str, Any] = {
            "start_ms": start,
            "end_ms": end,
            "bucket_ms": bucket,
            "by": by,
            "metric": metric,
        }
        expected = queries.latency_percentiles(con("tap" + kind), **args)
        answer = queries.latency_percentiles(con("mixed" + kind), **args)
        assert expected.num_rows > 0
        assert _rows(answer) == _rows(expected)


def test_the_rollup_tables_hold_the_tap_records_only(con: Any) -> None:
    mixed = con("mixed-rolled")
    (taps,) = mixed.execute(
        "SELECT count(*) FROM requests WHERE source IS DISTINCT FROM 'probe'"
    ).fetchone()
    (probes,) = mixed.execute("SELECT count(*) FROM requests WHERE source = 'probe'").fetchone()
    assert probes > 2_000
    assert mixed.execute("SELECT sum(attempts) FROM request_hour").fetchone() == (taps,)
    latency = "SELECT sum(samples) FROM request_latency_pool_hour WHERE metric = 'e2e'"
    assert mixed.execute(latency).fetchone() == (taps,)
    assert mixed.execute(
        "SELECT count(*) FROM request_hour WHERE instance = ?", [ENTRY]
    ).fetchone() == (0,)


def test_meta_lists_engine_instances_not_the_probed_entry_point(con: Any) -> None:
    for kind in STORES.values():
        mixed, tap = queries.meta(con("mixed" + kind)), queries.meta(con("tap" + kind))
        assert ENTRY not in {i["instance"] for i in mixed["instances"]}
        assert mixed["instances"] == tap["instances"] and mixed["pools"] == tap["pools"]


def test_ghost_counts_are_the_taps_side_only(con: Any) -> None:
    args: dict[str, Any] = {"start_ms": START_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS}
    expected = queries.ghost_counts(con("tap"), **args)
    assert _rows(queries.ghost_counts(con("mixed"), **args)) == _rows(expected)


@pytest.mark.parametrize("kind", STORES.values(), ids=list(STORES))
@pytest.mark.parametrize("by", ["pool", "instance"])
def test_source_probe_reads_the_probe_records_alone(con: Any, by: str, kind: str) -> None:
    for start, end, bucket in RANGES.values():
        args: dict[str, Any] = {"start_ms": start, "end_ms": end, "bucket_ms": bucket, "by": by}
        # The probes' own file holds them as tap records, read exactly (no rollup).
        expected = queries.outcome_counts(con("probes"), **args)
        answer = queries.outcome_counts(con("mixed" + kind), **args, source="probe")
        assert expected.num_rows > 0 and set(answer["outcome"].to_pylist()) > {"ok"}
        assert _rows(answer) == _rows(expected)
        for metric in ("ttft", "e2e"):
            exact = queries.latency_percentiles(con("probes"), metric=metric, **args)
            probe = queries.latency_percentiles(
                con("mixed" + kind), metric=metric, **args, source="probe"
            )
            assert _rows(probe) == _rows(exact)


def test_source_tap_is_the_default(con: Any) -> None:
    args: dict[str, Any] = {"start_ms": START_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS}
    mixed = con("mixed-rolled")
    assert _rows(queries.outcome_counts(mixed, **args, source="tap")) == _rows(
        queries.outcome_counts(mixed, **args)
    )
    assert _rows(queries.latency_percentiles(mixed, metric="ttft", **args, source="tap")) == _rows(
        queries.latency_percentiles(mixed, metric="ttft", **args)
    )


@pytest.mark.parametrize("value", ["probes", "PROBE", "", "tap ", None, 1])
def test_an_unknown_source_is_refused_naming_the_parameter(con: Any, value: Any) -> None:
    args: dict[str, Any] = {"start_ms": START_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS}
    mixed = con("mixed")
    with pytest.raises(QueryError, match="must be one of tap, probe") as raised:
        queries.outcome_counts(mixed, **args, source=value)
    assert raised.value.parameter == "source"
    with pytest.raises(QueryError) as raised:
        queries.latency_percentiles(mixed, metric="ttft", **args, source=value)
    assert raised.value.parameter == "source"


def test_rollups_of_the_previous_version_with_probes_in_them_are_not_read(
    tmp_path: Path,
) -> None:
    """A file rolled up before probes were left out: reads go raw, the next update rebuilds."""
    path = tmp_path / "old.duckdb"
    with Store(path) as store:
        at = END_MS - 30 * MINUTE_MS
        insert(store, [request(at + m * MINUTE_MS, instance="pod-0") for m in range(20)])
        insert(store, [r for r in probe_records() if r["received_ts_ms"] >= at])
        rollup = RequestRollup(store.con)
        rollup.update(END_MS)
        # What the previous version stored: the probes' attempts counted in with the taps'.
        store.con.execute(
            "INSERT INTO request_minute SELECT received_ts_ms // 60000 * 60000, pool, "
            "instance, address, outcome, count(*), count(*), count(*) FROM requests "
            "WHERE source = 'probe' GROUP BY ALL"
        )
        store.con.execute(
            "INSERT INTO request_hour SELECT ts_ms // 3600000 * 3600000, pool, instance, "
            "address, outcome, sum(attempts), sum(requests), sum(pool_requests) "
            "FROM request_minute WHERE instance = ? GROUP BY ALL",
            [ENTRY],
        )
        store.con.execute(
            "UPDATE request_rollup_state SET version = ?", [REQUEST_ROLLUP_VERSION - 1]
        )
        args: dict[str, Any] = {"start_ms": at, "end_ms": END_MS, "bucket_ms": HOUR_MS}

        def attempts() -> int:
            return sum(queries.outcome_counts(store.con, **args)["attempts"].to_pylist())

        assert read_coverage(store.con) is None
        assert attempts() == 20
        rollup.update(END_MS + MINUTE_MS)
        assert read_coverage(store.con) is not None
        assert attempts() == 20
        assert store.con.execute("SELECT sum(attempts) FROM request_hour").fetchone() == (20,)
