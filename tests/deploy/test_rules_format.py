"""``llmslo rules generate --format prometheusrule`` and ``rules alertmanager --format
alertmanagerconfig``: the Operator's objects, with the plain file's groups unchanged."""

from __future__ import annotations

import pytest
import yaml

from llmslo.cli import main
from tests.deploy.conftest import ROOT

SPEC = str(ROOT / "config/slo.example.yaml")


def test_the_prometheusrule_holds_the_plain_files_groups_with_name_namespace_and_labels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["rules", "generate", SPEC, "-o", "-"]) == 0
    plain = yaml.safe_load(capsys.readouterr().out)
    args = ["--namespace", "monitoring", "--name", "slo-rules", "--label", "release=prom"]
    assert main(["rules", "generate", SPEC, "--format", "prometheusrule", *args, "-o", "-"]) == 0
    wrapped = yaml.safe_load(capsys.readouterr().out)
    assert wrapped["kind"] == "PrometheusRule"
    assert wrapped["metadata"] == {
        "name": "slo-rules",
        "namespace": "monitoring",
        "labels": {"app.kubernetes.io/part-of": "llmslo", "release": "prom"},
    }
    assert wrapped["spec"] == plain


@pytest.mark.parametrize(
    "option",
    [["--label", "release"], ["--label", "release=a b"], ["--namespace", "Monitoring"]],
    ids=["a label without a value", "a label value with a space", "an upper-case namespace"],
)
def test_bad_object_metadata_is_refused_naming_the_option(
    option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["rules", "generate", SPEC, "--format", "prometheusrule", *option, "-o", "-"])
    assert code == 2
    assert option[0] in capsys.readouterr().err


def test_promtool_tests_need_the_plain_format(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["rules", "generate", SPEC, "--format", "prometheusrule", "-o", "-", "--tests", "t"]
    assert main(argv) == 2
    assert "--format plain" in capsys.readouterr().err


def test_the_alertmanagerconfig_spells_the_snippet_in_the_crds_camel_case(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["rules", "alertmanager", "-o", "-"]) == 0
    plain = yaml.safe_load(capsys.readouterr().out)
    assert main(["rules", "alertmanager", "--format", "alertmanagerconfig", "-o", "-"]) == 0
    crd = yaml.safe_load(capsys.readouterr().out)
    assert crd["spec"]["route"]["groupBy"] == plain["route"]["group_by"]
    sources = [r["sourceMatch"] for r in crd["spec"]["inhibitRules"]]
    texts = [[f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in s] for s in sources]
    assert texts == [r["source_matchers"] for r in plain["inhibit_rules"]]
