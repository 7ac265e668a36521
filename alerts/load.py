"""The input end: read any supported spec file into a :class:`~alerts.model.RuleModel`.

Each YAML document of the file is recognised by its header (:mod:`slo.spec.formats`):
llmslo/v1 and OpenSLO v1 go through :func:`slo.spec.load_spec` and
:func:`alerts.sources.rule_model_from_slo`; the PromQL formats are converted document by
document: Sloth ``prometheus/v1`` and its Kubernetes CRD (:mod:`alerts.sloth`), OpenSLO
``v1alpha`` as Sloth reads it, and Pyrra (:mod:`alerts.pyrra`). A file may hold several
documents of these formats; every invalid document is reported, each with its number,
format and failing field paths, and nothing is generated unless all are valid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from alerts.model import RuleModel, RuleSlo
from alerts.pyrra import read_pyrra
from alerts.sloth import parse_sloth, parse_sloth_crd
from alerts.sources import rule_model_from_slo
from pipeline.config import load_yaml_documents
from pipeline.errors import ConfigError
from slo.spec.formats import SpecFormat, describe_unknown, identify
from slo.spec.formats.openslo_v1alpha import openslo_v1alpha_body
from slo.spec.loader import load_spec
from slo.spec.model import build_model

__all__ = ["load_rule_model"]


def _documents(path: Path) -> list[Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
        return [d for d in load_yaml_documents(text, str(path)) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # load_spec reports the same problem with its context


def _convert(fmt: SpecFormat, raw: dict[str, Any], source: str) -> RuleModel:
    """One PromQL-format document as a rule model; ConfigError or ValueError name the field."""
    if fmt.version == "prometheus/v1":
        return parse_sloth(raw, source)
    if fmt.api_version == "sloth.slok.dev/v1":
        return parse_sloth_crd(raw, source)
    if fmt.api_version == "openslo/v1alpha":
        return parse_sloth(openslo_v1alpha_body(raw), source)
    return RuleModel(source, (read_pyrra(raw),))


def _label(index: int, raw: Any, fmt: SpecFormat | None) -> str:
    name = raw.get("metadata", {}).get("name") if isinstance(raw, dict) else None
    name = name if isinstance(name, str) else raw.get("service") if isinstance(raw, dict) else None
    what = fmt.name if fmt is not None else "unrecognised"
    return f"document {index + 1} ({what}{f', {name}' if name else ''})"


def _strip_source(message: str, source: str) -> str:
    return message.replace(f"{source}: ", "", 1)


def _foreign_model(docs: list[Any], source: str) -> RuleModel:
    slos: list[RuleSlo] = []
    problems: list[str] = []
    kubernetes = None
    for index, raw in enumerate(docs):
        fmt = identify(raw)
        label = _label(index, raw, fmt)
        if fmt is None or not fmt.promql:
            why = describe_unknown(raw) if fmt is None else f"{fmt.name} cannot be mixed with "
            if fmt is not None:
                why += "PromQL formats (Sloth, OpenSLO v1alpha, Pyrra) in one file"
            problems.append(f"{label}: {why}")
            continue
        try:
            model = _convert(fmt, raw, source)
        except (ConfigError, ValueError) as exc:
            body = _strip_source(str(exc), source)
            problems.append(f"{label}:\n  " + body.replace("\n", "\n  "))
            continue
        slos += model.slos
        kubernetes = kubernetes or model.kubernetes
    ids = [slo.id for slo in slos]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        problems.append(f"SLO ids used twice across documents: {', '.join(twice)}")
    if problems:
        count = f"{len(problems)} of {len(docs)} documents" if len(docs) > 1 else "the document"
        raise ConfigError(f"{source}: {count} cannot be read\n" + "\n".join(problems))
    return RuleModel(source, tuple(slos), kubernetes=kubernetes if len(docs) == 1 else None)


def load_rule_model(path: str | Path, strict: bool = False) -> RuleModel:
    """Read ``path`` in any supported format (:data:`slo.spec.formats.FORMATS`);
    ConfigError names the document, its format and the failing field paths."""
    docs = _documents(Path(path))
    if docs and any((fmt := identify(d)) is None or fmt.promql for d in docs):
        headed = [
            d
            for d in docs
            if isinstance(d, dict) and ({"apiVersion", "kind", "version"} & d.keys())
        ]
        if len(headed) == len(docs):
            return _foreign_model(docs, str(path))
    document = load_spec(path)
    return rule_model_from_slo(build_model(document), str(path), strict=strict)
