"""A Sloth spec through llmslo: its alerts fire and resolve at the same evaluation times as
Sloth's own generated rules on the same series (Sloth's getting-started example)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import load_rule_model
from tests.alerts.conftest import SPECS, generate, run

#: When Sloth's own rules (examples/_gen/getting-started.yml) fire on these series, per
#: minute, measured with promtool 2.42 with recordings evaluated before alerts:
#: scenario name → (series, {minute: severities firing}).
_ERRORS = 'http_request_duration_seconds_count{job="myservice",code="500"}'
_OK = 'http_request_duration_seconds_count{job="myservice",code="200"}'
SLOTH_TIMELINE: dict[str, tuple[dict[str, str], dict[int, tuple[str, ...]]]] = {
    "20x burn": (
        {_ERRORS: "0+12x180", _OK: "0+588x180"},
        {0: (), **{m: ("page", "ticket") for m in range(1, 8)}, 30: ("page", "ticket")},
    ),
    "0.5x burn": ({_ERRORS: "0+1x180", _OK: "0+1999x180"}, {30: (), 90: (), 180: ()}),
    "10m outage": (
        {_ERRORS: "0x60 0+600x10 6000x60", _OK: "0+600x60 36000x10 36000+600x60"},
        {
            **{m: () for m in (59, 60, 61)},
            **{m: ("page", "ticket") for m in range(62, 101)},
            **{m: ("ticket",) for m in range(101, 111)},
        },
    ),
}


def _case(series: dict[str, str], timeline: dict[int, tuple[str, ...]]) -> dict[str, Any]:
    query = (
        'max by (sloth_severity) (ALERTS{alertname="MyServiceHighErrorRate",alertstate="firing"})'
    )
    return {
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "promql_expr_test": [
            {
                "expr": query,
                "eval_time": f"{minute}m",
                "exp_samples": [
                    {"labels": f'{{sloth_severity="{s}"}}', "value": 1} for s in severities
                ],
            }
            for minute, severities in timeline.items()
        ],
    }


def test_sloth_spec_fires_and_resolves_when_sloths_rules_do(tmp_path: Path, promtool: str) -> None:
    rules, _ = generate(SPECS / "sloth-getting-started.yaml", tmp_path)
    groups = [g["name"] for g in yaml.safe_load(rules.read_text())["groups"]]
    document = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "group_eval_order": groups,
        "tests": [_case(series, timeline) for series, timeline in SLOTH_TIMELINE.values()],
    }
    test = tmp_path / "sloth-timeline.test.yml"
    test.write_text(yaml.safe_dump(document))
    result = run(promtool, "test", "rules", str(test))
    assert result.returncode == 0, result.stdout + result.stderr


def test_sloth_labels_and_records_are_kept(tmp_path: Path, promtool: str) -> None:
    rules, _ = generate(SPECS / "sloth-getting-started.yaml", tmp_path)
    page = {
        "category": "availability",
        "owner": "myteam",
        "repo": "myorg/myservice",
        "tier": "2",
        "routing_key": "myteam",
        "severity": "pageteam",
        "sloth_id": "myservice-requests-availability",
        "sloth_service": "myservice",
        "sloth_slo": "requests-availability",
        "sloth_severity": "page",
        "sli_kind": "events",
    }
    document = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in yaml.safe_load(rules.read_text())["groups"]],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _ERRORS, "values": "0+12x180"},
                    {"series": _OK, "values": "0+588x180"},
                ],
                "promql_expr_test": [
                    {
                        "expr": 'round(slo:current_burn_rate:ratio{sloth_id="myservice-requests-availability"}, 0.1)',
                        "eval_time": "30m",
                        "exp_samples": [
                            {
                                "labels": '{owner="myteam",repo="myorg/myservice",sloth_id="myservice-requests-availability",'
                                'sloth_service="myservice",sloth_slo="requests-availability",sloth_window="5m",tier="2"}',
                                "value": 20,
                            }
                        ],
                    },
                    {
                        "expr": 'ALERTS{alertname="MyServiceHighErrorRate",alertstate="firing",window="1h-5m"}',
                        "eval_time": "30m",
                        "exp_samples": [
                            {
                                "labels": "ALERTS{"
                                + ",".join(
                                    f'{k}="{v}"'
                                    for k, v in sorted(
                                        {
                                            **page,
                                            "alertname": "MyServiceHighErrorRate",
                                            "alertstate": "firing",
                                            "window": "1h-5m",
                                        }.items()
                                    )
                                )
                                + "}",
                                "value": 1,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test = tmp_path / "labels.test.yml"
    test.write_text(yaml.safe_dump(document))
    result = run(promtool, "test", "rules", str(test))
    assert result.returncode == 0, result.stdout + result.stderr
    model = load_rule_model(SPECS / "sloth-getting-started.yaml")
    assert model.slos[0].objective == pytest.approx(0.999)
