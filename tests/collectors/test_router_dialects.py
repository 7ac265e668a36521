"""Routers in front of a pool, from their real output: llm-d-router's EPP under its new
``llm_d_epp_*`` names, under its deprecated names, and both at once as it emits them now
(each counted once); NVIDIA Dynamo's frontend. ``llmslo scrape --json`` names the dialect;
the signal values are what ``prometheus_client`` parses from the same text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.canonical import TargetCanonicalizer
from llmslo.cli import main
from simulator.gateway_metrics import ROUTER_NAMES, GatewayMetrics
from tests.collectors.piecewise import Page, PiecewiseServer
from tests.collectors.test_canonical import rows_of

FIXTURES = Path(__file__).parent / "fixtures"
NEW = (
    "llm_d_request_total_metric",
    "llm_d_request_error_total_metric",
    "llm_d_running_requests_metrics",
)
OLD = ("request_total_metric", "request_error_total_metric", "running_requests_metrics")


def _text(*names: str) -> str:
    return "".join((FIXTURES / "epp" / n).read_text() for n in names)


def _client_sum(text: str, family: str) -> float:
    """What prometheus_client parses: the sum of a family's samples."""
    (found,) = [f for f in text_string_to_metric_families(text) if f.name == family]
    return sum(s.value for s in found.samples if not s.name.endswith("_created"))


def _scrape(text: str, capsys: pytest.CaptureFixture[str]) -> dict:
    with PiecewiseServer({"/metrics": Page(body=text)}) as server:
        assert main(["scrape", f"{server.host_port}/metrics", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _signal_sums(text: str) -> dict[str, float]:
    canonicalizer = TargetCanonicalizer("epp:9090")
    sums: dict[str, float] = {}
    for row in rows_of(text, canonicalizer=canonicalizer):
        if row["signal"]:
            sums[row["signal"]] = sums.get(row["signal"], 0.0) + float(row["value"])
    return sums


@pytest.mark.parametrize(
    ("names", "family", "sources"),
    [
        (NEW, "llm-d-router (llm_d_epp_*, deprecated twins beside them)", "llm_d_epp"),
        (OLD, "v1.x (InferenceObjective: inference_objective_*)", "inference_objective"),
        (NEW + OLD, "llm-d-router (llm_d_epp_*, deprecated twins beside them)", "llm_d_epp"),
    ],
    ids=["new names alone", "deprecated names alone", "both generations, as emitted now"],
)
def test_the_epp_is_recognised_in_either_generation_and_counted_once(
    names: tuple[str, ...], family: str, sources: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _text(*names)
    report = _scrape(text, capsys)
    assert (report["dialect"], report["version_family"]) == ("epp", family)
    for signal in ("gateway_requests", "gateway_request_errors", "gateway_running"):
        assert all(m.startswith(sources) for m in report["signals"][signal]["metrics"]), signal
    prefix = "llm_d_epp_" if sources == "llm_d_epp" else "inference_objective_"
    expected = {
        "gateway_requests": _client_sum(text, prefix + "request"),
        "gateway_request_errors": _client_sum(text, prefix + "request_error"),
        "gateway_running": _client_sum(
            text,
            "llm_d_epp_request_running" if prefix == "llm_d_epp_" else prefix + "running_requests",
        ),
    }
    sums = _signal_sums(text)
    assert {k: sums[k] for k in expected} == expected
    assert expected["gateway_requests"] == 4.0  # 2 + 1 + 1 in both files: once, not 8


def test_the_new_error_codes_reach_the_signal_by_code(capsys: pytest.CaptureFixture[str]) -> None:
    canonicalizer = TargetCanonicalizer("epp:9090")
    rows = rows_of(_text(*NEW, *OLD), canonicalizer=canonicalizer)
    codes = {
        json.loads(r["labels_json"])["error_code"]: r["value"]
        for r in rows
        if r["signal"] == "gateway_request_errors"
    }
    assert codes == {"Internal": 2.0, "ModelServerError": 1.0, "ResourceExhausted": 1.0}


#: The router's own verdict on per-request SLO targets, in the shape its recorder writes
#: (``sloViolationCounter``: labels model_name, target_model_name, type); no testdata file
#: of llm-d-router's holds it, so this text is written here, one generation per name.
_VIOLATIONS = """\
# HELP {name} [ALPHA] Counter of SLO violations for each model, target model, and violation type.
# TYPE {name} counter
{name}{{model_name="m10",target_model_name="t10",type="ttft"}} {ttft}
{name}{{model_name="m10",target_model_name="t10",type="tpot"}} {tpot}
"""
NEW_VIOLATIONS = _VIOLATIONS.format(name="llm_d_epp_request_slo_violation_total", ttft=3, tpot=1)
OLD_VIOLATIONS = _VIOLATIONS.format(
    name="inference_objective_request_slo_violation_total", ttft=3, tpot=1
)


@pytest.mark.parametrize(
    ("violations", "metric"),
    [
        (NEW_VIOLATIONS, "llm_d_epp_request_slo_violation_total"),
        (OLD_VIOLATIONS, "inference_objective_request_slo_violation_total"),
        (NEW_VIOLATIONS + OLD_VIOLATIONS, "llm_d_epp_request_slo_violation_total"),
    ],
    ids=["new name alone", "deprecated name alone", "both generations, counted once"],
)
def test_the_routers_slo_violations_reach_their_signal_by_type(
    violations: str, metric: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = NEW if metric.startswith("llm_d_epp") else OLD
    text = _text(*names) + violations
    report = _scrape(text, capsys)
    assert report["dialect"] == "epp"
    assert report["signals"]["gateway_slo_violations"]["metrics"] == [metric]
    rows = rows_of(text, canonicalizer=TargetCanonicalizer("epp:9090"))
    by_type = {
        json.loads(r["labels_json"])["type"]: r["value"]
        for r in rows
        if r["signal"] == "gateway_slo_violations"
    }
    assert by_type == {"ttft": 3.0, "tpot": 1.0}
    assert _signal_sums(text)["gateway_slo_violations"] == _client_sum(violations, metric[:-6])


def test_a_dynamo_frontend_is_recognised(capsys: pytest.CaptureFixture[str]) -> None:
    text = (FIXTURES / "dynamo" / "frontend_metrics").read_text()
    report = _scrape(text, capsys)
    assert (report["dialect"], report["version_family"]) == (
        "dynamo-frontend",
        "NVIDIA Dynamo frontend (dynamo_frontend_*)",
    )
    assert report["signals"]["gateway_running"]["values"] == [
        _client_sum(text, "dynamo_frontend_inflight_requests")
    ]


@pytest.mark.parametrize(
    ("names", "dialect"),
    [("inference-extension", "epp"), ("llm-d-router", "epp"), ("dynamo", "dynamo-frontend")],
)
def test_the_simulated_gateway_speaks_each_router_and_scrape_names_it(
    names: str, dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = GatewayMetrics("llama", names)  # type: ignore[arg-type]
    for _ in range(3):
        metrics.scheduled("round_robin", "llama")
    metrics.refused(429, "queue_full", "llama")
    metrics.forwarding("llama", 2)
    metrics.queued(5)
    text = generate_latest(metrics.registry).decode()
    report = _scrape(text, capsys)
    assert report["dialect"] == dialect
    sums = _signal_sums(text)
    assert (sums["gateway_requests"], sums["gateway_running"], sums["gateway_queue"]) == (4, 2, 5)
    assert set(ROUTER_NAMES) == {"inference-extension", "llm-d-router", "dynamo"}
