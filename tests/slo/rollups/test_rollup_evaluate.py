"""Rollups from raw rows and the evaluation over them, on a real DuckDB file."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.store import Store
from pipeline.units import DAY_MS, HOUR_MS, MINUTE_MS
from slo.budget import WindowCounts
from slo.evaluate import evaluate
from slo.rollups.counts import Rollup, create_rollup_tables
from slo.spec import parse_spec
from slo.spec.model import SloModel, build_model
from tests.slo.factories import T0_MS, histogram, insert, request


def model(*slos: dict[str, Any]) -> SloModel:
    return build_model(parse_spec({"version": "llmslo/v1", "service": "svc", "slos": list(slos)}))


TTFT = {
    "name": "ttft",
    "objective": 0.99,
    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0},
}
AVAIL = {"name": "avail", "objective": 0.999, "sli": {"kind": "availability"}}


def status(store: Store, m: SloModel, now_ms: int, name: str) -> Any:
    Rollup(store.con, m, horizon_ms=40 * 86_400_000).update(now_ms)
    return next(s for s in evaluate(store.con, m, now_ms) if s.slo.name == name)


def test_the_service_failures_are_bad_and_the_client_ones_no_event(store: Store) -> None:
    rows = [request(T0_MS + i * 1000) for i in range(6)]
    rows += [
        # the client's doing: no event of either SLI
        request(T0_MS + 10_000, outcome="client_cancelled", client_disconnected=True, ttft_s=None),
        request(T0_MS + 11_000, outcome="error_before_first_token", http_status=404, ttft_s=None),
        request(T0_MS + 11_500, outcome="error_before_first_token", http_status=400, ttft_s=None),
        # the service's doing: bad
        request(T0_MS + 12_000, outcome="rejected", http_status=503, ttft_s=None, tpot_s=None),
        request(T0_MS + 12_500, outcome="rejected", http_status=429, ttft_s=None, tpot_s=None),
        request(
            T0_MS + 13_000,
            outcome="interrupted_after_first_token",
            ttft_s=0.1,
            finish_reason="abort",
        ),
        request(T0_MS + 14_000, outcome="deadline_exceeded", http_status=504, ttft_s=None),
    ]
    insert(store, requests=rows)
    m = model(TTFT, AVAIL)
    for name in ("ttft", "avail"):
        st_ = status(store, m, T0_MS + 20_000, name)
        assert st_.period == WindowCounts(10, 4), name


def test_the_spec_can_count_client_errors_and_cancellations(store: Store) -> None:
    rows = [request(T0_MS), request(T0_MS, outcome="client_cancelled", ttft_s=None)]
    rows += [request(T0_MS, outcome="error_before_first_token", http_status=404, ttft_s=None)]
    insert(store, requests=rows)
    strict = {**AVAIL, "name": "strict"}
    strict["sli"] = {
        "kind": "availability",
        "outcomes": {"client_cancelled": "bad"},
        "statuses": {"4xx": "bad"},
    }
    assert status(store, model(strict), T0_MS + 20_000, "strict").period == WindowCounts(3, 2)


def test_tpot_of_a_one_token_success_is_not_an_event_but_a_failure_is(store: Store) -> None:
    insert(
        store,
        requests=[
            request(T0_MS, tpot_s=None, completion_tokens=1),
            request(T0_MS, tpot_s=0.2),
            request(T0_MS, tpot_s=None, outcome="upstream_timeout"),
            request(T0_MS),
        ],
    )
    m = model(
        {
            "name": "tpot",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "tpot", "threshold_s": 0.08},
        }
    )
    assert status(store, m, T0_MS, "tpot").period == WindowCounts(3, 2)


def test_goodput_needs_every_target(store: Store) -> None:
    insert(
        store,
        requests=[
            request(T0_MS),
            request(T0_MS, ttft_s=2.5),
            request(T0_MS, tpot_s=0.09),
            request(T0_MS, tpot_s=None),
        ],
    )
    m = model(
        {
            "name": "gp",
            "objective": 0.9,
            "sli": {"kind": "goodput", "targets_s": {"ttft": 2, "tpot": 0.08}},
        }
    )
    assert status(store, m, T0_MS, "gp").period == WindowCounts(4, 2)


def test_goodput_against_own_targets_counts_only_requests_that_carry_them(store: Store) -> None:
    own = {"slo_ttft_s": 1.0, "slo_tpot_s": 0.05}
    insert(
        store,
        requests=[
            request(T0_MS, **own, slo_met=True),
            request(T0_MS, **own, slo_met=False, ttft_s=1.5),
            request(T0_MS, slo_ttft_s=0.2, slo_met=False),  # its own 200 ms, not a spec's 2 s
            request(
                T0_MS,
                **own,
                slo_met=None,
                outcome="error_before_first_token",
                http_status=502,
                ttft_s=None,
            ),  # failed before its first token: bad
            request(T0_MS, ttft_s=9.0),  # no targets of its own: no event
        ],
    )
    m = model({"name": "own", "objective": 0.9, "sli": {"kind": "goodput", "own_targets": True}})
    assert status(store, m, T0_MS, "own").period == WindowCounts(4, 3)


def test_itl_jitter_statistic(store: Store) -> None:
    insert(
        store,
        requests=[
            request(T0_MS, itl_mean_s=0.03, itl_p50_s=0.03, itl_p99_s=0.05, itl_jitter_s=0.02),
            request(T0_MS, itl_mean_s=0.03, itl_p50_s=0.03, itl_p99_s=0.09, itl_jitter_s=0.06),
        ],
    )
    m = model(
        {
            "name": "jit",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "itl", "statistic": "jitter", "threshold_s": 0.03},
        }
    )
    assert status(store, m, T0_MS, "jit").period == WindowCounts(2, 1)


def test_itl_jitter_is_the_records_p99_minus_median_gap_over_requests_of_ten_chunks(
    store: Store,
) -> None:
    """DESIGN §4: jitter = p99 gap − median gap (not the mean), for requests with ≥ 10
    chunks; the tap records it per request (``itl_jitter_s``, null under 10 chunks)."""
    insert(
        store,
        requests=[
            # a mean pulled down by many tiny gaps: p99 − mean = 0.06, p99 − median = 0.01
            request(T0_MS, itl_mean_s=0.01, itl_p50_s=0.06, itl_p99_s=0.07, itl_jitter_s=0.01),
            request(T0_MS, itl_mean_s=0.03, itl_p50_s=0.03, itl_p99_s=0.09, itl_jitter_s=0.06),
            # five chunks: no jitter, not an event of this SLI
            request(T0_MS, token_chunks=5, itl_p99_s=0.5, itl_jitter_s=None),
        ],
    )
    m = model(
        {
            "name": "jit",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "itl", "statistic": "jitter", "threshold_s": 0.03},
        }
    )
    assert status(store, m, T0_MS, "jit").period == WindowCounts(2, 1)


def test_selectors_and_groups(store: Store) -> None:
    insert(
        store,
        requests=[
            request(T0_MS, pool="a", instance="h1:1", outcome="rejected"),
            request(T0_MS, pool="a", instance="h2:1"),
            request(T0_MS, pool="b", instance="h3:1", outcome="rejected"),
            request(T0_MS, pool="c", instance="h4:1", outcome="rejected"),
        ],
    )
    m = model({**AVAIL, "selector": {"pool": ["a", "b"]}, "group_by": ["pool"]})
    Rollup(store.con, m).update(T0_MS)
    got = {s.group["pool"]: s.period for s in evaluate(store.con, m, T0_MS)}
    assert got == {"a": WindowCounts(2, 1), "b": WindowCounts(1, 1)}


def test_an_slo_without_traffic_has_a_status_without_nan(store: Store) -> None:
    m = model(TTFT)
    (only,) = evaluate(store.con, m, T0_MS)
    assert only.sli is None and only.budget_remaining == 1.0
    assert all(rate == 0.0 for rate in only.burn_rates().values())
    assert not any(p.alerting for p in only.pairs())


def test_recomputing_a_minute_gives_the_same_rows(store: Store) -> None:
    rng = random.Random(1)
    insert(
        store,
        requests=[
            request(T0_MS + rng.randrange(3 * HOUR_MS), ttft_s=rng.uniform(0, 3))
            for _ in range(500)
        ],
    )
    m = model(TTFT)
    rollup = Rollup(store.con, m)
    rollup.update(T0_MS + 3 * HOUR_MS)
    snapshot = store.con.execute("SELECT * FROM slo_minute ORDER BY ALL").fetchall()
    hours = store.con.execute("SELECT * FROM slo_hour ORDER BY ALL").fetchall()
    rollup.recompute(m.slos[0], T0_MS + 17 * MINUTE_MS, T0_MS + 95 * MINUTE_MS)
    rollup.update(T0_MS + 3 * HOUR_MS)
    assert store.con.execute("SELECT * FROM slo_minute ORDER BY ALL").fetchall() == snapshot
    assert store.con.execute("SELECT * FROM slo_hour ORDER BY ALL").fetchall() == hours


def test_late_records_within_the_settle_window_are_counted(store: Store) -> None:
    m = model(AVAIL)
    rollup = Rollup(store.con, m)
    insert(store, requests=[request(T0_MS + 30 * MINUTE_MS)])
    rollup.update(T0_MS + 31 * MINUTE_MS)
    insert(
        store, requests=[request(T0_MS + 29 * MINUTE_MS, outcome="deadline_exceeded")]
    )  # arrives late
    rollup.update(T0_MS + 33 * MINUTE_MS)
    assert evaluate(store.con, m, T0_MS + 33 * MINUTE_MS)[0].period == WindowCounts(2, 1)


def test_changing_an_slo_definition_rebuilds_its_rollups(store: Store) -> None:
    insert(store, requests=[request(T0_MS, ttft_s=1.5)])
    Rollup(store.con, model(TTFT)).update(T0_MS)
    stricter = model({**TTFT, "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 1.0}})
    stats = Rollup(store.con, stricter).update(T0_MS + MINUTE_MS)
    assert stats.rebuilt == 1
    assert evaluate(store.con, stricter, T0_MS + MINUTE_MS)[0].period == WindowCounts(1, 1)


def _reference(rows: list[dict[str, Any]], start: int, end: int) -> WindowCounts:
    def client_side(r: dict[str, Any]) -> bool:  # a cancel or a client 4xx (not 429)
        status = r["http_status"]
        return r["outcome"] == "client_cancelled" or (
            r["outcome"] != "ok" and 400 <= status < 500 and status != 429
        )

    sel = [r for r in rows if start <= r["received_ts_ms"] < end and not client_side(r)]
    bad = sum(
        1 for r in sel if r["outcome"] != "ok" or (r["ttft_s"] is not None and r["ttft_s"] > 2.0)
    )
    eligible = sum(1 for r in sel if r["outcome"] != "ok" or r["ttft_s"] is not None)
    return WindowCounts(eligible, bad)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    offsets=st.lists(st.integers(0, 80 * HOUR_MS), min_size=0, max_size=60),
    seed=st.integers(0, 1000),
    now_offset=st.integers(0, 80 * HOUR_MS),
)
def test_every_window_agrees_with_counting_raw_records(
    tmp_path: Path, offsets: list[int], seed: int, now_offset: int
) -> None:
    rng = random.Random(seed)
    kinds: list[dict[str, Any]] = [
        {"outcome": "ok"},
        {"outcome": "ok"},
        {"outcome": "rejected", "http_status": 429},
        {"outcome": "rejected", "http_status": 503},
        {"outcome": "error_before_first_token", "http_status": 404},
        {"outcome": "error_before_first_token", "http_status": 500},
        {"outcome": "client_cancelled"},
    ]
    rows = [
        request(T0_MS + o, ttft_s=rng.choice([0.5, 1.9, 2.0, 2.1, None]), **rng.choice(kinds))
        for o in offsets
    ]
    with Store(tmp_path / f"{uuid.uuid4().hex}.duckdb") as store:
        if rows:
            insert(store, requests=rows)
        m = model(TTFT)
        now = T0_MS + now_offset
        Rollup(store.con, m, horizon_ms=40 * 86_400_000).update(T0_MS + 80 * HOUR_MS)
        (got,) = evaluate(store.con, m, now)
        end = now // MINUTE_MS * MINUTE_MS + MINUTE_MS
        for window, counts in got.windows.items():
            assert counts == _reference(rows, end - window, end), window


@pytest.mark.parametrize(
    "now_offset_ms",
    [
        31 * DAY_MS + 7 * HOUR_MS + 23 * MINUTE_MS,
        31 * DAY_MS + 59 * MINUTE_MS,
        32 * DAY_MS - MINUTE_MS,
        32 * DAY_MS,
    ],
    ids=["mid-day", "an hour's last minute", "a day's last minute", "midnight"],
)
def test_thirty_day_windows_read_from_day_hour_and_minute_rollups_equal_the_raw_counts(
    store: Store, now_offset_ms: int
) -> None:
    # Records every 47 minutes over 35 days (ending past every tested instant), every fifth
    # bad, every seventh without a TTFT: each window's edges cut days, hours and minutes.
    rows = [
        request(
            T0_MS + i * 47 * MINUTE_MS + 1_000,
            ttft_s=None if i % 7 == 0 else (2.5 if i % 5 == 0 else 0.5),
        )
        for i in range(35 * 24 * 60 // 47)
    ]
    insert(store, requests=rows)
    m = model(TTFT)
    Rollup(store.con, m, horizon_ms=40 * DAY_MS).update(T0_MS + 35 * DAY_MS)
    assert store.con.execute("SELECT count(*) FROM slo_day").fetchone() == (36,)
    now = T0_MS + now_offset_ms
    (got,) = evaluate(store.con, m, now)
    end = now // MINUTE_MS * MINUTE_MS + MINUTE_MS
    assert got.period.total > 700
    for window, counts in got.windows.items():
        assert counts == _reference(rows, end - window, end), window


def test_a_file_whose_rollups_predate_days_gets_them_from_its_hours(store: Store) -> None:
    rows = [request(T0_MS + i * 5 * HOUR_MS, ttft_s=2.5 if i % 3 else 0.5) for i in range(100)]
    insert(store, requests=rows)
    m = model(TTFT)
    now = T0_MS + 21 * DAY_MS
    Rollup(store.con, m, horizon_ms=40 * DAY_MS).update(now)
    (before,) = evaluate(store.con, m, now)
    store.con.execute("DROP TABLE slo_day")  # as an older release left the file
    create_rollup_tables(store.con)
    (after,) = evaluate(store.con, m, now)
    assert after.windows == before.windows
    assert after.period.total == 100


def test_engine_histogram_source_counts_bucket_increases(store: Store) -> None:
    bounds = [0.5, 1.0, 2.0, 4.0]
    samples = []
    # cumulative: minute 0 baseline, minute 1 +10 requests (8 ≤ 2 s),
    # minute 2 a counter reset, then 5 requests (5 ≤ 2 s)
    for minute, le2, count in [(0, 100, 100), (1, 108, 110), (2, 5, 5)]:
        samples += histogram(
            T0_MS + minute * MINUTE_MS + 5_000,
            "ttft",
            bounds,
            {0.5: 0, 1.0: 0, 2.0: le2, 4.0: le2},
            count,
            dialect="sglang",
        )
    insert(store, engine=samples)
    m = model(
        {
            "name": "ttft-engine",
            "objective": 0.99,
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2, "source": "engine"},
        }
    )
    st_ = status(store, m, T0_MS + 3 * MINUTE_MS, "ttft-engine")
    assert st_.period == WindowCounts(15, 2)


@pytest.mark.parametrize(
    ("min_events", "pages"),
    [(0, True), (100, False)],
    ids=["without the guard one failure pages", "with the guard it does not"],
)
def test_low_traffic_one_failure_at_ten_requests_per_hour(
    store: Store, min_events: int, pages: bool
) -> None:
    rows = [request(T0_MS + i * 6 * MINUTE_MS) for i in range(60)]  # 10/h for 6 h
    rows[-1]["outcome"] = "error_before_first_token"
    insert(store, requests=rows)
    m = model({**AVAIL, "alerting": {"min_events": min_events}})
    st_ = status(store, m, T0_MS + 354 * MINUTE_MS + 30_000, "avail")
    page = next(p for p in st_.pairs() if p.pair.id == "page-1h-5m")
    assert page.alerting is pages
    assert page.guarded is not pages


def test_engine_instances_without_the_threshold_bucket_are_left_out(store: Store) -> None:
    samples = []
    for minute, count in [(0, 10), (1, 20)]:
        ts = T0_MS + minute * MINUTE_MS + 5_000
        samples += histogram(
            ts, "ttft", [1.0, 2.0], {1.0: count, 2.0: count}, count, instance="a:1"
        )
        samples += histogram(
            ts, "ttft", [1.0, 2.5], {1.0: 0, 2.5: 0}, count, instance="b:1"
        )  # vLLM bounds
    insert(store, engine=samples)
    m = model(
        {
            "name": "eng",
            "objective": 0.99,
            "group_by": ["instance"],
            "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2, "source": "engine"},
        }
    )
    Rollup(store.con, m).update(T0_MS + 2 * MINUTE_MS)
    got = {s.group["instance"]: s.period for s in evaluate(store.con, m, T0_MS + 2 * MINUTE_MS)}
    assert got == {"a:1": WindowCounts(10, 0)}


def attempt(ts_ms: int, client_id: str, number: int, **overrides: Any) -> dict[str, Any]:
    """Attempt ``number`` of client request ``client_id`` (the tap's ids: ``ID``, ``ID.2``…)."""
    rid = client_id if number == 1 else f"{client_id}.{number}"
    return request(
        ts_ms, request_id=rid, original_request_id=client_id, attempt=number, **overrides
    )


FAILED_BEFORE_FIRST_TOKEN = {
    "outcome": "error_before_first_token",
    "ttft_s": None,
    "tpot_s": None,
    "http_status": None,
}


def test_a_request_retried_twice_then_served_is_one_good_event(store: Store) -> None:
    insert(
        store,
        requests=[
            attempt(T0_MS, "r1", 1, instance="pod-a", **FAILED_BEFORE_FIRST_TOKEN),
            attempt(T0_MS + 300, "r1", 2, instance="pod-b", **FAILED_BEFORE_FIRST_TOKEN),
            attempt(T0_MS + 700, "r1", 3, instance="pod-c", ttft_s=0.9),
        ],
    )
    m = model(TTFT, AVAIL)
    for name in ("ttft", "avail"):
        assert status(store, m, T0_MS + 5_000, name).period == WindowCounts(1, 0), name


def test_a_request_failing_every_attempt_is_one_bad_event(store: Store) -> None:
    insert(
        store,
        requests=[attempt(T0_MS, "r2", number, **FAILED_BEFORE_FIRST_TOKEN) for number in (1, 2, 3)]
        + [request(T0_MS + 1_000)],  # one plain good request beside it
    )
    m = model(TTFT, AVAIL)
    for name in ("ttft", "avail"):
        assert status(store, m, T0_MS + 5_000, name).period == WindowCounts(2, 1), name


def test_a_retry_in_the_next_minute_counts_in_the_minute_the_client_asked(store: Store) -> None:
    first = T0_MS - T0_MS % MINUTE_MS + MINUTE_MS - 200  # 200 ms before a minute ends
    insert(
        store,
        requests=[
            attempt(first, "r3", 1, **FAILED_BEFORE_FIRST_TOKEN),
            attempt(first + 400, "r3", 2),
        ],
    )
    m = model(AVAIL)
    Rollup(store.con, m, horizon_ms=40 * 86_400_000).update(first + 5_000)
    rows = store.con.execute("SELECT ts_ms, total, bad FROM slo_minute ORDER BY ts_ms").fetchall()
    assert rows == [(first - first % MINUTE_MS, 1, 0)]


def _probe(ts_ms: int, **overrides: Any) -> dict[str, Any]:
    """A synthetic probe through the gateway (``source='probe'``)."""
    return request(ts_ms, instance="gw:8080", tap_id="probe:gw:8080", source="probe", **overrides)


def _probes() -> list[dict[str, Any]]:
    """Five probes: three fine, one refused at the entry point, one with a 3.5 s TTFT."""
    return [_probe(T0_MS + i * 1000) for i in range(3)] + [
        _probe(
            T0_MS + 5000,
            outcome="error_before_first_token",
            error_kind="connect_refused",
            ttft_s=None,
        ),
        _probe(T0_MS + 6000, ttft_s=3.5),
    ]


def test_probe_records_never_count_in_a_tap_slo(store: Store) -> None:
    """Probes are synthetic requests through the gateway, not users' requests."""
    insert(store, requests=[request(T0_MS + i * 1000) for i in range(8)] + _probes())
    m = model(TTFT, AVAIL)
    assert status(store, m, T0_MS + 20_000, "avail").period == WindowCounts(8, 0)
    assert status(store, m, T0_MS + 20_000, "ttft").period == WindowCounts(8, 0)


PROBE_AVAIL = {
    "name": "probe-avail",
    "objective": 0.99,
    "sli": {"kind": "availability", "source": "probe"},
}
PROBE_TTFT = {
    "name": "probe-ttft",
    "objective": 0.99,
    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0, "source": "probe"},
}


def test_a_probe_slo_counts_only_probe_records(store: Store) -> None:
    insert(store, requests=[request(T0_MS + i * 1000) for i in range(8)] + _probes())
    m = model(PROBE_AVAIL, PROBE_TTFT)
    assert status(store, m, T0_MS + 20_000, "probe-avail").period == WindowCounts(5, 1)
    assert status(store, m, T0_MS + 20_000, "probe-ttft").period == WindowCounts(5, 2)


ENGINE_TTFT = {
    "name": "ttft-engine",
    "objective": 0.99,
    "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2, "source": "engine"},
}


def _rollup_rows(store: Store) -> list[list[tuple[Any, ...]]]:
    return [
        store.con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
        for table in ("slo_minute", "slo_hour", "slo_day")
    ]


def _scrapes(minutes: range, le2: int = 0) -> list[dict[str, Any]]:
    """One TTFT histogram scrape per minute; each minute 10 more requests, ``le2`` per minute
    of them within 2 s."""
    rows: list[dict[str, Any]] = []
    for m in minutes:
        good = (m + 1) * le2
        rows += histogram(
            T0_MS + m * MINUTE_MS + 5_000,
            "ttft",
            [2.0],
            {2.0: good},
            (m + 1) * 10,
            dialect="sglang",
        )
    return rows


def test_an_update_told_what_was_written_equals_a_rebuild_from_raw_rows(
    store: Store, tmp_path: Path
) -> None:
    """Late rows far past the settle window (failures 35 minutes late, an engine scrape 30
    minutes late) and a retry whose failed first attempt was rolled up 2 minutes before
    it, earlier than any other new row: an update told the earliest new event time of each
    table recomputes exactly the minutes they change."""
    m = model(AVAIL, TTFT, ENGINE_TTFT)
    first = T0_MS + 20 * MINUTE_MS + 30_000
    before = [request(T0_MS + i * 45_000) for i in range(80)]
    before.append(attempt(first, "late-retry", 1, **FAILED_BEFORE_FIRST_TOKEN))
    engine = _scrapes(range(0, 60))
    missed = [r for r in engine if r["ts_ms"] // MINUTE_MS % 60 == 30]  # one scrape, late
    insert(store, requests=before, engine=[r for r in engine if r not in missed])
    rollup = Rollup(store.con, m, horizon_ms=DAY_MS)
    rollup.note_written({"requests": T0_MS, "engine_samples": T0_MS})  # as the mirror's first
    rollup.update(T0_MS + 59 * MINUTE_MS)
    rollup.note_written({})  # nothing new
    rollup.update(T0_MS + 60 * MINUTE_MS)
    # Then, all written between two updates: a burst of failures at minute 25, the retry
    # (minute 22) that served the request failed at minute 20, the late scrape.
    late = [request(T0_MS + 25 * MINUTE_MS + i * 1000, outcome="rejected", http_status=503,
                    ttft_s=None, tpot_s=None) for i in range(5)]  # fmt: skip
    retry = attempt(first + 2 * MINUTE_MS, "late-retry", 2)
    fresh = [request(T0_MS + 60 * MINUTE_MS + 10_000)]
    insert(store, requests=[*late, retry, *fresh], engine=missed)
    rollup.note_written(
        {
            "requests": min(r["received_ts_ms"] for r in [*late, retry, *fresh]),
            "engine_samples": min(r["ts_ms"] for r in missed),
        }
    )
    rollup.update(T0_MS + 61 * MINUTE_MS)
    incremental = _rollup_rows(store)
    with Store(tmp_path / "rebuilt.duckdb") as rebuilt:
        insert(rebuilt, requests=[*before, *late, retry, *fresh], engine=engine)
        Rollup(rebuilt.con, m, horizon_ms=DAY_MS).update(T0_MS + 61 * MINUTE_MS)
        assert incremental == _rollup_rows(rebuilt)


def test_an_update_never_told_what_was_written_keeps_the_settle_window(store: Store) -> None:
    """A rollup told nothing (jobs over an ingester's file) recomputes watermark − settle
    each update, however many updates it made (the told rollup's shortcut is not taken)."""
    m = model(AVAIL)
    rollup = Rollup(store.con, m)
    insert(store, requests=[request(T0_MS + 30 * MINUTE_MS)])
    for minute in (31, 32, 33):
        rollup.update(T0_MS + minute * MINUTE_MS)
    insert(store, requests=[request(T0_MS + 29 * MINUTE_MS, outcome="deadline_exceeded")])
    rollup.update(T0_MS + 34 * MINUTE_MS)
    assert evaluate(store.con, m, T0_MS + 34 * MINUTE_MS)[0].period == WindowCounts(2, 1)


def _engine_reference(
    samples: list[dict[str, Any]], start_ms: int, end_ms: int
) -> list[tuple[int, str, int, int]]:
    """(minute, instance, total, bad) of the TTFT ≤ 2 s engine SLI over [start, end), as
    ``engine_minutes_sql`` defines it: per series, a minute's increase from the latest
    sample before it at or after ``start − lookback`` (0 without one; the new value after
    a reset); instances without a 2 s bucket in that read are left out."""
    from slo.rollups._sli_sql import ENGINE_LOOKBACK_MS

    read = [
        r
        for r in samples
        if start_ms - ENGINE_LOOKBACK_MS <= r["ts_ms"] < end_ms
        and (r["kind"] == "count" or r["le"] == 2.0)
    ]
    with_bucket = {r["instance"] for r in read if r["kind"] == "bucket"}
    sums: dict[tuple[int, str], list[float]] = {}
    series = {(r["instance"], r["engine"], r["kind"]) for r in read}
    for key in series:
        points = sorted(
            (r["ts_ms"], r["value"]) for r in read if key == (r["instance"], r["engine"], r["kind"])
        )
        minutes = sorted({ts // MINUTE_MS * MINUTE_MS for ts, _ in points if ts >= start_ms})
        for minute in minutes:
            v = [value for ts, value in points if minute <= ts < minute + MINUTE_MS][-1]
            earlier = [value for ts, value in points if ts < minute]
            inc = 0.0 if not earlier else (v if v < earlier[-1] else v - earlier[-1])
            total_good = sums.setdefault((minute, key[0]), [0.0, 0.0])
            total_good[0 if key[2] == "count" else 1] += inc
    rows = []
    for (minute, instance), (total_inc, good_inc) in sums.items():
        total, good = round(total_inc), round(good_inc)
        if instance in with_bucket and total > 0:
            rows.append((minute, instance, total, min(total, max(0, total - good))))
    return sorted(rows)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    scrapes=st.lists(
        st.tuples(
            st.integers(0, 59 * 60),  # second of the scrape
            st.sampled_from(["10.0.0.1:8000", "10.0.0.2:8000"]),
            st.sampled_from(["0", "1"]),  # engine core
            st.integers(0, 40),  # requests since the last scrape
            st.booleans(),  # a counter reset before it
            st.booleans(),  # the 2 s bucket scraped (else only +Inf and count)
        ),
        max_size=40,
        # One sample per series and timestamp, as Prometheus and the collectors store: two
        # values at one instant have no order, and either may be taken as the later.
        unique_by=lambda scrape: scrape[:3],
    ),
    start_minute=st.integers(0, 58),
    minutes=st.integers(1, 30),
)
def test_engine_minutes_of_any_range_equal_the_increases_from_each_series_last_sample(
    tmp_path: Path,
    scrapes: list[tuple[int, str, str, int, bool, bool]],
    start_minute: int,
    minutes: int,
) -> None:
    """Gaps longer than the lookback, resets, two cores of one instance, an instance whose
    threshold bucket is only in the lookback: the SQL's minutes over [start, end) equal the
    definition computed sample by sample."""
    from slo.rollups._sli_sql import engine_minutes_sql

    samples: list[dict[str, Any]] = []
    state: dict[tuple[str, str], list[float]] = {}
    for second, instance, core, n, reset, with_bucket in sorted(scrapes):
        count, good = state.get((instance, core), [0.0, 0.0])
        if reset:
            count, good = 0.0, 0.0
        count, good = count + n, good + n * 3 // 4
        state[(instance, core)] = [count, good]
        bounds = [2.0] if with_bucket else []
        samples += histogram(T0_MS + second * 1000, "ttft", bounds, {2.0: good}, count,
                             instance=instance, engine=core, dialect="sglang")  # fmt: skip
    (slo,) = model(ENGINE_TTFT).slos
    start = T0_MS + start_minute * MINUTE_MS
    end = start + minutes * MINUTE_MS
    with Store(tmp_path / f"{uuid.uuid4().hex}.duckdb") as store:
        if samples:
            insert(store, engine=samples)
        sql, params = engine_minutes_sql(slo, start, end)
        got = store.con.execute(
            f"SELECT ts_ms, instance, total, bad FROM ({sql}) ORDER BY ALL", params
        ).fetchall()
    assert got == _engine_reference(samples, start, end)


_OUTCOMES: list[dict[str, Any]] = [
    {"outcome": "ok"},
    {"outcome": "ok", "ttft_s": 3.5},
    {"outcome": "error_before_first_token", "ttft_s": None, "http_status": 500},
]
_BATCH = st.tuples(
    st.lists(st.tuples(st.integers(0, 40 * MINUTE_MS), st.sampled_from(_OUTCOMES)), max_size=4),
    st.lists(st.tuples(st.integers(0, 40 * MINUTE_MS), st.sampled_from(_OUTCOMES)), max_size=3),
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(_BATCH, min_size=1, max_size=5))
def test_updates_passing_over_slos_without_records_in_their_range_equal_a_rebuild(
    tmp_path: Path, batches: list[tuple[list[tuple[int, dict[str, Any]]], ...]]
) -> None:
    """Batches of users' and probes' records, late ones too, some batches without a probe
    (or without anything): a told update that finds an SLO's range without records and
    without minutes leaves its rows and moves its watermark; the rows equal a rebuild's."""
    m = model(AVAIL, TTFT, PROBE_AVAIL, PROBE_TTFT)
    written: list[dict[str, Any]] = []
    now = T0_MS + 40 * MINUTE_MS
    with Store(tmp_path / f"{uuid.uuid4().hex}.duckdb") as store:
        rollup = Rollup(store.con, m, horizon_ms=DAY_MS)
        rollup.note_written({})
        for taps, probes in batches:
            now += 5 * MINUTE_MS
            rows = [request(T0_MS + o, **kind) for o, kind in taps]
            rows += [_probe(T0_MS + o, **kind) for o, kind in probes]
            if rows:
                insert(store, requests=rows)
            written += rows
            told = {"requests": min(r["received_ts_ms"] for r in rows)} if rows else {}
            rollup.note_written(told)
            rollup.update(now)
        incremental = _rollup_rows(store)
    with Store(tmp_path / f"{uuid.uuid4().hex}.duckdb") as rebuilt:
        if written:
            insert(rebuilt, requests=written)
        Rollup(rebuilt.con, m, horizon_ms=DAY_MS).update(now)
        assert incremental == _rollup_rows(rebuilt)
