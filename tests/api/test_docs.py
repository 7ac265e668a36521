"""docs/canary.md's manifests call endpoints that exist, with conditions the contract tests prove."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import yaml

from api.params import VerdictParams
from tests.api.conftest import argo_params, auth
from tests.api.test_argo_contract import FAILURE, SUCCESS

DOC = Path(__file__).resolve().parents[2] / "docs" / "canary.md"


def _manifests() -> dict[str, dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    return {doc["kind"]: doc for doc in map(yaml.safe_load, blocks)}


def test_the_analysis_template_uses_both_conditions_and_the_summary(client) -> None:
    metric = _manifests()["AnalysisTemplate"]["spec"]["metrics"][0]
    assert metric["successCondition"] == SUCCESS
    assert metric["failureCondition"] == FAILURE
    web = metric["provider"]["web"]
    assert web["jsonPath"] == "{$.summary}"
    path = urlparse(web["url"]).path
    assert path in client.get("/openapi.json").json()["paths"]
    assert web["method"].lower() in client.get("/openapi.json").json()["paths"][path]
    # Argo fills {{args.X}} before it sends: with the template's default, else a sample value.
    args = {
        a["name"]: a.get("value", "x") for a in _manifests()["AnalysisTemplate"]["spec"]["args"]
    }
    body = {
        k: re.sub(r"\{\{args\.([\w-]+)\}\}", lambda m: str(args[m.group(1)]), v)
        for k, v in web["jsonBody"].items()
    }
    VerdictParams.model_validate(body)  # every parameter name is one we accept


def test_the_flagger_canary_calls_existing_gates_with_string_metadata(client) -> None:
    hooks = _manifests()["Canary"]["spec"]["analysis"]["webhooks"]
    assert {hook["type"] for hook in hooks} == {"pre-rollout", "rollout", "confirm-promotion"}
    for hook in hooks:
        assert urlparse(hook["url"]).path == f"/api/v1/flagger/{hook['type']}"
        assert all(isinstance(value, str) for value in hook["metadata"].values())
        params = {k: v for k, v in hook["metadata"].items() if k != "token"}
        VerdictParams.model_validate(params)


def _doc_row(name: str) -> str:
    return next(line for line in DOC.read_text().splitlines() if line.startswith(f"| `{name}`"))


def test_an_unknown_revision_gets_the_status_the_doc_gives_it(client) -> None:
    """Reference §2.1: 404 for an unknown subject (a cohort no record matches)."""
    params = {k: v for k, v in argo_params().items() if k != "canary_instances"}
    params["canary_selector"] = "revision=0000000000"
    response = client.get("/api/v1/verdict", params=params, headers=auth())
    assert response.status_code == 404
    assert "revision" in response.json()["error"]
    row = _doc_row("canary_selector")
    assert "unknown revision" in row and "404" in row
    assert "400 saying so" not in row
