"""Every SLO group's alert spans in one read equal the Fleet strip's former per-group path
(``slo_series`` → per group numpy → merged runs, kept in :mod:`alert_reference`), span by
span and tooltip by tooltip, over a generated history with incidents."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pytest

import simulator.history as history
from dashboards.timelines import alert_detail
from pipeline.errors import QueryError
from pipeline.store import Store
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo import queries
from slo.budget import WindowCounts, pair_alerting
from slo.jobs import SloJobs
from slo.queries.alert_spans import Pair, status_pairs
from slo.rollups.counts import create_rollup_tables
from slo.sinks import create_output_tables
from slo.spec import parse_spec
from slo.spec.model import build_model
from tests.slo.queries.alert_reference import alert_states, fold_groups, group_series, merge_runs

END_MS = 1_790_000_000_000 // HOUR_MS * HOUR_MS
SPEC = {
    "version": "llmslo/v1",
    "service": "spans",
    "slos": [
        {"name": "availability", "objective": 0.999, "sli": {"kind": "availability"}},
        {
            "name": "ttft",
            "objective": 0.995,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.5},
            "group_by": ["instance"],
        },
        {
            "name": "ttft-pool",
            "objective": 0.9,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 1.0},
            "group_by": ["pool"],
        },
    ],
}
Span = tuple[str, str, int, int, str, str]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four days of 6 pods, two incidents a day (TTFT × 6, 5 % errors), the jobs run."""
    path = tmp_path_factory.mktemp("spans") / "history.duckdb"
    config = history.HistoryConfig(days=4, end_ts_ms=END_MS, pods=6, incidents_per_day=2, seed=3)
    with Store(path) as store:
        for schema, table in history.HistoryGenerator(config).chunks():
            store.commit_batch({schema.table: [table]}, group_id="h", offsets={}, now_ts_ms=0)
        SloJobs(store.con, build_model(parse_spec(SPEC))).run_once(END_MS)
    return path


PairChange = Callable[[Pair, int], Pair]


def _reference(
    con: duckdb.DuckDBPyConnection,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    change: PairChange = lambda pair, _: pair,
) -> list[Span]:
    """The former Fleet page path: one read of every group's events, then per group."""
    status = queries.slo_status(con).to_pylist()
    longest = max(p.long_ms for row in status for p in status_pairs(row["status_json"]))
    series = queries.slo_series(
        con, start_ms=(start_ms - longest) // bucket_ms * bucket_ms, end_ms=end_ms,
        bucket_ms=bucket_ms,
    ).to_pandas()  # fmt: skip
    spans: list[Span] = []
    for row in status:
        group = json.loads(row["group_json"])
        cells = alert_states(
            group_series(series, row["slo_id"], group),
            pairs=[change(p, bucket_ms) for p in status_pairs(row["status_json"])],
            objective=row["objective"],
            start_ms=start_ms,
            end_ms=end_ms,
            bucket_ms=bucket_ms,
        )
        for run in merge_runs(cells).itertuples():
            spans.append(
                (row["slo_id"], row["group_json"], run.start_ms, run.end_ms, run.state, run.detail)
            )
    return spans


def _one_read(con: duckdb.DuckDBPyConnection, **scope: int | str) -> list[Span]:
    return [
        (r["slo_id"], r["group_json"], r["start_ms"], r["end_ms"], r["state"], alert_detail(r["burns"]))
        for r in queries.slo_alert_spans(con, **scope).to_pylist()  # type: ignore[arg-type]
    ]  # fmt: skip


SCOPES = {
    "the last day in 5-minute buckets (minute rollups)": (END_MS - DAY_MS, END_MS, 5 * MINUTE_MS),
    "three days in hours (hour rollups)": (END_MS - 3 * DAY_MS, END_MS, HOUR_MS),
    "four days in 3-hour buckets, the whole history": (END_MS - 4 * DAY_MS, END_MS, 3 * HOUR_MS),
    "an unaligned range in 15-minute buckets": (
        END_MS - 30 * HOUR_MS - 7 * MINUTE_MS, END_MS - 5 * HOUR_MS + 3 * MINUTE_MS, 15 * MINUTE_MS,
    ),
    "40-minute buckets: a window of 1.5 buckets rounds to 2": (
        END_MS - 2 * DAY_MS, END_MS, 40 * MINUTE_MS,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("start_ms", "end_ms", "bucket_ms"), SCOPES.values(), ids=list(SCOPES))
def test_one_read_equals_the_per_group_path_span_by_span(
    db: Path, start_ms: int, end_ms: int, bucket_ms: int
) -> None:
    with duckdb.connect(str(db), read_only=True) as con:
        expected = _reference(con, start_ms, end_ms, bucket_ms)
        got = _one_read(con, start_ms=start_ms, end_ms=end_ms, bucket_ms=bucket_ms)
    assert got == expected
    # The history's incidents make every state appear (a page on some days), on every kind
    # of group.
    paged = {"page"} if end_ms - start_ms >= 2 * DAY_MS else set()
    assert {span[4] for span in got} >= {"ticket", "ok"} | paged
    assert {span[0] for span in got if span[4] != "ok"} >= {"spans-availability", "spans-ttft"}
    assert len({span[1] for span in got}) == 1 + 6 + 1  # availability, 6 pods, one pool


WRONG: dict[str, PairChange] = {
    "the long window one bucket longer": lambda p, b: replace(p, long_ms=p.long_ms + b),
    "the short window one bucket shorter": lambda p, b: replace(
        p, short_ms=max(b, p.short_ms - b), long_ms=p.long_ms
    ),
    "a factor 10 % lower": lambda p, _: replace(p, factor=p.factor * 0.9),
}


@pytest.mark.parametrize("change", WRONG.values(), ids=list(WRONG))
def test_the_comparison_tells_a_wrong_variant_apart(db: Path, change: PairChange) -> None:
    """The equality above is not vacuous: a slightly wrong computation differs from it."""
    start_ms, end_ms, bucket_ms = END_MS - 2 * DAY_MS, END_MS, 15 * MINUTE_MS
    with duckdb.connect(str(db), read_only=True) as con:
        wrong = _reference(con, start_ms, end_ms, bucket_ms, change)
        got = _one_read(con, start_ms=start_ms, end_ms=end_ms, bucket_ms=bucket_ms)
    assert got != wrong


def test_filters_keep_the_groups_whose_label_is_absent_or_equal(db: Path) -> None:
    scope = {"start_ms": END_MS - DAY_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS}
    with duckdb.connect(str(db), read_only=True) as con:
        every = _one_read(con, **scope)
        pod = json.loads(next(s[1] for s in every if "instance" in s[1]))["instance"]
        one_pod = _one_read(con, **scope, instance=pod)
        one_slo = _one_read(con, **scope, slo_id="spans-ttft")
        nobody = _one_read(con, **scope, instance="no-such-pod")
    assert {json.loads(s[1]).get("instance", pod) for s in one_pod} == {pod}
    assert {s[0] for s in one_pod} == {s[0] for s in every}  # ungrouped SLOs stay
    assert one_slo == [s for s in every if s[0] == "spans-ttft"]
    assert {s[0] for s in nobody} == {"spans-availability", "spans-ttft-pool"}


@pytest.mark.parametrize(
    ("scope", "parameter"),
    [
        ({"start_ms": END_MS - DAY_MS, "end_ms": END_MS, "bucket_ms": 30_000}, "bucket_ms"),
        ({"start_ms": END_MS, "end_ms": END_MS - DAY_MS, "bucket_ms": HOUR_MS}, "end_ms"),
        ({"start_ms": END_MS - DAY_MS, "end_ms": END_MS, "bucket_ms": HOUR_MS, "pool": ""}, "pool"),
    ],
    ids=["sub-minute buckets", "a reversed range", "an empty pool"],
)
def test_bad_parameters_are_refused_naming_them(
    db: Path, scope: dict[str, int | str], parameter: str
) -> None:
    with duckdb.connect(str(db), read_only=True) as con, pytest.raises(QueryError) as caught:
        queries.slo_alert_spans(con, **scope)  # type: ignore[arg-type]
    assert caught.value.parameter == parameter


# One group, made by hand: the cells of its spans against the jobs' pair rule.
BUCKET = 5 * MINUTE_MS
START, END = 100 * HOUR_MS, 106 * HOUR_MS
PAGE = Pair("page", 14.4, HOUR_MS, 5 * MINUTE_MS, "page-1h-5m")
TICKET = Pair("ticket", 1.0, 6 * HOUR_MS, 30 * MINUTE_MS, "ticket-6h-30m")
Rows = list[tuple[int, int, int]]  # (ts_ms, total, bad) per 5-minute bucket


@pytest.fixture
def one_group(tmp_path: Path) -> Iterator[Callable[[Rows], list[dict[str, Any]]]]:
    """Store a group's events (one rollup row per bucket) and a status with PAGE and TICKET;
    answer its spans over [START, END) in 5-minute buckets."""
    con = duckdb.connect(str(tmp_path / "one.duckdb"))
    create_rollup_tables(con)
    create_output_tables(con)
    status = {
        "objective": 0.99,
        "pairs": [{"id": p.id, "factor": p.factor} for p in (PAGE, TICKET)],
    }
    con.execute("INSERT INTO slo_keys VALUES (1, 's', '', '', '', '')")
    con.execute("INSERT INTO slo_status_current VALUES ('s', '{}', 0, ?)", [json.dumps(status)])

    def spans(rows: Rows) -> list[dict[str, Any]]:
        con.execute("DELETE FROM slo_minute")
        if any(r[1] for r in rows):
            con.executemany(
                "INSERT INTO slo_minute VALUES ('s', 1, ?, ?, ?)", [r for r in rows if r[1]]
            )
        answer = queries.slo_alert_spans(con, start_ms=START, end_ms=END, bucket_ms=BUCKET)
        return answer.to_pylist()

    yield spans
    con.close()


def _cells(spans: list[dict[str, Any]]) -> dict[int, str]:
    """Bucket start → state, from spans that tile the range."""
    cells = {}
    for span in spans:
        for ts in range(int(span["start_ms"]), int(span["end_ms"]), BUCKET):
            cells[ts] = str(span["state"])
    assert list(cells) == list(range(START, END, BUCKET))  # no gap, no overlap
    return cells


def _outage(bad_from_ms: int, bad_to_ms: int, bad: int) -> Rows:
    """1,000 events per bucket from 6 h before START, ``bad`` of them bad in the interval."""
    return [
        (ts, 1000, bad if bad_from_ms <= ts < bad_to_ms else 0)
        for ts in range(START - 6 * HOUR_MS, END, BUCKET)
    ]


def test_an_outage_tickets_then_pages_while_both_windows_burn_then_recovers(
    one_group: Callable[[Rows], list[dict[str, Any]]],
) -> None:
    # 50 % errors from +1 h to +3 h: burn 50 per bad bucket. The 6 h window passes 1 after
    # two bad buckets (2 × 0.69), the 1 h window 14.4 after four (4 × 4.17); when errors
    # stop the 5 m window clears at once, the 30 m window six buckets later.
    spans = one_group(_outage(START + HOUR_MS, START + 3 * HOUR_MS, 500))
    assert [s["state"] for s in spans] == ["ok", "ticket", "page", "ticket", "ok"]
    assert [(int(s["start_ms"]) - START) // MINUTE_MS for s in spans] == [0, 65, 75, 180, 205]
    assert spans[-1]["end_ms"] == END
    # The ok span ends with the first bad bucket: 1 of 12 bad in the hour, 1 of 72 in 6 h.
    assert alert_detail(spans[0]["burns"]) == "page ×14.4: 4.2 / 50.0; ticket ×1: 0.7 / 8.3"
    paging = [
        (b["pair"], round(b["long_burn"], 2), round(b["short_burn"], 2)) for b in spans[2]["burns"]
    ]
    # At the page's last bucket (+2 h 55 m): 12 of 12 buckets of the hour bad, 24 of 72 of 6 h.
    assert paging == [("page-1h-5m", 50.0, 50.0), ("ticket-6h-30m", 16.67, 50.0)]


def test_no_events_is_its_own_state(one_group: Callable[[Rows], list[dict[str, Any]]]) -> None:
    assert [(s["state"], s["burns"]) for s in one_group([])] == [("no events", [])]


def test_the_pairs_are_read_from_the_stored_status() -> None:
    status = {
        "pairs": [
            {"id": "page-1h-5m", "severity": "page", "factor": 14.4},
            {"id": "ticket-3d-6h", "severity": "ticket", "factor": 1.0},
            {"id": "odd", "factor": 2.0},
        ]
    }
    assert status_pairs(json.dumps(status)) == [
        PAGE,
        Pair("ticket", 1.0, 72 * HOUR_MS, 6 * HOUR_MS, "ticket-3d-6h"),
    ]


def test_every_cell_agrees_with_the_jobs_pair_rule(
    one_group: Callable[[Rows], list[dict[str, Any]]],
) -> None:
    """The spans bucket by bucket against :func:`slo.budget.pair_alerting`, over bursty
    random traffic with empty stretches."""
    rng = random.Random(7)
    rows = []
    for ts in range(START - 6 * HOUR_MS, END, BUCKET):
        # Nothing until an hour into the range (every window empty), then bursts.
        total = rng.choice([0, 0, 5, 200, 1000]) if ts >= START + HOUR_MS else 0
        rows.append((ts, total, rng.choice([0, total // 40, total // 2])))
    cells = _cells(one_group(rows))
    assert set(cells.values()) == {"page", "ticket", "ok", "no events"}  # every branch is met
    for start_ms, state in cells.items():

        def window(ms: int, end: int = start_ms + BUCKET) -> WindowCounts:
            inside = [(t, b) for ts, t, b in rows if end - ms <= ts < end]
            return WindowCounts(sum(t for t, _ in inside), sum(b for _, b in inside))

        firing = {
            p.severity
            for p in (PAGE, TICKET)
            if pair_alerting(window(p.short_ms), window(p.long_ms), 0.99, p.factor)
        }
        seen = any(window(p.long_ms).total for p in (PAGE, TICKET))
        expected = (
            ("page" if "page" in firing else "ticket")
            if firing
            else ("ok" if seen else "no events")
        )
        assert state == expected, start_ms


@pytest.mark.parametrize("most_rows", [1, 3, 7, 8], ids=lambda n: f"at most {n} rows")
@pytest.mark.parametrize(("start_ms", "end_ms", "bucket_ms"), SCOPES.values(), ids=list(SCOPES))
def test_the_read_folds_the_groups_past_the_row_limit_as_the_strip_did(
    db: Path, start_ms: int, end_ms: int, bucket_ms: int, most_rows: int
) -> None:
    """The fold moved from pandas on the page into the read: same rows, same order, same
    tooltips, whether 1, several or all of the 8 groups keep a row."""
    with duckdb.connect(str(db), read_only=True) as con:
        every, folded = (
            queries.slo_alert_spans(
                con, start_ms=start_ms, end_ms=end_ms, bucket_ms=bucket_ms, most_rows=most
            ).to_pandas()
            for most in (None, most_rows)
        )
    assert set(every["folded"]) == {0}
    expected = fold_groups(every.drop(columns="folded"), most=most_rows)
    columns = ["slo_id", "group_json", "start_ms", "end_ms", "state", "folded"]
    assert folded[columns].astype(object).where(folded[columns].notna(), None).to_dict(
        "records"
    ) == expected[columns].astype(object).where(expected[columns].notna(), None).to_dict("records")
    assert [alert_detail(b) for b in folded["burns"]] == [
        alert_detail(b) for b in expected["burns"]
    ]
    assert (folded["folded"] > 0).any() == (most_rows < 8)


def test_a_row_limit_below_one_is_refused(db: Path) -> None:
    with (
        duckdb.connect(str(db), read_only=True) as con,
        pytest.raises(QueryError, match="most_rows"),
    ):
        queries.slo_alert_spans(
            con, start_ms=END_MS - DAY_MS, end_ms=END_MS, bucket_ms=HOUR_MS, most_rows=0
        )


def test_past_the_row_limit_the_groups_alerting_at_the_end_keep_their_rows_first(
    db: Path,
) -> None:
    """What is wrong now comes before what was wrong longest: 16 hours before the history's
    end, pod-2's TTFT group is in ticket and keeps a row, though pod-1's paged longer over
    the range (availability, in ticket then too and paging longest, keeps the other)."""
    start_ms, end_ms = END_MS - 2 * DAY_MS, END_MS - 16 * HOUR_MS
    with duckdb.connect(str(db), read_only=True) as con:
        every, two = (
            queries.slo_alert_spans(
                con, start_ms=start_ms, end_ms=end_ms, bucket_ms=HOUR_MS, most_rows=most
            ).to_pandas()
            for most in (None, 2)
        )
    paged = every[every["state"] == "page"].assign(h=lambda d: d["end_ms"] - d["start_ms"])
    paged_h = paged.groupby("group_json")["h"].sum() // HOUR_MS
    pod = '{"instance": "pod-%d"}'
    assert paged_h[pod % 1] > paged_h[pod % 2]
    last = every.sort_values("end_ms").groupby("group_json")["state"].last()
    assert last[pod % 2] == "ticket" and last[pod % 1] == "ok"
    own = two[two["folded"] == 0]
    assert set(zip(own["slo_id"], own["group_json"], strict=True)) == {
        ("spans-availability", "{}"),
        ("spans-ttft", pod % 2),
    }
