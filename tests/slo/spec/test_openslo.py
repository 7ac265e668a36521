"""The OpenSLO v1 importer: supported documents map onto the llmslo model, the rest is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import ConfigError
from slo.spec.loader import load_spec
from slo.spec.model import build_model
from slo.spec.openslo import openslo_to_spec

SLI_SOURCE = {"type": "llmslo", "spec": {"kind": "latency", "metric": "ttft", "threshold_s": 2.0}}


def slo_doc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "service": "chat",
        "indicator": {
            "metadata": {"name": "ttft"},
            "spec": {"thresholdMetric": {"metricSource": SLI_SOURCE}},
        },
        "timeWindow": [{"duration": "28d", "isRolling": True}],
        "budgetingMethod": "Occurrences",
        "objectives": [{"displayName": "p99", "target": 0.99}],
    }
    base.update(spec)
    return {"apiVersion": "openslo/v1", "kind": "SLO", "metadata": {"name": "ttft"}, "spec": base}


def test_an_inline_indicator_becomes_an_llmslo_slo(tmp_path: Path) -> None:
    path = tmp_path / "openslo.yaml"
    path.write_text(yaml.safe_dump(slo_doc()))
    (slo,) = build_model(load_spec(path)).slos
    assert (slo.id, slo.objective, slo.catalog.name) == ("chat-ttft", 0.99, "google-28d.yaml")
    assert slo.sli.kind == "latency" and slo.sli.threshold_s == 2.0


def test_indicator_refs_and_several_objectives(tmp_path: Path) -> None:
    sli = {
        "apiVersion": "openslo/v1",
        "kind": "SLI",
        "metadata": {"name": "avail"},
        "spec": {
            "ratioMetric": {
                "good": {"metricSource": {"type": "llmslo", "spec": {"kind": "availability"}}},
                "total": {"metricSource": {"type": "llmslo", "spec": {}}},
            }
        },
    }
    doc = slo_doc(
        indicatorRef="avail",
        objectives=[{"displayName": "gold", "target": 0.999}, {"target": 0.99}],
    )
    del doc["spec"]["indicator"]
    path = tmp_path / "multi.yaml"
    path.write_text(yaml.safe_dump_all([sli, doc]))
    names = [s.name for s in build_model(load_spec(path)).slos]
    assert names == ["ttft-gold", "ttft-1"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"budgetingMethod": "Timeslices"}, "[0].spec.budgetingMethod: only Occurrences"),
        (
            {"timeWindow": [{"duration": "1M", "isRolling": False}]},
            "[0].spec.timeWindow[0].isRolling",
        ),
        (
            {
                "indicator": {
                    "spec": {
                        "thresholdMetric": {"metricSource": {"type": "Prometheus", "spec": {}}}
                    }
                }
            },
            "[0].spec.indicator.spec.thresholdMetric.metricSource.type: only 'llmslo'",
        ),
        ({"indicatorRef": "missing", "indicator": None}, None),
        ({"objectives": []}, "[0].spec.objectives: needs at least one"),
        ({"objectives": [{"target": 1.5}]}, "slos[0].objective: must be in (0, 1)"),
        (
            {"timeWindow": [{"duration": "13d", "isRolling": True}]},
            "slos[0].period: no alert-window catalog",
        ),
    ],
    ids=[
        "timeslices",
        "calendar window",
        "foreign metric source",
        "dangling ref",
        "no objectives",
        "target out of range",
        "period without catalog",
    ],
)
def test_unsupported_or_invalid_documents_name_the_path(
    change: dict[str, Any], message: str | None
) -> None:
    doc = slo_doc(**change)
    if doc["spec"].get("indicator") is None:
        doc["spec"].pop("indicator", None)
        message = "[0].spec.indicatorRef: no kind SLI named 'missing'"
    with pytest.raises(ConfigError) as info:
        openslo_to_spec([doc], "o.yaml")
    assert message is not None and message in str(info.value)


def test_documents_of_other_apis_are_refused() -> None:
    with pytest.raises(ConfigError, match="apiVersion: openslo/v1"):
        openslo_to_spec([{"apiVersion": "openslo/v2alpha"}])
