"""Every read of user traffic leaves the prober's records out, through one definition.

Three stores over the same ten minutes of two pods:

* ``taps``: the stream taps' records: successes, failures before and after the first token,
  a retried request, cancels after the last token, ghosts, 503s, ITL gaps;
* ``mixed``: the same plus the prober's: a twin of every tap record on the same pod (its
  own ids, ten times slower, ``source = 'probe'``) and probes of the entry point;
* ``unmarked``: ``mixed`` with the prober's records carrying no ``source`` (as a tap would
  have written them).

Each user-traffic read must answer on ``mixed`` exactly as on ``taps``; and it must answer
differently on ``unmarked``, which proves the data would show a reader that forgot
:func:`slo.request_sources.source_filter`.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from pipeline.store import Store
from pipeline.units import MINUTE_MS
from slo import queries
from slo.request_sources import REQUEST_SOURCES, SOURCE_VALUES, source_filter
from slo.rollups.counts import Rollup
from slo.rollups.requests import RequestRollup
from slo.signals.snapshot import load_snapshot
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.slo.factories import T0_MS, insert, request

NOW_MS = T0_MS + 10 * MINUTE_MS
LOOKBACK_MS = 10 * MINUTE_MS
PODS = ("pod-a", "pod-b")
ENTRY = "gateway:8080"
REPO = Path(__file__).resolve().parents[2]


def _tap_records() -> list[dict[str, Any]]:
    """Every kind of record a detector or a rollup reads, on both pods, over ten minutes."""
    rows = []
    for i, at in enumerate(range(T0_MS + 1_000, NOW_MS - 1_000, 7_000)):
        pod = PODS[i % 2]
        row = request(
            at,
            instance=pod,
            ttft_s=0.2 + (i % 13) * 0.03,
            tpot_s=0.02 + (i % 7) * 0.002,
            e2e_s=2.0 + (i % 5) * 0.4,
            itl_gaps_s=[0.02, 0.03, 0.05] if i % 3 == 0 else None,
        )
        if i % 9 == 4:
            row.update(outcome="error_before_first_token", upstream_status=500, ttft_s=None)
        elif i % 9 == 5:
            row.update(outcome="interrupted_after_first_token", error_kind="upstream_eof")
        elif i % 9 == 6:
            row.update(
                outcome="client_cancelled",
                client_disconnected=True,
                disconnect_ts_ms=at + 2_500,
                upstream_closed_ts_ms=at + 8_000,
                tokens_after_disconnect=40,
            )
        elif i % 9 == 7:
            row.update(outcome="rejected", http_status=503, upstream_status=503, ttft_s=None)
        elif i % 9 == 8:
            row.update(finish_reason="error")
        rows.append(row)
        if i % 11 == 3:  # a request whose first attempt failed on one pod, retried on the other
            rows[-1].update(outcome="error_before_first_token", upstream_status=502, ttft_s=None)
            retry = request(at + 400, instance=PODS[(i + 1) % 2], attempt=2)
            retry["original_request_id"] = rows[-1]["original_request_id"]
            rows.append(retry)
        if i % 10 == 2:  # a client that left after the last token, before [DONE]
            rows.append(
                request(
                    at + 300,
                    instance=pod,
                    outcome="client_cancelled",
                    client_disconnected=True,
                    disconnect_ts_ms=at + 3_500,
                )
            )
    return rows


def _probe_twins(taps: list[dict[str, Any]], source: str | None) -> list[dict[str, Any]]:
    """The prober's records: a slower twin of each tap record, and probes of the entry point."""
    twins = []
    for row in taps:
        twin = dict(row, source=source, tenant="probe", tap_id=None)
        twin["request_id"] = f"probe-{row['request_id']}"
        twin["original_request_id"] = f"probe-{row['original_request_id']}"
        for column in ("ttft_s", "tpot_s", "e2e_s", "itl_p99_s", "itl_jitter_s"):
            twin[column] = None if row[column] is None else row[column] * 10
        if row["itl_gaps_s"] is not None:
            twin["itl_gaps_s"] = [gap * 10 for gap in row["itl_gaps_s"]]
        twins.append(twin)
    entry = [
        request(at, instance=ENTRY, pool="llama-3-8b", source=source, ttft_s=1.5)
        for at in range(T0_MS + 5_000, NOW_MS, 30_000)
    ]
    return twins + entry


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("user-traffic")
    taps = _tap_records()
    contents = {
        "taps": taps,
        "mixed": taps + _probe_twins(taps, SOURCE_VALUES["probe"]),
        "unmarked": taps + _probe_twins(taps, None),
    }
    paths = {}
    for name, rows in contents.items():
        paths[name] = folder / f"{name}.duckdb"
        with Store(paths[name]) as store:
            insert(store, rows)
    return paths


@pytest.fixture
def read(files: dict[str, Path], tmp_path: Path) -> Callable[[str, Callable[[Store], Any]], Any]:
    """``read(name, reader)``: the reader's answer on a fresh copy of store ``name`` (some
    readers write their rollups first, as the jobs do)."""

    def run(name: str, reader: Callable[[Store], Any]) -> Any:
        copy = tmp_path / f"{name}.duckdb"
        shutil.copyfile(files[name], copy)
        with Store(copy) as store:
            return reader(store)

    return run


def _plain(value: Any) -> Any:
    """Comparable form: arrays as lists, floats to 12 digits, dataclasses as dicts."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in sorted(value.items())}
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if hasattr(value, "__dataclass_fields__"):
        return _plain(vars(value))
    return value


def _snapshot(store: Store) -> Any:
    snap = load_snapshot(store.con, NOW_MS, LOOKBACK_MS)
    return {
        "requests": snap.requests,
        "latency": snap.latency,
        "failures": snap.failures,
        "finished cancels": snap.finished_cancels_ms,
    }


SLOS = [
    {"name": "avail", "objective": 0.99, "sli": {"kind": "availability"}},
    {
        "name": "ttft",
        "objective": 0.99,
        "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 1.0},
        "group_by": ["instance"],
    },
    {
        "name": "jitter",
        "objective": 0.99,
        "sli": {"kind": "latency", "metric": "itl", "statistic": "jitter", "threshold_s": 0.1},
    },
    {"name": "goodput", "objective": 0.9, "sli": {"kind": "goodput", "targets_s": {"e2e": 5}}},
]


def _slo_minutes(store: Store) -> Any:
    model = build_model(parse_spec({"version": "llmslo/v1", "service": "svc", "slos": SLOS}))
    Rollup(store.con, model, horizon_ms=86_400_000).update(NOW_MS)
    return store.con.execute(
        "SELECT k.slo_id, k.pool, k.instance, m.ts_ms, m.total, m.bad "
        "FROM slo_minute m JOIN slo_keys k USING (key_id) ORDER BY ALL"
    ).fetchall()


def _request_rollups(store: Store) -> Any:
    RequestRollup(store.con).update(NOW_MS + 20 * MINUTE_MS)
    return {
        table: store.con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
        for table in ("request_minute", "request_latency_minute")
    }


def _series(function: Callable[..., Any], **args: Any) -> Callable[[Store], Any]:
    grid = {"start_ms": T0_MS, "end_ms": NOW_MS, "bucket_ms": 2 * MINUTE_MS}
    return lambda store: function(store.con, **grid, **args).to_pylist()


READERS: dict[str, Callable[[Store], Any]] = {
    "the detectors' snapshot (request stats, latency, failures, finished cancels)": _snapshot,
    "the SLO rollups (availability, TTFT per instance, ITL jitter, goodput)": _slo_minutes,
    "the request rollups (outcomes and latency bins)": _request_rollups,
    "outcome counts per instance": _series(queries.outcome_counts, by="instance"),
    "TTFT percentiles per pool": _series(queries.latency_percentiles, metric="ttft"),
    "ITL percentiles per instance": _series(
        queries.latency_percentiles, metric="itl", by="instance"
    ),
    "ghost counts": _series(queries.ghost_counts),
    "the instances the dashboards list": lambda store: queries.meta(store.con)["instances"],
}


@pytest.mark.parametrize("reader", READERS.values(), ids=list(READERS))
def test_a_user_traffic_read_answers_as_if_the_prober_had_never_run(
    read: Callable[..., Any], reader: Callable[[Store], Any]
) -> None:
    expected = _plain(read("taps", reader))
    assert expected, "the taps' records must give the reader something to answer"
    assert _plain(read("unmarked", reader)) != expected, "the probes must show if counted"
    assert _plain(read("mixed", reader)) == expected


def test_the_detectors_still_see_the_probes_of_each_probed_target(
    read: Callable[..., Any],
) -> None:
    probes = read("mixed", lambda store: load_snapshot(store.con, NOW_MS, LOOKBACK_MS).probes)
    assert set(probes) == {*PODS, ENTRY}
    assert sum(len(series) for series in probes.values()) == read(
        "mixed",
        lambda store: store.con.execute(
            "SELECT count(*) FROM requests WHERE source = 'probe'"
        ).fetchone()[0],
    )


def test_every_record_is_of_exactly_one_source(tmp_path: Path) -> None:
    """The filters split the table: a value no kind claims (a producer's own) is the taps'."""
    with duckdb.connect(str(tmp_path / "sources.duckdb")) as con:
        con.execute(
            "CREATE TABLE requests AS SELECT * FROM (VALUES (NULL), ('probe'), ('x')) t(source)"
        )
        kept = {
            source: sorted(
                (
                    row[0]
                    for row in con.execute(
                        f"SELECT source FROM requests AS r WHERE {source_filter(source, table='r')}"
                    ).fetchall()
                ),
                key=str,
            )
            for source in REQUEST_SOURCES
        }
    assert tuple(SOURCE_VALUES) == REQUEST_SOURCES  # every kind has its column value
    assert kept == {"tap": [None, "x"], "probe": ["probe"]}


#: Library modules that read ``requests`` without choosing a kind, and why that is right.
READS_OF_EVERY_KIND = {
    "slo/jobs.py": "the data clock: the newest record of any kind is the event time",
    "llmslo/demo.py": "the demo's summary of enforced actions, whoever was refused",
    "slo/replay.py": "the history's extent: the oldest and newest record of any kind bound it",
}
_LIBRARY = ("pipeline", "collectors", "simulator", "slo", "alerts", "api", "dashboards", "llmslo")
_READS_REQUESTS = re.compile(r"\b(?:FROM|JOIN)\s+requests\b")
#: A ``source`` condition spelled by hand in SQL (``ready_source`` and kin do not match).
_SOURCE_CONDITION = re.compile(
    r"(?<![`\w.])(?:\w+\.)?source\s*"  # not quoted prose (`source = 'probe'`), not ready_source
    r"(?:(?:=|<>|!=)\s*'|IS\s+(?:NOT\s+)?(?:NULL|DISTINCT)|(?:NOT\s+)?IN\s*\()",
    re.IGNORECASE,
)


def _sql_texts(path: Path) -> list[str]:
    """The string constants of a module, f-string pieces included (SQL lives there)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _library_modules() -> list[Path]:
    return sorted(p for package in _LIBRARY for p in (REPO / package).rglob("*.py"))


def test_modules_that_read_requests_choose_a_kind_through_the_one_definition() -> None:
    """A new reader of ``requests`` either uses :func:`source_filter` or says here why it
    reads every kind; no module spells a ``source`` condition of its own."""
    choose_nothing, spelled = [], []
    for path in _library_modules():
        name = path.relative_to(REPO).as_posix()
        texts = _sql_texts(path)
        reads = any(_READS_REQUESTS.search(text) for text in texts)
        if reads and "source_filter" not in path.read_text(encoding="utf-8"):
            choose_nothing.append(name)
        if name != "slo/request_sources.py":
            spelled += [name for text in texts if _SOURCE_CONDITION.search(text)]
    assert sorted(set(choose_nothing)) == sorted(READS_OF_EVERY_KIND)
    assert spelled == []
