"""Pyrra ``ServiceLevelObjective`` documents into the rule model, with Pyrra's alerting.

The spec is read by :mod:`slo.spec.formats.pyrra`; here its four windows become the
SLO's window pairs (Pyrra's factors, ``for:`` durations and ``severity`` values, and its
``short`` / ``long`` / ``exhaustion`` labels), so pages fire at the moments they fired under
Pyrra. The differences from Pyrra's output (record names, no ``SLOMetricAbsent``) are listed
in alerts/README.md.
"""

from __future__ import annotations

from typing import Any

from alerts.model import LLMSLO_LABELS, RuleSlo
from slo.spec.formats.pyrra import PyrraSlo, parse_pyrra, prometheus_duration
from slo.windows import AlertPair, WindowCatalog, format_duration

__all__ = ["pyrra_rule_slo", "read_pyrra"]


def _pairs(slo: PyrraSlo) -> tuple[AlertPair, ...]:
    return tuple(
        AlertPair(
            severity=w.severity,
            name=w.tier,
            budget_percent=round(w.factor * w.long_ms / slo.window_ms * 100, 4),
            short_ms=w.short_ms,
            long_ms=w.long_ms,
            factor=w.factor,
        )
        for w in slo.windows
    )


def pyrra_rule_slo(slo: PyrraSlo) -> RuleSlo:
    """The rule-model SLO of a validated Pyrra objective."""
    # The SLI is recorded over Pyrra's windows even when its burn-rate alerts are off.
    windows = _pairs(slo)
    catalog = WindowCatalog(f"pyrra-{format_duration(slo.window_ms)}", slo.window_ms, windows)
    pairs = windows if slo.burnrates else ()
    pair_labels: dict[str, dict[str, str]] = {}
    pair_for: dict[str, int] = {}
    for pair, window in zip(windows, slo.windows, strict=True):
        pair_labels[pair.id] = {
            "short": prometheus_duration(window.short_ms),
            "long": prometheus_duration(window.long_ms),
            "exhaustion": slo.exhaustion(window.factor),
        }
        pair_for[pair.id] = window.for_ms
    return RuleSlo(
        id=slo.meta.name,
        name=slo.meta.name,
        service=slo.meta.namespace or "default",
        description=slo.description,
        objective=slo.objective,
        catalog=catalog,
        pairs=pairs,
        error_query=slo.error_query,
        total_query=slo.total_query,
        sli_kind=slo.indicator,
        alert_name=slo.alert_name,
        scheme=LLMSLO_LABELS,
        group_labels=slo.grouping,
        labels=slo.labels,
        # Pyrra writes them on the alert rules too, not only on the recorded series.
        alert_labels=slo.labels,
        annotations=slo.annotations,
        pair_for_ms=pair_for,
        pair_labels=pair_labels,
    )


def read_pyrra(raw: dict[str, Any], path: str = "") -> RuleSlo:
    """Validate one Pyrra document and build its rule-model SLO; ValueError names the field."""
    return pyrra_rule_slo(parse_pyrra(raw, path))
