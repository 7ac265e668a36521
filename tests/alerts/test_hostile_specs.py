"""Hostile specs: a field that would steer PromQL or a template is refused with its field
path, and a selector value, whatever its characters, reaches the rules only as an escaped
string that matches itself (checked by promtool and by parsing every selector)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError
from slo.spec import parse_spec
from tests.alerts.conftest import generate, run

INJECT = 'a", slo_id=~".+'
AVAILABILITY = {"kind": "availability"}


def _doc(**slo: object) -> dict:
    return {"version": "llmslo/v1", "service": "svc",
            "slos": [{"name": "avail", "objective": 0.99, "sli": AVAILABILITY, **slo}]}  # fmt: skip


REFUSED = {
    "a service that closes a matcher": (
        {**_doc(), "service": INJECT},
        "service: must be 1–63 characters",
    ),
    "an alert name with a selector in it": (
        _doc(alerting={"name": 'Burn{severity="none"}'}),
        "slos[0].alerting.name: must be 1–128 characters",
    ),
    "a label name Prometheus cannot hold": (
        _doc(labels={"team-name": "x"}),
        "slos[0].labels: label name 'team-name'",
    ),
    "a reserved label name": (
        _doc(alerting={"labels": {"__name__": "up"}}),
        "slos[0].alerting.labels: label name '__name__'",
    ),
    "a label value running a query when the alert fires": (
        {**_doc(), "labels": {"team": '{{ query "up" }}'}},
        "labels: label team: only {{ $labels.<name> }}",
    ),
    "an annotation ranging over a query": (
        _doc(alerting={"annotations": {"summary": '{{ range query "up" }}{{ . }}{{ end }}'}}),
        "slos[0].alerting.annotations: annotation summary: only",
    ),
    "a description that is a template": (
        _doc(description="{{ printf `%s` $labels }}"),
        "slos[0].description: description: only",
    ),
    "a selector value with a newline": (
        _doc(selector={"pool": "a\nALERTS"}),
        "slos[0].selector.pool: 'a\\nALERTS': 1 to 253 printable characters",
    ),
}


@pytest.mark.parametrize("doc, message", REFUSED.values(), ids=REFUSED.keys())
def test_a_field_that_would_steer_rules_is_refused_with_its_path(doc: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_spec(doc)
    assert message in str(caught.value)


def test_safe_template_references_stay_allowed() -> None:
    annotations = {"summary": "{{ $labels.pool }} burns ({{ $value }})", "runbook": "see\nwiki"}
    parse_spec(_doc(alerting={"annotations": annotations, "labels": {"team": "{{$labels.team}}"}}))


#: Go/PromQL string: a label, an operator, a double-quoted string with backslash escapes.
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def _matchers(expr: str) -> list[tuple[str, str, str]]:
    """Every (label, op, decoded value) of every selector in ``expr``."""
    # json.loads decodes the escapes PromQL shares with Go/JSON (\\ \" \n \uXXXX).
    return [(label, op, json.loads(f'"{raw}"')) for label, op, raw in _MATCHER.findall(expr)]


def test_hostile_selector_values_are_escaped_and_match_only_themselves(
    tmp_path: Path, promtool: str
) -> None:
    weird = [INJECT, 'b\\"}', "c|d.*"]
    spec = {
        "version": "llmslo/v1",
        "service": "svc",
        "slos": [
            {"name": "one-pool", "objective": 0.99, "sli": AVAILABILITY,
             "selector": {"pool": INJECT}, "group_by": ["pool"]},
            {"name": "pools", "objective": 0.99, "sli": AVAILABILITY,
             "selector": {"pool": weird}},
            {"name": "engine-ttft", "objective": 0.99,
             "sli": {"kind": "latency", "metric": "ttft", "threshold_s": 2.5, "source": "engine",
                     "dialect": "vllm"},
             "selector": {"model": weird}},
        ],
    }  # fmt: skip
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    rules, _ = generate(path, tmp_path / "out")
    checked = run(promtool, "check", "rules", str(rules))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exprs = [
        rule["expr"]
        for group in yaml.safe_load(rules.read_text())["groups"]
        for rule in group["rules"]
        if "svc-" in group["name"]
    ]
    found = [m for expr in exprs for m in _matchers(expr)]
    assert found, "no selector parsed"
    # Only the labels the generator means to match on; slo_id only ever by equality.
    assert {label for label, _, _ in found} <= {
        "pool",
        "model_name",
        "le",
        "outcome",
        "code",
        "slo_id",
        "slo_service",
        "slo",
    }
    assert all(value.startswith("svc-") for label, op, value in found if label == "slo_id")
    assert all(op == "=" for label, op, _ in found if label in ("slo_id", "slo_service", "slo"))
    for label, op, value in found:
        if label == "pool" and op == "=":
            assert value == INJECT
        if label in ("pool", "model_name") and op == "=~":
            assert all(re.fullmatch(value, w) for w in weird)  # each value matches itself …
            assert not re.fullmatch(value, "c|d-anything") and not re.fullmatch(value, "a")


def test_generated_promtool_tests_of_a_hostile_pool_pass(tmp_path: Path, promtool: str) -> None:
    spec = _doc(selector={"pool": INJECT}, group_by=["pool"])
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    _, tests = generate(path, tmp_path / "out")
    (slo_test,) = (t for t in tests if t.name == "svc-avail.test.yml")
    assert '\\"' in slo_test.read_text()  # the input series carry the value escaped
    done = run(promtool, "test", "rules", str(slo_test))
    assert done.returncode == 0, done.stdout + done.stderr
