"""The SLO spec: valid files build a model, invalid ones name the field path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from slo.buckets import check_bucket_bounds
from slo.spec import parse_spec
from slo.spec.loader import load_spec
from slo.spec.model import build_model
from slo.spec.openslo import openslo_to_spec
from slo.windows import load_catalog

EXAMPLE = Path(__file__).parents[3] / "config" / "slo.example.yaml"


def base() -> dict[str, Any]:
    return {
        "version": "llmslo/v1",
        "slos": [
            {
                "name": "ttft",
                "objective": 0.99,
                "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0},
            },
            {"name": "avail", "objective": 0.999, "sli": {"kind": "availability"}},
            {
                "name": "good",
                "objective": 0.95,
                "sli": {"kind": "goodput", "targets_s": {"ttft": 2, "tpot": 0.08}},
            },
        ],
    }


def test_the_example_spec_is_valid_and_carries_the_seed_targets() -> None:
    model = build_model(load_spec(EXAMPLE))
    by_name = {slo.name: slo for slo in model.slos}
    assert by_name["ttft-p99"].sli.threshold_s == 2.0  # type: ignore[union-attr]
    assert by_name["tpot-p99"].sli.threshold_s == 0.08  # type: ignore[union-attr]
    assert by_name["itl-jitter"].sli.threshold_s == 0.03  # type: ignore[union-attr]
    assert "availability" in by_name
    # the prober's own SLOs: availability and TTFT through the entry point
    assert by_name["probe-availability"].sli.source == "probe"
    assert by_name["probe-ttft"].sli.source == "probe"
    assert check_bucket_bounds(model) == []
    assert model.warnings == ()


@pytest.mark.parametrize(
    ("period", "factors"),
    [
        ("30d", [14.4, 6.0, 3.0, 1.0]),
        ("28d", [13.44, 5.6, 2.8, 0.9333333333]),
        ("7d", [13.44, 3.5, 1.4, 0.98]),
    ],
    ids=[
        "30 days gives the workbook factors",
        "28 days scales them",
        "7 days uses its own budget shares",
    ],
)
def test_burn_rate_factors_are_derived_from_the_budget_share(
    period: str, factors: list[float]
) -> None:
    catalog = load_catalog(period)
    assert [pair.factor for pair in catalog.pairs] == pytest.approx(factors)
    assert [pair.id for pair in catalog.pairs] == [
        "page-1h-5m",
        "page-6h-30m",
        "ticket-1d-2h",
        "ticket-3d-6h",
    ]


def _error(mutate: Any) -> str:
    raw = base()
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        parse_spec(raw, "spec.yaml")
    return str(info.value)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda r: r["slos"][2].update(objective=1.5), "slos[2].objective: must be in (0, 1)"),
        (lambda r: r["slos"][0].update(objective=0), "slos[0].objective: must be in (0, 1)"),
        (
            lambda r: r["slos"][0]["sli"].update(threshold_s=-1),
            "slos[0].sli.threshold_s: Input should be greater than 0",
        ),
        (
            lambda r: r["slos"][0]["sli"].update(metric="ttfb"),
            "slos[0].sli.metric: Input should be",
        ),
        (
            lambda r: r["slos"][1].update(period="13d"),
            "slos[1].period: no alert-window catalog for 13d",
        ),
        (lambda r: r["slos"][1].update(period="soon"), "slos[1].period: not a duration"),
        (
            lambda r: r["slos"][1].update(selector={"gpu": "0"}),
            "slos[1].selector.gpu: Extra inputs are not permitted",
        ),
        (lambda r: r["slos"][1].update(name="bad name!"), "slos[1].name: must be 2–63 characters"),
        (lambda r: r["slos"][1].update(name="ttft"), "'ttft' is used twice"),
        (
            lambda r: r["slos"][2]["sli"].update(targets_s={}),
            "slos[2].sli.targets_s: needs at least one",
        ),
        (
            lambda r: r["slos"][2]["sli"].update(own_targets=True),
            "slos[2].sli.targets_s: targets_s and own_targets: true exclude each other",
        ),
        (
            lambda r: (
                r["slos"][1]["alerting"].update()
                if False
                else r["slos"][1].update(alerting={"min_events": -1})
            ),
            "slos[1].alerting.min_events: Input should be greater than or equal to 0",
        ),
        (
            lambda r: (
                r["slos"][0]["sli"].update(source="engine")
                or r["slos"][0].update(group_by=["tenant"])
            ),
            "slos[0]: source engine has no tenant",
        ),
        (
            lambda r: r["slos"][0]["sli"].update(statistic="max"),
            "statistic applies only to metric itl",
        ),
        (
            lambda r: r["slos"][0]["sli"].update(metric="itl", source="probe"),
            "slos[0].sli: source probe records no ITL",
        ),
        (
            lambda r: r["slos"][1]["sli"].update(source="engine"),
            "slos[1].sli.source: Input should be 'tap' or 'probe'",
        ),
        (lambda r: r.update(version="sloth/v1"), "version: Input should be 'llmslo/v1'"),
        (lambda r: r.update(slos=[]), "slos: List should have at least 1 item"),
    ],
    ids=[
        "objective above 1",
        "objective zero",
        "negative threshold",
        "unknown latency metric",
        "period without a catalog",
        "period that is not a duration",
        "unknown selector key",
        "name with spaces",
        "duplicate names",
        "goodput without targets",
        "goodput with both its own and the spec's targets",
        "negative min_events",
        "engine source grouped by tenant",
        "statistic on ttft",
        "itl from the prober",
        "availability from engine histograms",
        "foreign version",
        "no slos",
    ],
)
def test_invalid_specs_name_the_field_path(mutate: Any, expected: str) -> None:
    message = _error(mutate)
    assert message.startswith("spec.yaml: invalid SLO spec")
    assert expected in message


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    raw = base()
    raw["slos"][0]["objective"] = 2
    raw["slos"][2]["objective"] = -1
    with pytest.raises(ConfigError) as info:
        parse_spec(raw)
    assert "slos[0].objective" in str(info.value) and "slos[2].objective" in str(info.value)


def test_engine_thresholds_must_be_a_bucket_bound_matched_numerically() -> None:
    raw = base()
    raw["slos"][0]["sli"].update(
        source="engine", dialect="vllm"
    )  # vLLM TTFT has 1.0, 2.5 but no 2.0
    problems = check_bucket_bounds(build_model(parse_spec(raw)))
    assert problems == [
        "slos[0].sli.threshold_s: 2 s is not a ttft bucket bound (default vllm buckets); "
        "nearest: 1, 2.5"
    ]
    raw["slos"][0]["sli"]["threshold_s"] = 2.5
    assert check_bucket_bounds(build_model(parse_spec(raw))) == []
    # bounds seen in the data win over the defaults, and match by value (2.0 == 2)
    raw["slos"][0]["sli"]["threshold_s"] = 2
    assert check_bucket_bounds(build_model(parse_spec(raw)), {"ttft": {0.5, 2.0, 5.0}}) == []


def test_engine_threshold_without_dialect_or_data_is_reported() -> None:
    raw = base()
    raw["slos"][0]["sli"].update(source="engine")
    (problem,) = check_bucket_bounds(build_model(parse_spec(raw)))
    assert "no ttft bucket bounds known" in problem


def test_unreachable_pairs_are_warned_about() -> None:
    raw = base()
    raw["slos"][0]["objective"] = 0.9  # 14.4 × 0.1 ≥ 1
    model = build_model(parse_spec(raw))
    assert any("page-1h-5m can never fire" in w for w in model.warnings)


def test_disabled_tiers_have_no_pairs() -> None:
    raw = base()
    raw["slos"][1]["alerting"] = {"ticket": False}
    slo = build_model(parse_spec(raw)).slos[1]
    assert {p.severity for p in slo.pairs} == {"page"}


@pytest.mark.parametrize(
    "text", ["", "- a\n- b\n", "version: [\n", "\x00\x01", "slos: 3\nversion: llmslo/v1\n"]
)
def test_malformed_files_raise_config_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_spec(path)


_json = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    key=st.sampled_from(["name", "objective", "period", "sli", "selector", "group_by", "alerting"]),
    value=_json,
)
def test_hostile_values_raise_config_error_or_validate(key: str, value: Any) -> None:
    raw = copy.deepcopy(base())
    raw["slos"][1][key] = value
    try:
        model = build_model(parse_spec(raw))
    except ConfigError as exc:
        assert "slos[1]" in str(exc)
    else:
        assert (
            model.slos[1].objective == raw["slos"][1].get("objective", 0.999) or key != "objective"
        )


def test_round_trip_through_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base()))
    assert [s.id for s in build_model(load_spec(path)).slos] == [
        "llm-inference-ttft",
        "llm-inference-avail",
        "llm-inference-good",
    ]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda r: r["slos"][1].update(objective=0.9999999),
            "slos[1].objective: 0.9999999 leaves an error budget of 1.0e-07",
        ),
        (lambda r: r["slos"][1].update(objective=0.999991), "slos[1].objective: 0.999991"),
        (lambda r: r["slos"][1].update(objective=True), "slos[1].objective: Input should be"),
        (
            lambda r: r["slos"][0]["sli"].update(threshold_s=True),
            "slos[0].sli.threshold_s: Input should be a valid number",
        ),
        (
            lambda r: r["slos"][2]["sli"]["targets_s"].update(ttft=False),
            "slos[2].sli.targets_s.ttft: Input should be a valid number",
        ),
        (
            lambda r: r["slos"][1].update(alerting={"min_events": True}),
            "slos[1].alerting.min_events: Input should be a valid integer",
        ),
        (
            lambda r: r["slos"][1].update(alerting={"page": "yes"}),
            "slos[1].alerting.page: Input should be a valid boolean",
        ),
    ],
    ids=[
        "seven nines",
        "just above five nines",
        "objective true",
        "threshold true",
        "goodput target false",
        "min_events true",
        "page 'yes'",
    ],
)
def test_nonsense_objectives_and_booleans_for_numbers_are_refused(
    mutate: Any, expected: str
) -> None:
    assert expected in _error(mutate)


def test_five_nines_is_accepted_and_more_only_with_the_override() -> None:
    raw = base()
    raw["slos"][1]["objective"] = 0.99999
    assert parse_spec(raw).slos[1].objective == 0.99999
    raw["slos"][1].update(objective=0.9999999, allow_objective_beyond_five_nines=True)
    assert parse_spec(raw).slos[1].objective == 0.9999999


def test_a_repeated_key_in_a_spec_names_the_key_and_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "version: llmslo/v1\nslos:\n  - name: a\n    objective: 0.99\n"
        "    sli: {kind: availability, kind: latency}\n"
    )
    with pytest.raises(ConfigError, match=r"duplicate key 'kind' \(first at line 5\)"):
        load_spec(spec)


def test_openslo_objectives_beyond_five_nines_need_the_annotation() -> None:
    source = {"type": "llmslo", "spec": {"kind": "availability"}}
    doc: dict[str, Any] = {
        "apiVersion": "openslo/v1",
        "kind": "SLO",
        "metadata": {"name": "avail"},
        "spec": {
            "service": "chat",
            "indicator": {
                "metadata": {"name": "ok"},
                "spec": {"thresholdMetric": {"metricSource": source}},
            },
            "objectives": [{"target": 0.9999999}],
        },
    }
    with pytest.raises(ConfigError, match=r"slos\[0\].objective: 0.9999999 leaves"):
        openslo_to_spec(doc)
    doc["metadata"]["annotations"] = {"llmslo.io/allow-objective-beyond-five-nines": "true"}
    assert openslo_to_spec(doc).slos[0].objective == 0.9999999
