"""OpenSLO ``openslo/v1alpha`` ``kind: SLO``, read the way Sloth reads it, as a Sloth body.

Sloth's mapping (``internal/storage/io/openslo.go``): each of the SLO's ``objectives``
becomes one SLO named ``<metadata.name>-<index>`` of service ``spec.service``, objective
``target × 100``; its ``ratioMetrics`` ``good`` and ``total`` queries (PromQL with
``{{.window}}``, ``source: prometheus`` or ``sloth``) become the raw error ratio
``1 - (good / total)``; ``timeWindows`` is one window of ``count`` days (default 30) and
``budgetingMethod`` must be ``Occurrences``. As in Sloth, no alerts are generated for
OpenSLO input: only the SLI and metadata recordings. The result is a ``prometheus/v1``
document for :func:`alerts.sloth.parse_sloth`; ValueError names the failing field.
"""

from __future__ import annotations

from typing import Any

__all__ = ["openslo_v1alpha_body"]

_SOURCES = ("prometheus", "sloth")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _field(node: Any, path: str, key: str) -> Any:
    if not isinstance(node, dict) or key not in node:
        raise ValueError(f"{_join(path, key)}: required")
    return node[key]


def _query(metrics: dict[str, Any], path: str, key: str) -> str:
    metric = _field(metrics, path, key)
    where = f"{path}.{key}"
    source = metric.get("source", "prometheus") if isinstance(metric, dict) else None
    if source not in _SOURCES:
        raise ValueError(f"{where}.source: only {' or '.join(_SOURCES)} queries, got {source!r}")
    query = _field(metric, where, "query")
    if not isinstance(query, str) or "{{.window}}" not in query:
        raise ValueError(f"{where}.query: PromQL with {{{{.window}}}} for the range is required")
    return query.strip()


def _period(spec: dict[str, Any], path: str) -> str:
    windows = spec.get("timeWindows") or [{"count": 30, "unit": "Day"}]
    if not isinstance(windows, list) or len(windows) != 1 or not isinstance(windows[0], dict):
        raise ValueError(f"{path}.timeWindows: exactly one window is supported")
    window = windows[0]
    if window.get("unit", "Day") != "Day":
        raise ValueError(f"{path}.timeWindows[0].unit: only Day is supported (as in Sloth)")
    if window.get("isRolling") is False or "calendar" in window:
        raise ValueError(f"{path}.timeWindows[0]: only rolling windows are supported")
    count = window.get("count", 30)
    if not isinstance(count, int) or count <= 0:
        raise ValueError(f"{path}.timeWindows[0].count: a positive number of days")
    return f"{count}d"


def openslo_v1alpha_body(raw: dict[str, Any], path: str = "") -> dict[str, Any]:
    """The ``prometheus/v1`` document Sloth builds from one OpenSLO v1alpha SLO."""
    base = path.rstrip(".")
    metadata = _field(raw, base, "metadata")
    name = _field(metadata, _join(base, "metadata"), "name")
    spec = _field(raw, base, "spec")
    where = _join(base, "spec")
    method = spec.get("budgetingMethod", "Occurrences")
    if method != "Occurrences":
        raise ValueError(f"{where}.budgetingMethod: only Occurrences is supported, got {method!r}")
    service = _field(spec, where, "service")
    objectives = _field(spec, where, "objectives")
    if not isinstance(objectives, list) or not objectives:
        raise ValueError(f"{where}.objectives: needs at least one objective")
    slos = []
    for index, objective in enumerate(objectives):
        at = f"{where}.objectives[{index}]"
        metrics = _field(objective, at, "ratioMetrics")
        good = _query(metrics, f"{at}.ratioMetrics", "good")
        total = _query(metrics, f"{at}.ratioMetrics", "total")
        target = _field(objective, at, "target")
        if not isinstance(target, (int, float)) or not 0 < target < 1:
            raise ValueError(f"{at}.target: a fraction in (0, 1), got {target!r}")
        slos.append(
            {
                "name": f"{name}-{index}",
                "objective": target * 100,
                "description": str(spec.get("description", "")),
                "sli": {"raw": {"error_ratio_query": f"1 - (({good}) / ({total}))"}},
                "alerting": {"page_alert": {"disable": True}, "ticket_alert": {"disable": True}},
            }
        )
    return {
        "version": "prometheus/v1",
        "service": str(service),
        "slo_period": _period(spec, where),
        "slos": slos,
    }
