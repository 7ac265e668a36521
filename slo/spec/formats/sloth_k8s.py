"""Sloth's Kubernetes CRD (``sloth.slok.dev/v1`` ``PrometheusServiceLevel``) as its
``prometheus/v1`` body.

The CRD's ``spec`` holds the same fields as a ``prometheus/v1`` file, in camelCase
(``errorQuery``, ``pageAlert``, ``sloPlugins`` …) and without ``version``; Sloth gives both
the same semantics, and so do we: :func:`sloth_crd_body` renames the keys and the body is
validated by :func:`alerts.sloth.parse_sloth`, which reports a failing field under its CRD
name (:data:`CRD_NAMES`) and path (``spec.slos[0].sli.events.errorQuery``). The period is
Sloth's default, 30 days (the CRD has no period field).
"""

from __future__ import annotations

from typing import Any

from slo.spec.formats import ObjectMeta, object_meta

__all__ = ["CRD_NAMES", "sloth_crd_body"]

#: ``prometheus/v1`` field name → the CRD's name for it (Sloth's ``types.go``).
CRD_NAMES = {
    "error_query": "errorQuery",
    "total_query": "totalQuery",
    "error_ratio_query": "errorRatioQuery",
    "page_alert": "pageAlert",
    "ticket_alert": "ticketAlert",
    "slo_plugins": "sloPlugins",
    "override_previous": "overridePrevious",
}
_SNAKE = {camel: snake for snake, camel in CRD_NAMES.items()}
#: Mappings whose keys are user data (label and annotation names, plugin config), not fields.
_DATA_KEYS = {"labels", "annotations", "config", "options"}


def _rename(node: Any) -> Any:
    if isinstance(node, dict):
        return {_SNAKE.get(k, k): (v if k in _DATA_KEYS else _rename(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rename(item) for item in node]
    return node


def sloth_crd_body(raw: dict[str, Any], path: str = "") -> tuple[dict[str, Any], ObjectMeta]:
    """The ``prometheus/v1`` document of a ``PrometheusServiceLevel`` and its object identity.

    ValueError names the field (``metadata.name``, ``spec``) when the object is malformed.
    """
    meta = object_meta(raw, path)
    spec = raw.get("spec")
    if not isinstance(spec, dict):
        raise ValueError(f"{path}spec: required, a mapping")
    if "version" in spec:
        raise ValueError(f"{path}spec.version: not a field of PrometheusServiceLevel")
    return {"version": "prometheus/v1", **_rename(spec)}, meta
