"""Rendered deploy/ manifests: ``kubectl kustomize`` of every kustomization under deploy/."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: The CRD schemas, beside the repository (never copied into it).
CRDS = ROOT.parent / "shared" / "reference" / "crds"
#: Every directory ``kubectl kustomize`` renders on its own (components are rendered inside).
RENDERABLE = sorted(
    path.parent.relative_to(DEPLOY).as_posix()
    for path in DEPLOY.rglob("kustomization.yaml")
    if yaml.safe_load(path.read_text())["kind"] == "Kustomization"
)


class _Loader(yaml.SafeLoader):
    """PyYAML reads a bare ``=`` (kubectl prints ``matchType: =``) as YAML 1.1's value tag;
    YAML 1.2 parsers, Kubernetes' among them, read the string ``=``."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: node.value)


def render(directory: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize deploy/<directory>`` prints."""
    kubectl = require_tool("kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.load_all(done.stdout, Loader=_Loader) if doc]
