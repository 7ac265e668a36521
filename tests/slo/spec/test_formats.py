"""The foreign SLO formats: the tools' own examples convert, the rules they give pass
promtool, a Sloth CRD becomes a schema-valid PrometheusRule, and bad documents are reported
with their format, the supported formats and the failing field path."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from alerts import load_rule_model
from llmslo.cli import main
from pipeline.errors import ConfigError
from slo.spec.loader import load_spec
from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT.parent / "shared" / "reference"
SPECS = REFERENCE / "specs"
EXAMPLES = {
    "Sloth PrometheusServiceLevel": SPECS / "sloth-k8s-getting-started.yml",
    "OpenSLO v1alpha as Sloth reads it": SPECS / "sloth-openslo-v1alpha-getting-started.yml",
    "Pyrra latency (caddy)": SPECS / "pyrra-caddy-response-latency.yaml",
    "Pyrra ratio with a namespace (coredns)": SPECS / "pyrra-coredns-response-errors.yaml",
}


def _schema(crd_file: Path, version: str | None = None) -> dict[str, Any]:
    crd = yaml.safe_load(crd_file.read_text())
    versions = crd["spec"]["versions"]
    chosen = next(v for v in versions if version is None or v["name"] == version)
    return dict(chosen["schema"]["openAPIV3Schema"])


def _errors(obj: Any, schema: dict[str, Any]) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]


def _generate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["rules", "generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_the_tools_examples_convert_and_pass_promtool(name: str, tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yml"
    argv = ["rules", "generate", str(EXAMPLES[name]), "--format", "rules", "-o", str(rules)]
    assert main(argv) == 0
    check = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    model = load_rule_model(EXAMPLES[name])
    assert model.slos and all(slo.error_query for slo in model.slos)


def test_the_reference_inputs_are_valid_objects_of_their_crds() -> None:
    """Our examples are what the tools accept (so the importers are tested on real input)."""
    sloth = yaml.safe_load(EXAMPLES["Sloth PrometheusServiceLevel"].read_text())
    assert not _errors(sloth, _schema(SPECS / "sloth.slok.dev_prometheusservicelevels.yaml"))
    for key in ("Pyrra latency (caddy)", "Pyrra ratio with a namespace (coredns)"):
        pyrra = yaml.safe_load(EXAMPLES[key].read_text())
        assert not _errors(pyrra, _schema(SPECS / "pyrra.dev_servicelevelobjectives.yaml"))


def test_a_sloth_crd_becomes_a_valid_prometheusrule_named_like_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _generate(capsys, str(EXAMPLES["Sloth PrometheusServiceLevel"]), "-o", "-")
    assert code == 0, err
    rule = yaml.safe_load(out)
    assert (rule["kind"], rule["metadata"]["name"], rule["metadata"]["namespace"]) == (
        "PrometheusRule",
        "sloth-slo-my-service",
        "monitoring",
    )
    schema = _schema(REFERENCE / "crds" / "monitoring.coreos.com_prometheusrules.yaml")
    assert not _errors(rule, schema)
    groups = [g for g in rule["spec"]["groups"] if "-slo-alerts-" in g["name"]]
    alerts = [r for g in groups for r in g["rules"]]
    assert {a["labels"]["sloth_severity"] for a in alerts} == {"page", "ticket"}
    assert {a["alert"] for a in alerts} == {"MyServiceHighErrorRate"}
    page = next(a for a in alerts if a["labels"]["sloth_severity"] == "page")
    assert page["labels"]["routing_key"] == "myteam"  # pageAlert.labels (camelCase) kept


def test_format_rules_writes_a_plain_rule_file_for_a_crd(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(EXAMPLES["Sloth PrometheusServiceLevel"])
    code, out, _ = _generate(capsys, path, "--format", "rules", "-o", "-")
    assert code == 0 and "kind" not in yaml.safe_load(out) and yaml.safe_load(out)["groups"]


def test_openslo_v1alpha_records_the_sli_like_sloth_and_pages_nobody() -> None:
    model = load_rule_model(EXAMPLES["OpenSLO v1alpha as Sloth reads it"])
    (slo,) = model.slos
    assert (slo.id, slo.objective, slo.period, slo.pairs) == (
        "my-service-sloth-slo-my-service-0",
        pytest.approx(0.999),
        "30d",
        (),
    )
    assert slo.error_query.startswith("1 - ((sum(rate(") and slo.total_query == "1"


def test_pyrra_labels_windows_and_for_follow_pyrra() -> None:
    (slo,) = load_rule_model(EXAMPLES["Pyrra ratio with a namespace (coredns)"]).slos
    # 2w window: Pyrra's windows scaled from 28d and rounded to the minute, factors kept.
    assert [(p.severity, p.short_ms // 60000, p.long_ms // 60000, p.factor) for p in slo.pairs] == [
        ("critical", 3, 30, 14),
        ("critical", 15, 180, 7),
        ("warning", 60, 720, 2),
        ("warning", 180, 2880, 1),
    ]
    assert [slo.pair_for_ms[p.id] // 60000 for p in slo.pairs] == [1, 8, 30, 90]
    assert slo.labels == {"job": "kube-dns"}  # `prometheus`/`role` lack the pyrra.dev/ prefix
    assert slo.pair_labels[slo.pairs[0].id] == {"short": "3m", "long": "30m", "exhaustion": "1d"}


def _write(tmp_path: Path, *docs: dict[str, Any]) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def _pyrra(**spec: Any) -> dict[str, Any]:
    body = {
        "target": "99.5",
        "window": "4w",
        "indicator": {
            "ratio": {"errors": {"metric": 'x_total{code="5"}'}, "total": {"metric": "x_total"}}
        },
    }
    body.update(spec)
    return {
        "apiVersion": "pyrra.dev/v1alpha1",
        "kind": "ServiceLevelObjective",
        "metadata": {"name": "x", "labels": {"pyrra.dev/team": "infra"}},
        "spec": body,
    }


def _message(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_rule_model(path)
    return str(info.value)


def test_a_misspelt_kind_names_the_format_and_what_is_supported(tmp_path: Path) -> None:
    doc = {**_pyrra(), "kind": "ServiceLevelObjectives"}
    message = _message(_write(tmp_path, doc))
    assert "apiVersion 'pyrra.dev/v1alpha1' is Pyrra" in message
    assert "did you mean kind 'ServiceLevelObjective'" in message
    assert (
        "Sloth Kubernetes CRD (apiVersion: sloth.slok.dev/v1, kind: PrometheusServiceLevel)"
        in message
    )


@pytest.mark.parametrize(
    ("header", "looks_like"),
    [
        (
            {"apiVersion": "sloth.slok.dev/v2", "kind": "PrometheusServiceLevel"},
            "Sloth Kubernetes CRD",
        ),
        ({"version": "prometheus/v2"}, "Sloth prometheus/v1"),
        ({"apiVersion": "openslo/v2", "kind": "SLO"}, "OpenSLO"),
    ],
    ids=["a Sloth CRD of an unknown version", "a misspelt Sloth version", "OpenSLO v2"],
)
def test_an_unsupported_version_says_what_it_looks_like(
    tmp_path: Path, header: dict[str, str], looks_like: str
) -> None:
    message = _message(_write(tmp_path, {**header, "spec": {}}))
    assert "looks like " + looks_like in message and "supported formats:" in message


def test_a_multi_document_file_reports_each_bad_document(tmp_path: Path) -> None:
    good = _pyrra()
    bad_target = {**_pyrra(target="99.5%"), "metadata": {"name": "y"}}
    bad_latency = {
        **_pyrra(
            indicator={
                "latency": {"success": {"metric": "h_bucket"}, "total": {"metric": "h_count"}}
            }
        ),
        "metadata": {"name": "z"},
    }
    message = _message(_write(tmp_path, good, bad_target, bad_latency))
    assert "2 of 3 documents cannot be read" in message
    assert "document 2 (Pyrra, y)" in message and "spec.target:" in message
    assert "document 3 (Pyrra, z)" in message
    assert "spec.indicator.latency.success: needs a numeric le=" in message


def test_a_sloth_crd_error_names_the_camelcase_path(tmp_path: Path) -> None:
    crd = yaml.safe_load(EXAMPLES["Sloth PrometheusServiceLevel"].read_text())
    del crd["spec"]["slos"][0]["sli"]["events"]["totalQuery"]
    message = _message(_write(tmp_path, crd))
    assert "spec.slos[0].sli.events.totalQuery: Field required" in message


@pytest.mark.parametrize(
    ("where", "plugin_id"),
    [
        ("sloPlugins", "sloth.dev/contrib/denominator_corrected_rules/v1"),
        ("plugins", "sloth.dev/contrib/error_budget_exhausted_alert/v1"),
    ],
    ids=["a spec-level SLO plugin", "a per-SLO plugin"],
)
def test_an_unsupported_sloth_plugin_is_refused_by_id(
    tmp_path: Path, where: str, plugin_id: str
) -> None:
    crd = yaml.safe_load(EXAMPLES["Sloth PrometheusServiceLevel"].read_text())
    node = crd["spec"] if where == "sloPlugins" else crd["spec"]["slos"][0]
    node[where] = {"chain": [{"id": plugin_id}]}
    message = _message(_write(tmp_path, crd))
    assert plugin_id in message and "not supported" in message


def test_an_override_chain_without_alert_rules_disables_the_alerts_as_in_sloth(
    tmp_path: Path,
) -> None:
    crd = yaml.safe_load(EXAMPLES["Sloth PrometheusServiceLevel"].read_text())
    crd["spec"]["sloPlugins"] = {
        "overridePrevious": True,
        "chain": [
            {"id": "sloth.dev/core/sli_rules/v1"},
            {"id": "sloth.dev/core/metadata_rules/v1"},
        ],
    }
    (slo,) = load_rule_model(_write(tmp_path, crd)).slos
    assert slo.pairs == ()
    crd["spec"]["sloPlugins"]["overridePrevious"] = False
    (slo,) = load_rule_model(_write(tmp_path, crd)).slos
    assert len(slo.pairs) == 4


def test_an_sli_plugin_is_refused_by_id(tmp_path: Path) -> None:
    crd = yaml.safe_load(EXAMPLES["Sloth PrometheusServiceLevel"].read_text())
    crd["spec"]["slos"][0]["sli"] = {
        "plugin": {"id": "sloth-common/kubernetes/apiserver/availability"}
    }
    assert "sloth-common/kubernetes/apiserver/availability" in _message(_write(tmp_path, crd))


def test_the_slo_jobs_refuse_a_promql_format_saying_where_it_is_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is Pyrra: its SLIs are PromQL.*llmslo rules generate"):
        load_spec(_write(tmp_path, _pyrra()))


def test_the_issue_example_no_longer_says_extra_inputs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = yaml.safe_load(EXAMPLES["Sloth PrometheusServiceLevel"].read_text())
    doc["apiVersion"] = "sloth.slok.dev/v1beta1"
    code, _, err = _generate(capsys, str(_write(tmp_path, doc)), "-o", "-")
    assert code != 0 and "Extra inputs" not in err and "Sloth Kubernetes CRD" in err


@pytest.mark.parametrize(
    ("indicator", "expected"),
    [
        (
            {
                "latencyNative": {
                    "latency": "200ms",
                    "total": {"metric": 'h{job="a"}'},
                    "grouping": ["route"],
                }
            },
            'histogram_fraction(0, 0.2, sum by (route) (rate(h{job="a"}[5m])))',
        ),
        (
            {"bool_gauge": {"metric": 'probe_success{job="p"}', "grouping": ["instance"]}},
            'sum by (instance) (sum_over_time(probe_success{job="p"}[5m]))',
        ),
        (
            {
                "latency": {
                    "success": {"metric": 'h_bucket{le="1"}'},
                    "total": {"metric": "h_count"},
                }
            },
            'h_bucket{le=~"1(\\\\.0)?"}',
        ),
    ],
    ids=["a native histogram latency", "a grouped bool gauge", "an integer le bound"],
)
def test_every_pyrra_indicator_gives_rules_promtool_accepts(
    tmp_path: Path, indicator: dict[str, Any], expected: str
) -> None:
    promtool = require_tool("promtool")
    spec = _write(tmp_path, _pyrra(indicator=indicator))
    rules = tmp_path / "rules.yml"
    assert main(["rules", "generate", str(spec), "--no-signatures", "-o", str(rules)]) == 0
    check = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    text = rules.read_text()
    assert expected in text
    alerts = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]
    assert [a["for"] for a in alerts] == ["2m", "15m", "1h", "3h"]
    assert all(a["labels"]["team"] == "infra" for a in alerts)  # pyrra.dev/team, prefix removed
