"""Everything ``llmslo rules generate`` writes, rendered in memory before any file is touched."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alerts.generate import generate_rules
from alerts.model import RuleModel
from alerts.operator import prometheus_rule
from alerts.testgen import signature_test, slo_test
from alerts.writer import HEADER, render_yaml

__all__ = ["prometheus_rule_text", "render_bundle", "rules_text"]


def rules_text(model: RuleModel, signatures: bool = True) -> str:
    """The rule file of ``model`` as YAML, with what was skipped listed in the header."""
    return _with_header(model, generate_rules(model, signatures))


def prometheus_rule_text(
    model: RuleModel,
    name: str,
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
    signatures: bool = True,
) -> str:
    """The rule file of ``model`` wrapped in a ``PrometheusRule`` (same groups), as YAML."""
    wrapped = prometheus_rule(generate_rules(model, signatures), name, namespace, labels)
    return _with_header(model, wrapped)


def _with_header(model: RuleModel, rules: dict[str, Any]) -> str:
    header = HEADER + "".join(f"# skipped: {reason}\n" for reason in model.skipped)
    return render_yaml(rules, header)


def render_bundle(
    model: RuleModel, rules_path: Path, tests_dir: Path | None = None, signatures: bool = True
) -> dict[Path, str]:
    """``path → text`` for the rule file and, with ``tests_dir``, one promtool test per SLO
    (``<slo id>.test.yml``) and ``signatures.test.yml``."""
    rules = generate_rules(model, signatures)
    files = {rules_path: _with_header(model, rules)}
    if tests_dir is None:
        return files
    order = [group["name"] for group in rules["groups"]]
    relative = os.path.relpath(rules_path.resolve(), tests_dir.resolve())
    for slo in model.slos:
        document = slo_test(slo, relative, order)
        if document is not None:
            files[tests_dir / f"{slo.id}.test.yml"] = render_yaml(document)
    if signatures:
        files[tests_dir / "signatures.test.yml"] = render_yaml(signature_test(relative, order))
    return files
