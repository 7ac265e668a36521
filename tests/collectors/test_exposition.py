"""The exposition parser: same result as prometheus-client on valid input, never crashes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families as pc_families

from collectors.exposition import ExpositionParser, parse_exposition, to_metric_families
from tests.collectors.examples import dcgm_exposition, sglang_exposition, vllm_exposition


def _normal(metrics: list[object]) -> list[tuple[object, ...]]:
    """Families as comparable tuples (values as floats, NaN as a marker)."""
    out: list[tuple[object, ...]] = []
    for m in metrics:
        samples = [
            (
                s.name,
                dict(s.labels),
                "NaN" if math.isnan(float(s.value)) else float(s.value),
                s.timestamp,
            )
            for s in m.samples  # type: ignore[attr-defined]
        ]
        out.append((m.name, m.type, m.documentation, samples))  # type: ignore[attr-defined]
    return out


def assert_same_as_prometheus_client(text: str) -> None:
    ours = parse_exposition(text)
    assert ours.bad_lines == 0, ours.errors
    assert _normal(to_metric_families(ours)) == _normal(list(pc_families(text)))


# -- strategies: valid 0.0.4 expositions ---------------------------------------------------
names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in ("le", "quantile") and not n.startswith("__")
)
label_values = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True)
    .map(repr)
    .map(lambda r: {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}.get(r, r)),
    st.integers(-(10**12), 10**12).map(str),
    st.sampled_from(
        ["1.0", "8.128902e+06", "9.75010481363281e-06", "0.000000", "NaN", "+Inf", "-Inf", "1e3"]
    ),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def label_sets(draw: Any) -> str:  # Any: hypothesis's DrawFn typing trips on mixed draws
    pairs = draw(st.dictionaries(label_names, label_values, max_size=4))
    if not pairs and draw(st.booleans()):
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())
    if pairs and draw(st.booleans()):
        body += ","
    return "{" + body + "}"


@st.composite
def families(draw: st.DrawFn) -> str:
    name = draw(names)
    kind = draw(st.sampled_from(["counter", "gauge", "untyped", "histogram", "summary", None]))
    lines = []
    if draw(st.booleans()):
        help_text = draw(
            st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
        )
        lines.append(f"# HELP {name} " + help_text.replace("\\", "\\\\").replace("\n", "\\n"))
    if kind is not None:
        lines.append(f"# TYPE {name} {kind}")
    count = draw(st.integers(0, 4))
    for _ in range(count):
        labels = draw(label_sets())
        ts = f" {draw(st.integers(0, 2**41))}" if draw(st.integers(0, 5)) == 0 else ""
        if kind == "histogram":
            inner = labels[1:-1].rstrip(",") if labels else ""
            sep = "," if inner else ""
            for le in ("0.5", "2.0", "+Inf"):
                lines.append(f'{name}_bucket{{{inner}{sep}le="{le}"}} {draw(values)}{ts}')
            lines.append(f"{name}_sum{labels} {draw(values)}{ts}")
            lines.append(f"{name}_count{labels} {draw(values)}{ts}")
        else:
            lines.append(f"{name}{labels} {draw(values)}{ts}")
    return "\n".join(lines)


expositions = st.lists(families(), max_size=6).map(lambda fs: "\n".join(fs) + "\n")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expositions)
def test_generated_expositions_parse_like_prometheus_client(text: str) -> None:
    assert_same_as_prometheus_client(text)


@settings(max_examples=60, deadline=None)
@given(expositions)
def test_cached_second_parse_equals_first(text: str) -> None:
    parser = ExpositionParser()
    first = _normal(to_metric_families(parser.parse(text)))
    assert _normal(to_metric_families(parser.parse(text))) == first


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_never_raises_and_counts_bad_lines(text: str) -> None:
    exposition = ExpositionParser().parse(text)
    assert exposition.bad_lines >= 0
    assert len(exposition.series) == len(exposition.values) == len(exposition.family_index)
    assert len(exposition.errors) <= min(exposition.bad_lines, 20)


@settings(max_examples=80, deadline=None)
@given(expositions, st.lists(st.text(max_size=40), min_size=1, max_size=5))
def test_garbage_lines_are_counted_and_good_lines_survive(text: str, garbage: list[str]) -> None:
    junk = [g.replace("\n", " ") for g in garbage if g.strip() and not g.strip().startswith("#")]
    junk = [g for g in junk if parse_exposition(g).bad_lines == 1]
    mixed = text + "\n".join(junk) + "\n"
    exposition = parse_exposition(mixed)
    assert exposition.bad_lines == len(junk)
    assert len(exposition) >= len(parse_exposition(text))


@pytest.mark.parametrize(
    "text",
    [
        vllm_exposition(engines=4),
        vllm_exposition(legacy=True),
        sglang_exposition(dp_ranks=2),
        dcgm_exposition(mig=True, lowercase=True, allocated={1: ("p", "ns", "c")}),
    ],
    ids=["vllm data-parallel", "vllm legacy", "sglang dp ranks", "dcgm mig lowercase"],
)
def test_real_engine_expositions_parse_like_prometheus_client(text: str) -> None:
    assert_same_as_prometheus_client(text)


def test_edge_formats_sum_before_buckets_exponents_nan_inf_and_label_order() -> None:
    text = (
        "# HELP sglang:e2e_request_latency_seconds e2e\n"
        "# TYPE sglang:e2e_request_latency_seconds histogram\n"
        'sglang:e2e_request_latency_seconds_sum{name="m"} 8.128902e+06\n'
        'sglang:e2e_request_latency_seconds_bucket{le="2.0",name="m"} 3.0\n'
        'sglang:e2e_request_latency_seconds_bucket{name="m",le="+Inf"} 4.0\n'
        'sglang:e2e_request_latency_seconds_count{name="m"} 4.0\n'
        "# TYPE g gauge\n"
        'g{a="x\\"q\\\\z\\n"} NaN\n'
        'g{b="1"} +Inf\n'
        'g{c="1"} -Inf 1700000000000\n'
    )
    assert_same_as_prometheus_client(text)
    exposition = parse_exposition(text)
    assert exposition.values[0] == 8128902.0
    assert math.isnan(exposition.values[4]) and exposition.values[5] == math.inf
    assert exposition.series[4].labels == {"a": 'x"q\\z\n'}
    assert exposition.timestamps_ms == {6: 1700000000000}
    assert exposition.families[0].type == "histogram"


def test_created_series_form_their_own_gauge_family_like_prometheus_client() -> None:
    text = vllm_exposition()
    exposition = parse_exposition(text)
    created = [f for f in exposition.families if f.name.endswith("_created")]
    assert created and all(f.type == "gauge" for f in created)
    assert_same_as_prometheus_client(text)


def test_bad_lines_are_reported_with_a_reason_and_do_not_stop_parsing() -> None:
    text = (
        'ok 1\nbroken{a="1" 2\nvalue_ 1_000\n# TYPE t nonsense\n'
        'fine{a="b"} 2\nnot a sample at all\n'
    )
    exposition = parse_exposition(text)
    assert [s.name for s in exposition.series] == ["ok", "fine"]
    assert exposition.bad_lines == 4
    assert len(exposition.errors) == 4


def test_openmetrics_matches_the_openmetrics_parser() -> None:
    text = (
        "# TYPE req counter\n# HELP req Requests.\n"
        'req_total{path="/a"} 3.0\nreq_created{path="/a"} 1.7e9\n'
        "# TYPE lat histogram\n"
        'lat_bucket{le="0.5"} 1.0 # {trace_id="abc"} 0.25\nlat_bucket{le="+Inf"} 2.0\n'
        "lat_count 2.0\nlat_sum 1.5\n"
        "# TYPE temp_celsius gauge\n# UNIT temp_celsius celsius\ntemp_celsius 21.5 1700000000.5\n"
        "# EOF\n"
    )
    exposition = parse_exposition(text)
    assert exposition.openmetrics and exposition.bad_lines == 0
    expected = [
        (m.name, m.type, [(s.name, dict(s.labels), float(s.value)) for s in m.samples])
        for m in om_families(text)
    ]
    got: list[tuple[str, str, list[tuple[str, dict[str, str], float]]]] = [
        (f.name, f.type, []) for f in exposition.families
    ]
    for family, series, value in exposition.samples():
        got[exposition.families.index(family)][2].append((series.name, dict(series.labels), value))
    assert got == expected
    assert exposition.timestamps_ms == {len(exposition) - 1: 1700000000500}
    assert exposition.exemplars[2][1] == 0.25


def test_hostile_lines_are_rejected_in_linear_time() -> None:
    hostile = [
        "a{" + "x" * 50_000 + " 1",
        'a{b="' + "\\x" * 50_000 + " 1",
        "a{" + 'b="c",' * 20_000 + " 1",
        'a{b="' + "x" * 200_000,
    ]
    exposition = parse_exposition("\n".join(hostile) + "\nok 1\n")
    assert exposition.bad_lines == 4 and [s.name for s in exposition.series] == ["ok"]
