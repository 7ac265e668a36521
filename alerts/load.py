"""The input end: read any supported spec file into a :class:`~alerts.model.RuleModel`.

``version: prometheus/v1`` → :mod:`alerts.sloth`; anything else goes through
:func:`slo.spec.load_spec` (llmslo/v1 or OpenSLO v1) and :func:`alerts.sources.rule_model_from_slo`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from alerts.model import RuleModel
from alerts.sloth import is_sloth, parse_sloth
from alerts.sources import rule_model_from_slo
from slo.spec.loader import load_spec
from slo.spec.model import build_model

__all__ = ["load_rule_model"]


def load_rule_model(path: str | Path, strict: bool = False) -> RuleModel:
    """Read ``path`` (llmslo/v1, OpenSLO v1 or Sloth prometheus/v1); ConfigError names the field."""
    try:
        first = next(iter(yaml.safe_load_all(Path(path).read_text(encoding="utf-8"))), None)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        first = None  # load_spec reports the same problem with its context
    if is_sloth(first):
        return parse_sloth(first, str(path))
    document = load_spec(path)
    return rule_model_from_slo(build_model(document), str(path), strict=strict)
