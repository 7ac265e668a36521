"""Sloth's and Pyrra's SLOs through llmslo page at the moments their own tools' rules do.

For a Sloth ``PrometheusServiceLevel`` and for Pyrra ratio and latency objectives, llmslo's
generated rules and the reference rules (Sloth's ``examples/_gen`` output in
``../shared/reference/sloth/``; Pyrra's expected rules from its Go tests in
``reference/``) run under promtool over the same synthetic series: steady burns at several
multiples of the error budget, and a short full outage. At every evaluation minute the set
of firing alerts (by severity, and for Pyrra by window pair) must be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from alerts import load_rule_model, render_bundle, write_all
from tests.alerts.conftest import REPO, SPECS
from tests.alerts.firing import Timeline, firing_timeline

SHARED = REPO.parent / "shared" / "reference"
REFERENCE = Path(__file__).parent / "reference"
MINUTES = 360
REQUESTS_PER_MINUTE = 10_000
#: Steady error ratios as multiples of the budget, around every factor of both tools.
BURNS = (0.5, 1.5, 4.0, 10.0, 20.0)
#: A full outage: good traffic, then every request fails for OUTAGE minutes, then good again.
OUTAGE_START, OUTAGE = 60, 10


def _cumulative(per_minute: list[float]) -> str:
    total, values = 0.0, ["0"]
    for step in per_minute:
        total += step
        values.append(f"{total:g}")
    return " ".join(values)


def _bad_fractions(scenario: str, budget: float) -> list[float]:
    if scenario == "outage":
        return [1.0 if OUTAGE_START <= m < OUTAGE_START + OUTAGE else 0.0 for m in range(MINUTES)]
    return [float(scenario.removesuffix("x")) * budget] * MINUTES


@dataclass(frozen=True)
class Case:
    """One foreign spec, its reference rules, the series shape and the labels compared."""

    spec: Path
    reference: Path
    budget: float
    series: Callable[[list[float]], dict[str, str]]
    by: tuple[str, ...]


def _ok_and_errors(metric: str, selector: str) -> Callable[[list[float]], dict[str, str]]:
    def series(bad: list[float]) -> dict[str, str]:
        errors = [f * REQUESTS_PER_MINUTE for f in bad]
        ok = [REQUESTS_PER_MINUTE - e for e in errors]
        return {
            f'{metric}{{{selector},code="500"}}': _cumulative(errors),
            f'{metric}{{{selector},code="200"}}': _cumulative(ok),
        }

    return series


def _histogram(metric: str, selector: str) -> Callable[[list[float]], dict[str, str]]:
    def series(bad: list[float]) -> dict[str, str]:
        fast = [(1 - f) * REQUESTS_PER_MINUTE for f in bad]
        return {
            f'{metric}_count{{{selector},code="200"}}': _cumulative(
                [REQUESTS_PER_MINUTE] * len(bad)
            ),
            f'{metric}_bucket{{{selector},code="200",le="1"}}': _cumulative(fast),
        }

    return series


CASES = {
    "Sloth PrometheusServiceLevel (getting started)": Case(
        SHARED / "specs" / "sloth-k8s-getting-started.yml",
        SHARED / "sloth" / "getting-started.rules.yml",
        0.001,
        _ok_and_errors("http_request_duration_seconds_count", 'job="myservice"'),
        ("sloth_severity",),
    ),
    "Pyrra ratio (http-ratio)": Case(
        SPECS / "pyrra-http-ratio.yaml",
        REFERENCE / "pyrra-http-ratio.rules.yml",
        0.01,
        _ok_and_errors("http_requests_total", 'job="thanos-receive-default"'),
        ("severity", "short", "long"),
    ),
    "Pyrra latency (http-latency)": Case(
        SPECS / "pyrra-http-latency.yaml",
        REFERENCE / "pyrra-http-latency.rules.yml",
        0.005,
        _histogram("http_request_duration_seconds", 'job="metrics-service-thanos-receive-default"'),
        ("severity", "short", "long"),
    ),
}
SCENARIOS = [f"{b:g}x" for b in BURNS] + ["outage"]


def _llmslo_rules(spec: Path, out: Path) -> Path:
    rules = out / "llmslo.rules.yml"
    write_all(render_bundle(load_rule_model(spec), rules, signatures=False))
    return rules


def _summary(timeline: Timeline) -> dict[tuple[tuple[str, str], ...], tuple[int, int]]:
    """Per alert: first and last minute it fires (for the failure message)."""
    spans: dict[tuple[tuple[str, str], ...], tuple[int, int]] = {}
    for minute, firing in sorted(timeline.items()):
        for labels in firing:
            first, _ = spans.get(labels, (minute, minute))
            spans[labels] = (first, minute)
    return spans


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", list(CASES))
def test_alerts_fire_at_the_same_minutes_as_the_original_tools(
    name: str, scenario: str, tmp_path: Path, promtool: str
) -> None:
    case = CASES[name]
    series = case.series(_bad_fractions(scenario, case.budget))
    ours = _llmslo_rules(case.spec, tmp_path)
    expected = firing_timeline(promtool, case.reference, series, MINUTES, case.by, tmp_path)
    got = firing_timeline(promtool, ours, series, MINUTES, case.by, tmp_path)
    assert got == expected, f"llmslo {_summary(got)} != reference {_summary(expected)}"


@pytest.mark.parametrize("name", list(CASES))
def test_the_scenarios_page_at_all(name: str, tmp_path: Path, promtool: str) -> None:
    """The comparison means something: under the reference rules, a 20x burn and the
    outage page, and a 0.5x burn does not."""
    case = CASES[name]
    timelines = {
        s: firing_timeline(
            promtool,
            case.reference,
            case.series(_bad_fractions(s, case.budget)),
            MINUTES,
            case.by,
            tmp_path,
        )
        for s in ("0.5x", "20x", "outage")
    }
    assert not timelines["0.5x"]
    assert timelines["20x"] and timelines["outage"]
