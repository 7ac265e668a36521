"""Import OpenSLO v1 documents (``apiVersion: openslo/v1``) into an llmslo spec.

Supported: ``kind: SLO`` with an inline ``indicator`` or an ``indicatorRef`` to a
``kind: SLI`` document of the same file; each of its ``objectives`` becomes one llmslo SLO
(named ``<slo>-<objective displayName or index>`` when there are several, like Sloth).
The indicator's ``ratioMetric`` / ``thresholdMetric`` must use a ``metricSource`` of
``type: llmslo`` whose ``spec`` holds the llmslo SLI (``kind``, ``metric``,
``threshold_s`` …): an OpenSLO query in another vendor's language cannot be evaluated over
our tables, and is rejected with its path rather than guessed. Rolling windows and the
``Occurrences`` budgeting method only (what llmslo computes); anything else is an error.
An objective above five nines needs the SLO's ``metadata.annotations`` to hold
``llmslo.io/allow-objective-beyond-five-nines: "true"`` (see slo/README.md).
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError
from slo.spec.document import SloDocument, parse_spec

__all__ = ["is_openslo", "openslo_to_spec"]

_API = "openslo/v1"
_ALLOW_HIGH_OBJECTIVE = "llmslo.io/allow-objective-beyond-five-nines"


def is_openslo(raw: Any) -> bool:
    """True for one OpenSLO document or a list of them."""
    docs = raw if isinstance(raw, list) else [raw]
    return bool(docs) and all(isinstance(d, dict) and d.get("apiVersion") == _API for d in docs)


def _get(node: Any, path: str, key: str) -> Any:
    if not isinstance(node, dict) or key not in node:
        raise ConfigError(f"{path}.{key}: required")
    return node[key]


def _metric_source(indicator: dict[str, Any], path: str) -> dict[str, Any]:
    spec = _get(indicator, path, "spec")
    for kind in ("ratioMetric", "thresholdMetric"):
        if isinstance(spec, dict) and kind in spec:
            metric = spec[kind]
            if kind == "ratioMetric":
                metric = next(
                    (
                        metric[k]
                        for k in ("good", "total", "bad")
                        if isinstance(metric, dict) and k in metric
                    ),
                    None,
                )
                kind += ".good"
            source = _get(metric, f"{path}.spec.{kind}", "metricSource")
            where = f"{path}.spec.{kind}.metricSource"
            if _get(source, where, "type") != "llmslo":
                raise ConfigError(
                    f"{where}.type: only 'llmslo' sources can be evaluated, got {source['type']!r}"
                )
            sli = _get(source, where, "spec")
            if not isinstance(sli, dict):
                raise ConfigError(f"{where}.spec: must be a mapping")
            return sli
    raise ConfigError(f"{path}.spec: needs ratioMetric or thresholdMetric")


def _window(spec: dict[str, Any], path: str) -> str:
    windows = spec.get("timeWindow") or [{"duration": "30d", "isRolling": True}]
    if not isinstance(windows, list) or len(windows) != 1 or not isinstance(windows[0], dict):
        raise ConfigError(f"{path}.timeWindow: exactly one window is supported")
    if not windows[0].get("isRolling", False):
        raise ConfigError(f"{path}.timeWindow[0].isRolling: only rolling windows are supported")
    return str(_get(windows[0], f"{path}.timeWindow[0]", "duration"))


def _convert(
    doc: dict[str, Any], index: int, slis: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    path = f"[{index}]"
    metadata = _get(doc, path, "metadata")
    name = _get(metadata, f"{path}.metadata", "name")
    annotations = metadata.get("annotations") or {}
    allow_high = isinstance(annotations, dict) and (
        str(annotations.get(_ALLOW_HIGH_OBJECTIVE, "")).lower() == "true"
    )
    spec = _get(doc, path, "spec")
    method = spec.get("budgetingMethod", "Occurrences")
    if method != "Occurrences":
        raise ConfigError(
            f"{path}.spec.budgetingMethod: only Occurrences is supported, got {method!r}"
        )
    if "indicator" in spec:
        sli = _metric_source(spec["indicator"], f"{path}.spec.indicator")
    else:
        ref = _get(spec, f"{path}.spec", "indicatorRef")
        if ref not in slis:
            raise ConfigError(f"{path}.spec.indicatorRef: no kind SLI named {ref!r} in this file")
        sli = slis[ref]
    period = _window(spec, f"{path}.spec")
    objectives = _get(spec, f"{path}.spec", "objectives")
    if not isinstance(objectives, list) or not objectives:
        raise ConfigError(f"{path}.spec.objectives: needs at least one objective")
    out = []
    for i, objective in enumerate(objectives):
        where = f"{path}.spec.objectives[{i}]"
        target = _get(objective, where, "target")
        suffix = "" if len(objectives) == 1 else f"-{objective.get('displayName') or i}"
        out.append(
            {
                "name": f"{name}{suffix}",
                "description": spec.get("description", ""),
                "objective": target,
                "allow_objective_beyond_five_nines": allow_high,
                "period": period,
                "sli": sli,
            }
        )
    return out


def openslo_to_spec(raw: Any, source: str = "<openslo>") -> SloDocument:
    """Convert OpenSLO v1 documents to a validated llmslo spec; ConfigError names the path."""
    docs = raw if isinstance(raw, list) else [raw]
    if not is_openslo(docs):
        raise ConfigError(f"{source}: every document needs apiVersion: {_API}")
    slis = {}
    for index, doc in enumerate(docs):
        if doc.get("kind") == "SLI":
            try:
                name = _get(doc.get("metadata"), f"[{index}].metadata", "name")
                slis[str(name)] = _metric_source(doc, f"[{index}]")
            except ConfigError as exc:
                raise ConfigError(f"{source}: invalid OpenSLO document\n{exc}") from exc
    slos: list[dict[str, Any]] = []
    service = "llm-inference"
    for index, doc in enumerate(docs):
        if doc.get("kind") == "SLO":
            try:
                slos += _convert(doc, index, slis)
            except ConfigError as exc:
                raise ConfigError(f"{source}: invalid OpenSLO document\n{exc}") from exc
            service = str(doc.get("spec", {}).get("service") or service)
    if not slos:
        raise ConfigError(f"{source}: no OpenSLO 'kind: SLO' document")
    return parse_spec({"version": "llmslo/v1", "service": service, "slos": slos}, source)
