"""Render a :class:`~alerts.model.RuleModel` as a Prometheus rule-file document (a dict).

Per SLO, three groups (Sloth's layout and record names, so Sloth dashboards keep working):

* ``<prefix>-sli-recordings-<id>``: ``slo:sli_error:ratio_rate<w>`` for every window of the
  catalog, bad / total events (count-based, also for the period: never an average of ratios);
* ``<prefix>-meta-recordings-<id>``: objective, error budget, period in days, current and
  period burn rate, budget remaining, and an info series;
* ``<prefix>-alerts-<id>``: one alert per window pair, labels ``severity`` (page|ticket)
  and ``window`` (``1h-5m``), firing when both windows burn faster than the pair's factor
  (and, with ``min_events``, the long window holds that many events).

Output is deterministic: groups in spec order, windows ascending, keys sorted by the writer.
"""

from __future__ import annotations

from typing import Any

from alerts.model import WINDOW_PLACEHOLDER, RuleModel, RuleSlo
from alerts.promql import matcher
from alerts.signatures import signature_groups
from pipeline.units import DAY_MS
from slo.signals.catalog import NOTICES, RUNBOOK_BASE_URL, runbook_url
from slo.windows import AlertPair, format_duration

__all__ = ["error_ratio_record", "generate_rules", "pair_alert", "slo_groups"]

_NUMBER = "{:.10g}"


def _num(value: float) -> str:
    return _NUMBER.format(value)


def error_ratio_record(window: str) -> str:
    """Name of the recorded error ratio over ``window`` (``slo:sli_error:ratio_rate5m``)."""
    return f"slo:sli_error:ratio_rate{window}"


def _windows(slo: RuleSlo) -> list[str]:
    return [format_duration(ms) for ms in slo.catalog.windows_ms]


def _id_matcher(slo: RuleSlo) -> str:
    return "{" + ", ".join(matcher(k, v) for k, v in slo.id_labels.items()) + "}"


def _sli_recordings(slo: RuleSlo) -> list[dict[str, Any]]:
    rules = []
    for window in _windows(slo):
        error = slo.error_query.replace(WINDOW_PLACEHOLDER, window)
        total = slo.total_query.replace(WINDOW_PLACEHOLDER, window)
        rules.append(
            {
                "record": error_ratio_record(window),
                "expr": f"({error})\n/\n({total})\n",
                "labels": {**slo.labels, **slo.id_labels, slo.scheme.window: window},
            }
        )
    return rules


def _meta_recordings(slo: RuleSlo) -> list[dict[str, Any]]:
    labels = {**slo.labels, **slo.id_labels}
    ids = _id_matcher(slo)
    on = ", ".join(slo.id_labels)
    period_days = slo.catalog.period_ms / DAY_MS
    info_labels = {
        **labels,
        "objective": _num(slo.objective * 100),
        "sli_kind": slo.sli_kind,
        "period": slo.period,
    }
    records = [
        ("slo:objective:ratio", f"vector({_num(slo.objective)})"),
        ("slo:error_budget:ratio", f"vector({_num(slo.budget)})"),
        ("slo:time_period:days", f"vector({_num(period_days)})"),
        (
            "slo:current_burn_rate:ratio",
            f"{error_ratio_record('5m')}{ids}\n/ on({on}) group_left\nslo:error_budget:ratio{ids}\n",
        ),
        (
            "slo:period_burn_rate:ratio",
            f"{error_ratio_record(slo.period)}{ids}\n/ on({on}) group_left\n"
            f"slo:error_budget:ratio{ids}\n",
        ),
        ("slo:period_error_budget_remaining:ratio", f"1 - slo:period_burn_rate:ratio{ids}"),
    ]
    rules: list[dict[str, Any]] = [
        {"record": name, "expr": expr, "labels": labels} for name, expr in records
    ]
    rules.append({"record": slo.scheme.info_metric, "expr": "vector(1)", "labels": info_labels})
    return rules


def _burning(slo: RuleSlo, window_ms: int, factor: float) -> str:
    record = error_ratio_record(format_duration(window_ms))
    return (
        f"max without ({slo.scheme.window}) "
        f"({record}{_id_matcher(slo)} > ({_num(factor)} * {_num(slo.budget)}))"
    )


def _guard(slo: RuleSlo, pair: AlertPair) -> str:
    total = slo.total_query.replace(WINDOW_PLACEHOLDER, format_duration(pair.long_ms))
    seconds = pair.long_ms // 1000
    return f"and on ({', '.join(slo.group_labels)})\n({total} * {seconds} >= {slo.min_events})\n"


def pair_alert(
    slo: RuleSlo, pair: AlertPair, runbook_base_url: str = RUNBOOK_BASE_URL
) -> dict[str, Any]:
    """The alerting rule of one window pair of ``slo``; ``runbook_url`` is
    ``{runbook_base_url}/slo-<sli kind>.md`` for the SLI kinds the catalog knows."""
    expr = (
        f"{_burning(slo, pair.short_ms, pair.factor)}\nand\n"
        f"{_burning(slo, pair.long_ms, pair.factor)}\n"
    )
    if slo.min_events:
        expr += _guard(slo, pair)
    window = f"{format_duration(pair.long_ms)}-{format_duration(pair.short_ms)}"
    labels = {
        **slo.alert_labels,
        **slo.tier_labels.get(pair.severity, {}),
        **slo.pair_labels.get(pair.id, {}),
        slo.scheme.severity: pair.severity,
        "window": window,
        "sli_kind": slo.sli_kind,
    }
    budget_pct = f"{pair.budget_percent:g} %"
    annotations = {
        "summary": f"{slo.service} {slo.name}: error budget burning {_num(pair.factor)}× too fast",
        "description": (
            f"The {window} burn rate of SLO {slo.id} exceeds {_num(pair.factor)} "
            f"(objective {_num(slo.objective * 100)} % over {slo.period}); at this pace "
            f"{budget_pct} of the budget is gone within {format_duration(pair.long_ms)}."
        ),
        **_runbook(slo.sli_kind, runbook_base_url),
        **slo.annotations,
    }
    rule: dict[str, Any] = {"alert": slo.alert_name, "expr": expr}
    for_ms = slo.pair_for_ms.get(pair.id, 0)
    if for_ms:
        rule["for"] = format_duration(for_ms)
    return {**rule, "labels": labels, "annotations": annotations}


def _runbook(sli_kind: str, base_url: str) -> dict[str, str]:
    notice = NOTICES.get(f"slo:{sli_kind}")
    return {} if notice is None else {"runbook_url": runbook_url(base_url, notice.runbook)}


def slo_groups(
    slo: RuleSlo, prefix: str = "llmslo", runbook_base_url: str = RUNBOOK_BASE_URL
) -> list[dict[str, Any]]:
    """The three rule groups of one SLO: SLI recordings, metadata, alerts."""
    groups = [
        {"name": f"{prefix}-slo-sli-recordings-{slo.id}", "rules": _sli_recordings(slo)},
        {"name": f"{prefix}-slo-meta-recordings-{slo.id}", "rules": _meta_recordings(slo)},
    ]
    if slo.pairs:
        alerts = [pair_alert(slo, pair, runbook_base_url) for pair in slo.pairs]
        groups.append({"name": f"{prefix}-slo-alerts-{slo.id}", "rules": alerts})
    return groups


def generate_rules(
    model: RuleModel, signatures: bool = True, runbook_base_url: str = RUNBOOK_BASE_URL
) -> dict[str, Any]:
    """The whole rule file of ``model`` as a dict (``{"groups": [...]}``), ready to write.

    ``signatures`` adds the failure-signature groups (:mod:`alerts.signatures`); every alert's
    ``runbook_url`` starts with ``runbook_base_url``.
    """
    groups: list[dict[str, Any]] = []
    for slo in model.slos:
        groups += slo_groups(slo, runbook_base_url=runbook_base_url)
    if signatures:
        groups += signature_groups(runbook_base_url)
    return {"groups": groups}
