"""Loading cohort samples from a real DuckDB file written through ``Store``."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from api.cohorts import MAX_RANGE_MS, Cohort, SampleOptions, TimeRange, load_samples
from api.errors import UnknownCohortError
from api.judge import JudgeConfig, Verdict, judge
from pipeline.errors import QueryError
from pipeline.units import HOUR_MS
from tests.api.conftest import BASELINE, CANARY, cohort_rows
from tests.slo.factories import T0_MS, insert

HOUR = TimeRange(start_ms=T0_MS, end_ms=T0_MS + HOUR_MS)


def test_a_cohort_gets_its_own_requests_latencies_and_bad_event_counts(store) -> None:
    rows = cohort_rows(CANARY, 200, seed=2, outcomes={"error_before_first_token": 5})
    rows[10].update(
        client_disconnected=True, disconnect_ts_ms=T0_MS, upstream_closed_ts_ms=T0_MS + 5_000
    )
    rows[11].update(itl_max_s=12.0)
    rows[12].update(outcome="client_cancelled")
    rows[13].update(tpot_s=None, completion_tokens=1)  # TPOT is undefined for one token
    insert(store, requests=rows + cohort_rows(BASELINE, 300, seed=1))
    samples = load_samples(store.con, Cohort(instances=(CANARY,)), HOUR)
    assert samples.requests == 200
    assert samples.rates["error_before_first_token_rate"] == (5, 199)
    assert samples.rates["availability"] == (194, 199)  # the cancel is not held against it
    assert samples.rates["ghost_rate"] == (1, 200)
    assert samples.rates["stall_rate"] == (1, 200)
    # Latency samples come from successful requests only.
    assert samples.latency["ttft_s"].size == 194
    assert samples.latency["tpot_s"].size == 193
    assert np.isfinite(samples.latency["tpot_s"]).all()
    expected = sorted(r["ttft_s"] for r in rows if r["outcome"] == "ok")
    assert np.sort(samples.latency["ttft_s"]) == pytest.approx(expected)


def test_labels_and_instances_combine_and_the_range_is_half_open(store) -> None:
    rows = cohort_rows(CANARY, 100, seed=2, pool="llama-70b")
    rows += cohort_rows(CANARY, 50, seed=3, pool="other", start_ms=T0_MS + HOUR_MS)
    insert(store, requests=rows)
    assert load_samples(store.con, Cohort(labels={"pool": "llama-70b"}), HOUR).requests == 100
    both = Cohort(instances=(CANARY,), labels={"pool": "other"})
    assert load_samples(store.con, both, HOUR).requests == 0  # known cohort, other hour
    later = TimeRange(start_ms=T0_MS + 3_600_000, end_ms=T0_MS + 7_200_000)
    assert load_samples(store.con, both, later).requests == 50


def test_samples_above_the_cap_are_a_deterministic_subset(store) -> None:
    insert(store, requests=cohort_rows(CANARY, 300, seed=2))
    options = SampleOptions(max_samples=100)
    first = load_samples(store.con, Cohort(instances=(CANARY,)), HOUR, options)
    again = load_samples(store.con, Cohort(instances=(CANARY,)), HOUR, options)
    assert first.latency["ttft_s"].size == 100
    assert np.array_equal(first.latency["ttft_s"], again.latency["ttft_s"])
    assert first.rates["availability"] == (300, 300)  # counts are never thinned


def test_an_unknown_cohort_is_an_error_not_an_empty_sample(store) -> None:
    insert(store, requests=cohort_rows(BASELINE, 10, seed=1))
    with pytest.raises(UnknownCohortError, match=r"10\.9\.9\.9"):
        load_samples(store.con, Cohort(instances=("10.9.9.9:8000",)), HOUR)


def test_labels_the_records_do_not_carry_yet_are_refused_clearly(store) -> None:
    with pytest.raises(QueryError, match="revision"):
        load_samples(store.con, Cohort(labels={"revision": "r2"}), HOUR)


@pytest.mark.parametrize(
    "labels",
    [{"pool; DROP TABLE requests": "x"}, {"instance": "x"}],
    ids=["sql in a label name", "a column that is not a label"],
)
def test_label_names_outside_the_allow_list_are_refused(labels) -> None:
    with pytest.raises(ValidationError, match="unknown label"):
        Cohort(labels=labels)


def test_sql_looking_values_are_only_ever_data(store) -> None:
    insert(store, requests=cohort_rows(CANARY, 10, seed=2))
    hostile = Cohort(instances=("x' OR 1=1 --",), labels={"pool": "'; DROP TABLE requests; --"})
    with pytest.raises(UnknownCohortError):
        load_samples(store.con, hostile, HOUR)
    assert store.count("requests") == 10


@pytest.mark.parametrize(
    ("start", "end"),
    [(T0_MS, T0_MS), (T0_MS, T0_MS - 1), (T0_MS - MAX_RANGE_MS - 1, T0_MS), (-5, 10)],
    ids=["empty", "reversed", "longer than 31 days", "before 1970"],
)
def test_ranges_are_validated_and_bounded(start: int, end: int) -> None:
    with pytest.raises(ValidationError):
        TimeRange(start_ms=start, end_ms=end)


def test_a_cohort_must_select_something() -> None:
    with pytest.raises(ValidationError, match="instances or labels"):
        Cohort()


def test_probe_records_are_in_no_cohort(store) -> None:
    """The prober's requests through the entry point carry the pool and model of the users'
    (and fail when the entry point does): a cohort selected by labels must not count them."""
    probes = cohort_rows(
        "gateway:8080", 60, seed=4, outcomes={"error_before_first_token": 20}, source="probe"
    )
    insert(store, requests=cohort_rows(BASELINE, 200, seed=1) + probes)
    samples = load_samples(store.con, Cohort(labels={"pool": "llama-3-8b"}), HOUR)
    assert samples.requests == 200
    assert samples.rates["availability"] == (200, 200)
    assert samples.latency["ttft_s"].size == 200
    with pytest.raises(UnknownCohortError):
        load_samples(store.con, Cohort(instances=("gateway:8080",)), HOUR)


def test_a_canary_answering_clients_404_and_losing_cancels_is_judged_available(store) -> None:
    client_side = cohort_rows(CANARY, 300, seed=2)
    for row in client_side[:40]:
        row.update(outcome="error_before_first_token", http_status=404, ttft_s=None)
    for row in client_side[40:80]:
        row.update(outcome="client_cancelled", client_disconnected=True, ttft_s=None)
    insert(store, requests=client_side + cohort_rows(BASELINE, 300, seed=1))
    canary = load_samples(store.con, Cohort(instances=(CANARY,)), HOUR)
    baseline = load_samples(store.con, Cohort(instances=(BASELINE,)), HOUR)
    assert canary.rates["availability"] == (220, 220)
    assert canary.rates["error_before_first_token_rate"] == (0, 220)
    verdict = judge(canary, baseline, JudgeConfig())
    assert _classification(verdict, "availability") == "Pass"
    assert _classification(verdict, "error_before_first_token_rate") == "Pass"


def test_a_canary_answering_503_fails_on_availability(store) -> None:
    shedding = cohort_rows(CANARY, 300, seed=2)
    for row in shedding[:40]:
        row.update(outcome="rejected", http_status=503, ttft_s=None)
    insert(store, requests=shedding + cohort_rows(BASELINE, 300, seed=1))
    canary = load_samples(store.con, Cohort(instances=(CANARY,)), HOUR)
    baseline = load_samples(store.con, Cohort(instances=(BASELINE,)), HOUR)
    assert canary.rates["availability"] == (260, 300)
    verdict = judge(canary, baseline, JudgeConfig())
    assert _classification(verdict, "availability") == "Low"
    assert verdict.verdict == "fail"


def _classification(verdict: Verdict, name: str) -> str:
    return next(m.classification for m in verdict.metrics if m.name == name)
