"""Every overlay renders, and every rendered object is one an API server would accept.

CRD kinds validate against the ``openAPIV3Schema`` of ``../shared/reference/crds/``, built-in
kinds with ``kubernetes-validate``; then what no schema expresses: DNS-1123 names, label
values, references to Secrets, ConfigMaps and claims that resolve inside the rendered set,
Service target ports that the selected pods expose, and the downward-API annotation naming
the engine's port. The checked-in PrometheusRule and AlertmanagerConfig are what ``llmslo
rules`` generates today (one name per alert: the signal catalog's).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from llmslo.cli import main
from slo.signals.catalog import SIGNALS
from tests.conftest import require_tool
from tests.deploy.conftest import CRDS, DEPLOY, RENDERABLE, ROOT, render

K8S_VERSION = "1.32.0"
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
OPERATOR_KINDS = {"AlertmanagerConfig"}  # its CRD is not among the reference schemas


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) → openAPIV3Schema`` of every CRD in the reference files."""
    schemas = {}
    for path in CRDS.glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def _validate(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    """``obj`` against an openAPIV3Schema. The schema itself is not checked: its Go regexes
    (``^(?i)(abort|warn)?$``) are not Python's, and apply only to fields we do not set."""
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=str)
    assert not errors, (
        f"{obj['kind']}/{obj['metadata']['name']}: {errors[0].message} at {list(errors[0].absolute_path)}"
    )


def test_the_reference_crds_are_there() -> None:
    assert CRDS.is_dir(), f"{CRDS}: the CRD schemas belong beside the repository (shared/)"
    kinds = {kind for _, kind in crd_schemas()}
    assert kinds >= {
        "PrometheusRule",
        "PodMonitor",
        "ServiceMonitor",
        "AnalysisTemplate",
        "ClusterAnalysisTemplate",
        "Canary",
        "MetricTemplate",
    }


@pytest.fixture(scope="module", params=RENDERABLE)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_every_overlay_is_rendered() -> None:
    assert set(RENDERABLE) >= {
        "base",
        "overlays/vllm",
        "overlays/sglang",
        "overlays/fleet",
        "canary/argo",
        "canary/flagger",
    }


def test_every_object_validates_against_its_schema(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in crd_schemas():
            _validate(obj, crd_schemas()[key])
        elif "/" in obj["apiVersion"] and obj["apiVersion"].split("/")[0].endswith(".coreos.com"):
            assert obj["kind"] in OPERATOR_KINDS, f"{where}: no schema for {key}"
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where}: {exc.message}")


def _pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj in objects:
        template = obj.get("spec", {}).get("template")
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet") and template:
            yield obj, template


def test_names_and_labels_are_what_the_api_server_accepts(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        meta = obj["metadata"]
        assert DNS_1123.match(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
        labels = dict(meta.get("labels", {}))
        for _, template in _pod_specs([obj]):
            labels |= template["metadata"].get("labels", {})
        for name, value in labels.items():
            assert len(str(value)) <= 63 and LABEL_VALUE.match(str(value)), (name, value)


def test_every_reference_resolves_inside_the_rendered_set(
    rendered: list[dict[str, Any]],
) -> None:
    present = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in rendered}
    for obj, template in _pod_specs(rendered):
        ns = obj["metadata"].get("namespace")
        spec = template["spec"]
        claims = {c["metadata"]["name"] for c in obj["spec"].get("volumeClaimTemplates", [])}
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", ns, volume["configMap"]["name"]) in present, volume
            if "secret" in volume:
                assert ("Secret", ns, volume["secret"]["secretName"]) in present, volume
            if "persistentVolumeClaim" in volume:
                name = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", ns, name) in present, volume
        for container in spec["containers"]:
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in spec.get("volumes", [])} | claims, container
            for env in container.get("env", []):
                source = env.get("valueFrom", {})
                if "configMapKeyRef" in source:
                    assert ("ConfigMap", ns, source["configMapKeyRef"]["name"]) in present, env
                if "secretKeyRef" in source:
                    assert ("Secret", ns, source["secretKeyRef"]["name"]) in present, env
                assert "value" not in env or "TOKEN" not in env["name"], "a literal token"
    for obj in rendered:  # Argo args read Secrets of the template's namespace
        if obj["kind"] == "AnalysisTemplate":
            for arg in obj["spec"].get("args", []):
                ref = arg.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    key = ("Secret", obj["metadata"]["namespace"], ref["name"])
                    assert key in present, arg


def _ports(container: dict[str, Any]) -> dict[Any, int]:
    ports: dict[Any, int] = {}
    for port in container.get("ports", []):
        ports[port["containerPort"]] = port["containerPort"]
        if "name" in port:
            ports[port["name"]] = port["containerPort"]
    return ports


def test_every_service_targets_a_port_its_pods_expose(rendered: list[dict[str, Any]]) -> None:
    workloads = list(_pod_specs(rendered))
    for service in (o for o in rendered if o["kind"] == "Service"):
        selector = service["spec"].get("selector", {})
        pods = [
            t
            for w, t in workloads
            if w["metadata"].get("namespace") == service["metadata"].get("namespace")
            and selector.items() <= t["metadata"]["labels"].items()
        ]
        assert pods, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"].get("ports", []):
            for pod in pods:
                exposed: dict[Any, int] = {}
                for container in pod["spec"]["containers"]:
                    exposed |= _ports(container)
                assert port["targetPort"] in exposed, (service["metadata"]["name"], port)


def test_engine_services_reach_the_tap_and_the_tap_reaches_the_engine(
    rendered: list[dict[str, Any]],
) -> None:
    for _, template in _pod_specs(rendered):
        if "llmslo.io/engine" not in template["metadata"]["labels"]:
            continue
        containers = {c["name"]: c for c in template["spec"]["containers"]}
        assert {"llmslo-tap", "llmslo-collector"} <= containers.keys()
        engine_port = int(template["metadata"]["annotations"]["llmslo.io/engine-port"])
        engines = [c for n, c in containers.items() if not n.startswith("llmslo-")]
        assert engine_port in _ports(engines[0]), "llmslo.io/engine-port is no engine port"
        for name in ("llmslo-tap", "llmslo-collector"):
            context = containers[name]["securityContext"]
            assert context["readOnlyRootFilesystem"] and context["runAsNonRoot"], name


def test_the_checked_in_operator_objects_are_what_llmslo_rules_generates(
    tmp_path: Path,
) -> None:
    rules, routes = tmp_path / "rules.yaml", tmp_path / "am.yaml"
    spec = str(ROOT / "config/slo.example.yaml")
    label = ["--label", "release=kube-prometheus-stack"]
    args = ["rules", "generate", spec, "--format", "prometheusrule", *label, "-o", str(rules)]
    assert main(args) == 0
    assert main(["rules", "alertmanager", "--format", "alertmanagerconfig", "-o", str(routes)]) == 0
    # Regenerate with the two commands above, written to deploy/base/.
    assert rules.read_text() == (DEPLOY / "base/prometheusrule.yaml").read_text()
    assert routes.read_text() == (DEPLOY / "base/alertmanagerconfig.yaml").read_text()
    names = {
        r["alert"]
        for g in yaml.safe_load(rules.read_text())["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert SIGNALS["stall"].alert in names


def test_the_prometheusrule_passes_promtool_unwrapped(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    wrapped = yaml.safe_load((DEPLOY / "base/prometheusrule.yaml").read_text())
    _validate(wrapped, crd_schemas()[("monitoring.coreos.com/v1", "PrometheusRule")])
    unwrapped = tmp_path / "rules.yml"
    unwrapped.write_text(yaml.safe_dump(wrapped["spec"]))
    done = subprocess.run(
        [promtool, "check", "rules", str(unwrapped)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
