"""Prometheus value semantics: NaN is "no value"; impossible values reject their series only."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.canonical import TargetCanonicalizer
from collectors.exposition import ExpositionParser
from collectors.inspect import inspect_exposition
from collectors.semantics import REASONS
from tests.collectors.examples import vllm_exposition
from tests.collectors.piecewise import Page, PiecewiseServer
from tests.collectors.test_exposition import expositions
from tests.collectors.test_fetch import scrape_once

M = 'model_name="llama-3-8b"'
BASE = vllm_exposition()  # a healthy scrape the bad series are appended to


def canonicalize(text: str, canonicalizer: TargetCanonicalizer | None = None) -> Any:
    canonicalizer = canonicalizer or TargetCanonicalizer("10.0.0.7:8000")
    return canonicalizer.canonicalize(ExpositionParser().parse(text), 1000)


def metrics_of(batch: Any) -> set[str]:
    return set(batch.table["metric"].to_pylist())


def test_nan_is_kept_as_no_value_and_is_never_a_finding() -> None:
    text = BASE + (
        "# TYPE vllm:some_latency_seconds summary\n"
        f'vllm:some_latency_seconds{{{M},quantile="0.5"}} NaN\n'
        f'vllm:some_latency_seconds{{{M},quantile="0.99"}} NaN\n'
        f"vllm:some_latency_seconds_sum{{{M}}} 0\n"
        f"vllm:some_latency_seconds_count{{{M}}} 0\n"
        "# TYPE vllm:kv_cache_usage_perc_copy gauge\n"
        f"vllm:kv_cache_usage_perc_copy{{{M}}} NaN\n"
    )
    canonicalizer = TargetCanonicalizer("x:1")
    first = canonicalize(text, canonicalizer)
    second = canonicalize(text, canonicalizer)
    assert first.dropped == {} and second.dropped == {} and first.errors == []
    assert second.resets == {}
    rows = [r for r in second.table.to_pylist() if r["metric"] == "vllm:some_latency_seconds"]
    assert len(rows) == 2 and all(math.isnan(r["value"]) for r in rows)


def test_a_nan_between_two_scrapes_does_not_hide_a_counter_reset() -> None:
    def scrape(value: str) -> str:
        return f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{M}}} {value}\n"

    canonicalizer = TargetCanonicalizer("x:1")
    for value in ("500", "NaN"):
        canonicalize(scrape(value), canonicalizer)
    assert canonicalize(scrape("20"), canonicalizer).resets == {"value_drop": 1}


_HIST = "vllm:time_to_first_token_seconds"


def _histogram(buckets: dict[str, str], count: str, labels: str = M, name: str = _HIST) -> str:
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{labels},le="{le}"}} {v}' for le, v in buckets.items()]
    lines += [f"{name}_sum{{{labels}}} 1.5", f"{name}_count{{{labels}}} {count}"]
    return "\n".join(lines) + "\n"


GOOD = _histogram({"0.1": "1", "1.0": "3", "+Inf": "4"}, "4", 'model_name="other"', "app:good")


@pytest.mark.parametrize(
    ("bad", "reason", "rejected"),
    [
        (
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{M}}} +Inf\n",
            "non_finite_value",
            {"vllm:kv_cache_usage_perc"},
        ),
        (
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{M}}} 1e400\n",
            "non_finite_value",
            {"vllm:kv_cache_usage_perc"},
        ),
        (
            f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{M}}} -3\n",
            "negative_counter",
            {"vllm:prompt_tokens_total"},
        ),
        (
            _histogram({"0.1": "3", "1.0": "2", "+Inf": "4"}, "4"),
            "histogram_buckets_decrease",
            {f"{_HIST}_bucket", f"{_HIST}_sum", f"{_HIST}_count"},
        ),
        (
            _histogram({"0.1": "1", "1.0": "3", "+Inf": "4"}, "5"),
            "histogram_inf_not_count",
            {f"{_HIST}_bucket", f"{_HIST}_sum", f"{_HIST}_count"},
        ),
        (
            _histogram({"0.1": "1", "fast": "3", "+Inf": "4"}, "4"),
            "invalid_le",
            {f"{_HIST}_bucket", f"{_HIST}_sum", f"{_HIST}_count"},
        ),
        (
            f"# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{{M},engine="9"}} 1\n'
            f'vllm:num_requests_running{{engine="9",{M}}} 2\n',
            "duplicate_series",
            {"vllm:num_requests_running"},
        ),
        (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{M}}} 1\n"
            "# TYPE vllm:num_requests_waiting counter\n"
            f'vllm:num_requests_waiting{{{M},engine="1"}} 2\n',
            "type_redeclared",
            {"vllm:num_requests_waiting"},
        ),
    ],
    ids=[
        "+Inf in a gauge",
        "1e400 in a gauge",
        "negative counter",
        "decreasing buckets",
        "+Inf bucket differs from count",
        "le not a number",
        "duplicate series (label order)",
        "TYPE redeclared",
    ],
)
def test_impossible_values_reject_their_series_with_a_counted_reason_and_keep_the_rest(
    bad: str, reason: str, rejected: set[str]
) -> None:
    # the healthy scrape without the family under test, then the bad series, then a good one
    family = min(rejected, key=len).removesuffix("_sum")
    own = re.compile(rf"(^|\s){re.escape(family)}(_bucket|_sum|_count)?([{{\s]|$)")
    kept_text = "\n".join(line for line in BASE.splitlines() if not own.search(line))
    healthy = canonicalize(kept_text + "\n" + GOOD)
    batch = canonicalize(kept_text + "\n" + bad + GOOD)
    assert batch.dropped.get(reason, 0) >= 1, (batch.dropped, batch.errors)
    assert set(batch.dropped) == {reason}
    assert batch.errors and batch.errors[0].startswith(reason)
    assert not metrics_of(batch) & rejected
    assert batch.table.num_rows == healthy.table.num_rows  # the rest of the scrape is kept
    good_rows = [r for r in batch.table.to_pylist() if r["model"] == "other"]
    assert len(good_rows) == 5


def test_inspect_reports_rejected_series_as_bad_lines_with_their_reason() -> None:
    text = BASE + f"# TYPE vllm:x_total counter\nvllm:x_total{{{M}}} -1\n"
    report = inspect_exposition(text)
    assert report["bad_lines"] == 1
    assert any(e.startswith("negative_counter") for e in report["errors"])


def test_the_collector_counts_rejected_series_by_reason_and_stays_up() -> None:
    text = BASE + f"# TYPE vllm:x_total counter\nvllm:x_total{{{M}}} -1\n"
    with PiecewiseServer({"/metrics": Page(body=text)}) as server:
        collector, tables = scrape_once(server.url())
    health = collector.health[server.url()]
    assert health.up and health.bad_lines == 1
    assert health.samples == len(ExpositionParser().parse(BASE))
    assert "vllm:x_total" not in set(tables[0]["metric"].to_pylist())
    registry = collector.metrics.registry
    assert (
        registry.get_sample_value("llmslo_collect_dropped_total", {"reason": "negative_counter"})
        == 1.0
    )
    assert (
        registry.get_sample_value("llmslo_collect_bad_lines_total", {"target": server.url()}) == 1.0
    )


# -- property: the checks never raise, and every sample is either kept or counted -----------
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expositions, st.sampled_from(["auto", "vllm"]))
def test_every_sample_is_kept_or_counted_with_a_reason_and_nothing_raises(
    text: str, dialect: str
) -> None:
    exposition = ExpositionParser().parse(text)
    canonicalizer = TargetCanonicalizer("x:1", dialect=dialect)
    for ts_ms in (1000, 2000):  # the second scrape runs on cached templates
        batch = canonicalizer.canonicalize(exposition, ts_ms)
        stored = sum(1 for m in batch.table["metric"].to_pylist() if not m.startswith("llmslo:"))
        assert stored + sum(batch.dropped.values()) == len(exposition)
        assert not any(math.isinf(v) for v in batch.table["value"].to_pylist())
        rejected = sum(batch.dropped.get(reason, 0) for reason in REASONS)
        assert len(batch.errors) == min(rejected, 20)


_SCRAPE_VALUES = st.sampled_from(["1", "2", "3", "0", "-1", "+Inf", "NaN"])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(_SCRAPE_VALUES, min_size=6, max_size=6)),
        min_size=1,
        max_size=6,
    )
)
def test_repeated_scrapes_of_the_same_series_are_judged_on_their_own_values(
    scrapes: list[tuple[bool, list[str]]],
) -> None:
    """The canonicalizer keeps what a scrape's series alone decide (its duplicates, histogram
    groups, template rows) for the next scrape of the same series in the same order: the rows,
    drops and errors are those of the same scrapes each computed afresh."""
    kept, afresh = TargetCanonicalizer("10.0.0.7:8000"), TargetCanonicalizer("10.0.0.7:8000")
    for step, (reverse, (b1, b2, inf, count, counter, gauge)) in enumerate(scrapes):
        lines = _histogram({"0.1": b1, "1.0": b2, "+Inf": inf}, count).splitlines()[1:]
        lines += [
            f"vllm:prompt_tokens_total{{{M}}} {counter}",
            f"vllm:kv_cache_usage_perc{{{M}}} {gauge}",
        ]
        text = "\n".join(
            [
                f"# TYPE {_HIST} histogram",
                "# TYPE vllm:prompt_tokens_total counter",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                *(reversed(lines) if reverse else lines),
            ]
        )
        afresh._shapes.clear()  # nothing kept from the scrapes before
        got = kept.canonicalize(ExpositionParser().parse(text + "\n"), 1000 + step)
        expected = afresh.canonicalize(ExpositionParser().parse(text + "\n"), 1000 + step)
        assert (got.dropped, got.errors, got.resets) == (
            expected.dropped,
            expected.errors,
            expected.resets,
        )
        assert repr(got.table.to_pylist()) == repr(expected.table.to_pylist())  # NaN as 'nan'
